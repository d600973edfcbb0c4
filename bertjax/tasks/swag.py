"""SWAG multiple choice: a context and four endings; one score per choice from its pooled output.

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
from bertjax.tasks.split import Split, label_ids, test_file

NUM_CHOICES = 4
FILES = {"train": "train.csv", "dev": "val.csv"}
COLUMNS = ("sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label")


def read_rows(path: str, columns: tuple[str, ...] = COLUMNS) -> tuple[list[dict], list[str]]:
  """The CSV's rows and each one's "path:line"; `columns` must be there."""
  reader = csv.DictReader(io.StringIO(fileio.read_text(path)))
  missing = [c for c in columns if c not in (reader.fieldnames or [])]
  if missing:
    raise ValueError(f"{path}: missing columns {missing}; SWAG files have {list(columns)}")
  rows = list(reader)
  return rows, [f"{path}:{i + 2}" for i in range(len(rows))]


def _encode(rows: list[dict], tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
  contexts = [r["sent1"] for r in rows for _ in range(NUM_CHOICES)]
  endings = [f"{r['sent2']} {r[f'ending{i}']}" for r in rows for i in range(NUM_CHOICES)]
  flat = features.encode_pairs(tokenizer, contexts, endings, max_seq_length)
  return {k: v.reshape(len(rows), NUM_CHOICES, -1) for k, v in flat.items()}


PREDICTIONS = "swag_predictions.csv"


def load_test(tokenizer, config) -> list[Split]:
  """config.predict_file, else data_dir/test.csv (SWAG's columns; no label needed).
  Its Split's score(outputs, output_dir=) writes PREDICTIONS: "id,label" rows,
  id being the file's first, unnamed column (the SWAG release's row id) or
  else the row's number from 0, label the best choice (0 to 3)."""
  path = test_file(config, "test.csv", "SWAG csv")
  rows, _ = read_rows(path, COLUMNS[:-1])
  ids = [r[""] if r.get("") else str(i) for i, r in enumerate(rows)]

  def write(outputs, output_dir=None):
    best = np.argmax(np.asarray(outputs), axis=-1)
    if output_dir is not None:
      fileio.write_text(os.path.join(output_dir, PREDICTIONS), "id,label\n" + "".join(
          f"{i},{int(b)}\n" for i, b in zip(ids, best)))
    return {"rows": len(rows)}
  return [Split("test", _encode(rows, tokenizer, config.max_seq_length), write,
                writes_outputs=True)]


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
  arrays = _encode(rows, tokenizer, config.max_seq_length)
  arrays["labels"] = labels
  return Split(split, arrays, functools.partial(metrics.classification, ("accuracy",), labels))
