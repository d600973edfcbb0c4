"""CoNLL-2003 named entities: BIO text or TFDS `conll2003` -> per-token labels; span F1.

Files: train.txt and valid.txt (the dev split) in the shared-task layout, one
"word POS chunk NER" line per word, a blank line between sentences and
-DOCSTART- lines between documents. With data_dir empty, TFDS `conll2003`
(splits train and dev): each sentence's `ner` ids become the builder's tag
names, which map onto LABELS by name, so both sources give the same label ids.
As in the paper, each word's first sub-token carries its label (label_weights
1) and the other sub-tokens are ignored (no CRF). Words past max_seq_length are
predicted "O", so every word of the dev set counts in the score. With
config.document_context (BIO files only), each sentence is encoded with the
neighbouring sentences of its document filling max_seq_length (encode);
still one row per sentence, scored once.
"""

import functools
import os
from typing import Optional

import numpy as np

from bertjax.records import fileio
from bertjax.tasks import metrics
from bertjax.tasks.split import Split, label_ids, test_file

LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
FILES = {"train": "train.txt", "dev": "valid.txt"}
TFDS_NAME = "conll2003"  # Its splits carry this module's split names, train and dev.


def read_sentences(path: str, labelled: bool = True
                   ) -> tuple[list[list[str]], list[list[str]], list[list[str]], list[int]]:
  """(words, tags, "path:line" of each word, document number) per sentence; a
  -DOCSTART- line starts a new document (sentences before the first are document 0).
  Unlabelled, a line may hold the word alone (its tag is then "")."""
  sentences, words, tags, where = [], [], [], []
  document = 0
  for line_no, line in enumerate(fileio.read_text(path).splitlines() + [""], start=1):
    parts = line.split()
    if not parts or parts[0] == "-DOCSTART-":
      if words:
        sentences.append((words, tags, where, document))
        words, tags, where = [], [], []
      if parts and sentences:
        document += 1
      continue
    if len(parts) < 2 and labelled:
      raise ValueError(f"{path}:{line_no}: expected 'word ... tag', got {line!r}")
    words.append(parts[0])
    tags.append(parts[-1] if len(parts) > 1 else "")
    where.append(f"{path}:{line_no}")
  return tuple([s[i] for s in sentences] for i in range(4))


def read_tfds(split: str, data_dir: str) -> tuple[list[list[str]], list[list[str]],
                                                  list[list[str]]]:
  """(words, tag names, "tfds conll2003[split] example i word j" of each word) per sentence."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(TFDS_NAME, data_dir=data_dir or None)
  names = builder.info.features["ner"].feature.names
  ds = tfds.load(TFDS_NAME, split=split, data_dir=data_dir or None, shuffle_files=False)
  words, tags, where = [], [], []
  for i, ex in enumerate(tfds.as_numpy(ds)):
    words.append([w.decode("utf-8") for w in ex["tokens"]])
    tags.append([names[int(t)] for t in ex["ner"]])
    where.append([f"tfds {TFDS_NAME}[{split}] example {i} word {j}"
                  for j in range(len(ex["tokens"]))])
  return words, tags, where


def encode(tokenizer, words: list[list[str]], tag_ids: list[np.ndarray], max_seq_length: int,
           documents: Optional[list[int]] = None):
  """Arrays for the model plus each word's first sub-token position (-1: truncated).

  One row per sentence: [CLS] sentence [SEP], its words' first sub-tokens
  labelled, words past max_seq_length - 2 sub-tokens left out (position -1).
  With `documents` (each sentence's document number), the room the sentence
  leaves is filled with the sub-tokens of its document's neighbouring
  sentences, as many before as after it where both sides have them (the rest
  from the side that does), cut at sub-token boundaries: [CLS] left context,
  sentence, right context [SEP], segment 0 throughout. Context tokens carry
  no labels (label_weights 0), so each sentence is trained and scored once.
  """
  flat = [w for sentence in words for w in sentence]
  encoded = iter(tokenizer.encode_batch(flat))
  unk = tokenizer.special_ids["unk"]
  pieces = [[next(encoded) or [unk] for _ in sentence] for sentence in words]
  tokens = [[t for word in sentence for t in word] for sentence in pieces]
  n = len(words)
  cls, sep = tokenizer.special_ids["cls"], tokenizer.special_ids["sep"]
  arrays = {k: np.zeros((n, max_seq_length), np.int32)
            for k in ("input_ids", "input_mask", "segment_ids", "labels")}
  arrays["label_weights"] = np.zeros((n, max_seq_length), np.float32)
  arrays["input_ids"][:] = tokenizer.special_ids["pad"]
  budget = max_seq_length - 2
  first_positions = []
  for i, sentence in enumerate(pieces):
    own = tokens[i][:budget]
    left, right = _context(tokens, documents, i, budget - len(own))
    ids = [cls, *left, *own, *right, sep]
    positions, start = [], 1 + len(left)
    for j, word in enumerate(sentence):
      if start - 1 - len(left) < budget:
        positions.append(start)
        arrays["labels"][i, start] = tag_ids[i][j]
        arrays["label_weights"][i, start] = 1.0
      else:
        positions.append(-1)
      start += len(word)
    arrays["input_ids"][i, :len(ids)] = ids
    arrays["input_mask"][i, :len(ids)] = 1
    first_positions.append(np.array(positions, np.int64))
  return arrays, first_positions


def _context(tokens: list[list[int]], documents: Optional[list[int]], i: int,
             room: int) -> tuple[list[int], list[int]]:
  """Sub-tokens of sentence i's document before and after it, `room` in all."""
  if documents is None or room <= 0:
    return [], []
  doc = documents[i]
  before, after = [], []
  k = i - 1
  while k >= 0 and documents[k] == doc and len(before) < room:
    before = tokens[k] + before
    k -= 1
  k = i + 1
  while k < len(tokens) and documents[k] == doc and len(after) < room:
    after = after + tokens[k]
    k += 1
  num_before = min(len(before), max(room - len(after), room // 2))
  num_after = min(len(after), room - num_before)
  return before[len(before) - num_before:], after[:num_after]


def predicted_tags(first_positions, logits_NxLxC, labels=None) -> list[list[str]]:
  """Each word's tag: its first sub-token's best label among `labels` (default
  LABELS; "O" past max_seq_length)."""
  labels = LABELS if labels is None else labels
  predicted_ids = np.argmax(logits_NxLxC, axis=-1)
  return [[labels[predicted_ids[i, p]] if p >= 0 else "O" for p in positions]
          for i, positions in enumerate(first_positions)]


def score(gold: list[list[str]], first_positions, logits_NxLxC,
          labels=None) -> dict[str, float]:
  return metrics.span_f1(gold, predicted_tags(first_positions, logits_NxLxC, labels))


PREDICTIONS = "conll2003_predictions.txt"


def load_test(tokenizer, config) -> list[Split]:
  """config.predict_file, else data_dir/test.txt: words in the first column (tags,
  if any, are not read). Its Split's score(outputs, output_dir=) writes
  PREDICTIONS: "word tag" per line, a blank line after each sentence."""
  path = test_file(config, "test.txt", "CoNLL-format file")
  words, _, _, documents = read_sentences(path, labelled=False)
  no_tags = [np.zeros(len(w), np.int32) for w in words]
  arrays, first_positions = encode(
      tokenizer, words, no_tags, config.max_seq_length,
      documents if config.get("document_context", False) else None)

  def write(outputs, output_dir=None):
    tags = predicted_tags(first_positions, outputs)
    if output_dir is not None:
      lines = [line for ws, ts in zip(words, tags)
               for line in [*(f"{w} {t}" for w, t in zip(ws, ts)), ""]]
      fileio.write_text(os.path.join(output_dir, PREDICTIONS), "\n".join(lines))
    return {"sentences": len(words)}
  return [Split("test", arrays, write, writes_outputs=True, per_position_outputs=True)]


def load(split: str, tokenizer, config) -> Split:
  """`split` is "train" or "dev". With data_dir, reads its BIO files; else TFDS conll2003."""
  if split not in FILES:
    raise ValueError(f"task conll2003 has no split {split!r}; splits: {sorted(FILES)}")
  if config.data_dir:
    path = os.path.join(config.data_dir, FILES[split])
    if not fileio.exists(path):
      raise FileNotFoundError(f"--config.data_dir={config.data_dir}: no {FILES[split]} "
                              "(CoNLL-2003 train.txt and valid.txt)")
    words, tags, where, documents = read_sentences(path)
  elif config.get("document_context", False):
    raise ValueError("--config.document_context needs the CoNLL-2003 files (their "
                     "-DOCSTART- lines mark the documents): give --config.data_dir")
  else:
    words, tags, where = read_tfds(split, config.tfds_data_dir)
  tag_ids = [label_ids(t, LABELS, w, "conll2003") for t, w in zip(tags, where)]
  arrays, first_positions = encode(
      tokenizer, words, tag_ids, config.max_seq_length,
      documents if config.get("document_context", False) else None)
  return Split(split, arrays, functools.partial(score, tags, first_positions),
               per_position_outputs=True)
