"""A sentence-pair task from any corpus of documents: does sentence B follow
sentence A in its document, or come from another document?

The demo's downstream task, built from the demo corpus's text files
(text/train.txt for training, the held-out text/eval.txt for dev: one
sentence per line, a blank line between documents). Each example pairs a
sentence with the sentence that follows it in its document (label "1") or
with a sentence of a different document (label "0"), half and half, drawn
with a fixed seed; accuracy is the metric and 0.5 is chance. It is
next-sentence prediction's question on single sentences: both segments
together hold the same kind of words either way, so a bag of words is at
chance, and what tells the pairs apart is whether the two sentences belong
together.
"""

import functools
import os

import numpy as np

from bertjax.records import fileio
from bertjax.tasks import features
from bertjax.tasks import metrics
from bertjax.tasks.split import Split

FILES = {"train": os.path.join("text", "train.txt"), "dev": os.path.join("text", "eval.txt")}
NUM_PAIRS = {"train": 1000, "dev": 1000}  # Unless the config sets num_train_pairs, num_dev_pairs.
SEEDS = {"train": 0, "dev": 1}
LABELS = ("0", "1")


def read_documents(path: str) -> list[list[str]]:
  """Documents of two or more sentences: one sentence per line, blank lines between."""
  docs, doc = [], []
  for line in fileio.read_text(path).splitlines() + [""]:
    if line.strip():
      doc.append(line.strip())
    elif doc:
      docs.append(doc)
      doc = []
  docs = [d for d in docs if len(d) >= 2]
  if len(docs) < 2:
    raise ValueError(f"{path}: needs at least two documents of two or more sentences")
  return docs


def make_pairs(docs: list[list[str]], num_pairs: int, seed: int
               ) -> tuple[list[str], list[str], np.ndarray]:
  """(first sentences, second sentences, labels 1 = same document), balanced:
  the second sentence of a pair labelled 1 is the one after the first."""
  rng = np.random.default_rng(seed)
  texts_a, texts_b, labels = [], [], np.zeros(num_pairs, np.int32)
  for i in range(num_pairs):
    d = int(rng.integers(len(docs)))
    a = int(rng.integers(len(docs[d]) - 1))
    texts_a.append(docs[d][a])
    if i % 2 == 0:
      texts_b.append(docs[d][a + 1])
      labels[i] = 1
    else:
      other = (d + 1 + int(rng.integers(len(docs) - 1))) % len(docs)
      texts_b.append(docs[other][int(rng.integers(len(docs[other])))])
  return texts_a, texts_b, labels


def load(split: str, tokenizer, config) -> Split:
  if split not in FILES:
    raise ValueError(f"task same_document has no split {split!r}; splits: {sorted(FILES)}")
  if not config.data_dir:
    raise ValueError("--config.data_dir: give the demo data directory (with text/train.txt "
                     "and text/eval.txt)")
  docs = read_documents(os.path.join(config.data_dir, FILES[split]))
  num_pairs = config.get(f"num_{split}_pairs", NUM_PAIRS[split])
  texts_a, texts_b, labels = make_pairs(docs, num_pairs, seed=SEEDS[split])
  arrays = features.encode_pairs(tokenizer, texts_a, texts_b, config.max_seq_length)
  arrays["labels"] = labels
  return Split(split, arrays, functools.partial(metrics.classification, ("accuracy",), labels))
