"""SWAG multiple choice: a context and four endings; one score per choice from its [CLS].

Files: train.csv and val.csv (the dev split) as the SWAG release has them,
with columns sent1 (sentence A), sent2 (the start of sentence B),
ending0..ending3 and label. Choice i is [CLS] sent1 [SEP] sent2 ending_i [SEP].
"""

import csv
import functools
import io
import os

import numpy as np

from bertjax.records import fileio
from bertjax.tasks import features
from bertjax.tasks import metrics
from bertjax.tasks.split import Split, label_ids

NUM_CHOICES = 4
FILES = {"train": "train.csv", "dev": "val.csv"}
COLUMNS = ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label")


def read_rows(path: str) -> tuple[list[dict], list[str]]:
  """The CSV's rows and each one's "path:line"."""
  reader = csv.DictReader(io.StringIO(fileio.read_text(path)))
  missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
  if missing:
    raise ValueError(f"{path}: missing columns {missing}; SWAG files have {list(COLUMNS)}")
  rows = list(reader)
  return rows, [f"{path}:{i + 2}" for i in range(len(rows))]


def load(split: str, tokenizer, config) -> Split:
  if split not in FILES:
    raise ValueError(f"task swag has no split {split!r}; splits: {sorted(FILES)}")
  path = os.path.join(config.data_dir, FILES[split])
  if not config.data_dir:
    raise FileNotFoundError("--config.data_dir: SWAG is read from its train.csv and val.csv "
                            "(TFDS has no SWAG dataset); set it to their directory")
  if not fileio.exists(path):
    raise FileNotFoundError(f"--config.data_dir={config.data_dir}: no {FILES[split]} "
                            "(SWAG train.csv and val.csv)")
  rows, where = read_rows(path)
  labels = label_ids([r["label"] for r in rows], tuple(str(i) for i in range(NUM_CHOICES)),
                     where, "swag")
  contexts = [r["sent1"] for r in rows for _ in range(NUM_CHOICES)]
  endings = [f"{r['sent2']} {r[f'ending{i}']}" for r in rows for i in range(NUM_CHOICES)]
  flat = features.encode_pairs(tokenizer, contexts, endings, config.max_seq_length)
  arrays = {k: v.reshape(len(rows), NUM_CHOICES, -1) for k, v in flat.items()}
  arrays["labels"] = labels
  return Split(split, arrays, functools.partial(metrics.classification, ("accuracy",), labels))
