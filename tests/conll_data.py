"""CoNLL-2003 files for tests: documents of sentences whose tags a tagger can learn.

A word's tag follows from the word and its left neighbour: word1..word9 are
persons (word1 word2 in a row is one two-word person), word10..word19
locations, word20..word29 organisations, "cat" and "dog" misc; other words
are O. Sentences use the fixture vocab's words (finetune_data.WORDS).
"""

import numpy as np

import finetune_data

ENTITY = {**{f"word{i}": "PER" for i in range(1, 10)},
          **{f"word{i}": "LOC" for i in range(10, 20)},
          **{f"word{i}": "ORG" for i in range(20, 30)}, "cat": "MISC", "dog": "MISC"}


def tags(words: list[str]) -> list[str]:
  out = []
  for i, w in enumerate(words):
    kind = ENTITY.get(w)
    if kind is None:
      out.append("O")
    elif i and words[i - 1] == "word1" and w == "word2":
      out.append("I-PER")
    else:
      out.append(f"B-{kind}")
  return out


def documents(num_docs: int, seed: int, max_sentences: int = 4) -> list[list[list[str]]]:
  """Documents of 1 to max_sentences sentences of 2 to 9 words."""
  rng = np.random.default_rng(seed)
  docs = []
  for _ in range(num_docs):
    doc = []
    for _ in range(rng.integers(1, max_sentences + 1)):
      words = list(rng.choice(finetune_data.WORDS, rng.integers(2, 10)))
      if rng.random() < 0.3:
        words[:2] = ["word1", "word2"]
      doc.append([str(w) for w in words])
    docs.append(doc)
  return docs


def conll_text(docs: list[list[list[str]]]) -> str:
  """The shared task's layout: -DOCSTART- before each document, a blank line after each sentence."""
  lines = []
  for doc in docs:
    lines += ["-DOCSTART- -X- -X- O", ""]
    for words in doc:
      lines += [f"{w} NN B-NP {t}" for w, t in zip(words, tags(words))] + [""]
  return "\n".join(lines) + "\n"


def write(directory, num_train_docs: int = 60, num_dev_docs: int = 20, seed: int = 0) -> str:
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "train.txt").write_text(conll_text(documents(num_train_docs, seed)))
  (directory / "valid.txt").write_text(conll_text(documents(num_dev_docs, seed + 1)))
  return str(directory)
