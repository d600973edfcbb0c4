"""GLUE: the nine tasks from the TSVs the original run_classifier.py reads, or TFDS `glue/*`.

TSV columns are those of the GLUE distribution (download_glue_data.py) as
the original release's and Hugging Face's processors read them; MNLI is
scored on dev_matched.tsv and dev_mismatched.tsv. From TFDS, integer labels
become the TSV label strings (the index for the "0"/"1" tasks, the class
name for the NLI tasks), so both sources give the same label ids.
"""

import csv
import dataclasses
import functools
import io
import os
from typing import Optional

import numpy as np
from absl import logging

from bertjax.records import fileio
from bertjax.tasks import features
from bertjax.tasks import metrics
from bertjax.tasks.split import Split, label_ids


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """One GLUE task: its label set, metrics and where its fields are."""
  name: str
  labels: tuple[str, ...]  # () for regression (STS-B).
  metrics: tuple[str, ...]
  primary: str  # The metric a sweep picks the best run by (the paper's).
  header: bool  # The TSVs' first line names the columns.
  text_a: int  # TSV column of the first text.
  text_b: Optional[int]  # TSV column of the second text (None: single sentence).
  label: int  # TSV column of the label.
  tfds_name: str
  tfds_fields: tuple[str, Optional[str]]
  dev: dict[str, tuple[str, str]]  # Dev split name -> (TSV file, TFDS split).

  @property
  def kind(self) -> str:
    return "classification" if self.labels else "regression"

  @property
  def text_columns(self) -> int:
    """Columns a row needs to hold its texts."""
    return max(self.text_a, self.text_b or 0) + 1

  @property
  def min_columns(self) -> int:
    """Columns a row needs to hold its texts and its label (a negative label
    column counts from the end, after the texts)."""
    if self.label >= 0:
      return max(self.text_columns, self.label + 1)
    return self.text_columns - self.label


# Each task's directory in the GLUE distribution (download_glue_data.py's names).
GLUE_DIRS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
             "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
_DEV = {"dev": ("dev.tsv", "validation")}
_BINARY = ("0", "1")
_NLI = ("entailment", "not_entailment")
TASKS = {t.name: t for t in (
    GlueTask("cola", _BINARY, ("matthews", "accuracy"), "matthews", False, 3, None, 1,
             "glue/cola", ("sentence", None), _DEV),
    GlueTask("sst2", _BINARY, ("accuracy",), "accuracy", True, 0, None, 1,
             "glue/sst2", ("sentence", None), _DEV),
    GlueTask("mrpc", _BINARY, ("f1", "accuracy"), "f1", True, 3, 4, 0,
             "glue/mrpc", ("sentence1", "sentence2"), _DEV),
    GlueTask("stsb", (), ("spearman", "pearson"), "spearman", True, 7, 8, -1,
             "glue/stsb", ("sentence1", "sentence2"), _DEV),
    GlueTask("qqp", _BINARY, ("f1", "accuracy"), "f1", True, 3, 4, 5,
             "glue/qqp", ("question1", "question2"), _DEV),
    GlueTask("mnli", ("contradiction", "entailment", "neutral"), ("accuracy",), "accuracy",
             True, 8, 9, -1, "glue/mnli", ("premise", "hypothesis"),
             {"dev_matched": ("dev_matched.tsv", "validation_matched"),
              "dev_mismatched": ("dev_mismatched.tsv", "validation_mismatched")}),
    GlueTask("qnli", _NLI, ("accuracy",), "accuracy", True, 1, 2, -1,
             "glue/qnli", ("question", "sentence"), _DEV),
    GlueTask("rte", _NLI, ("accuracy",), "accuracy", True, 1, 2, -1,
             "glue/rte", ("sentence1", "sentence2"), _DEV),
    GlueTask("wnli", _BINARY, ("accuracy",), "accuracy", True, 1, 2, -1,
             "glue/wnli", ("sentence1", "sentence2"), _DEV),
)}


@dataclasses.dataclass
class Rows:
  """Texts and labels of one split, with each row's file and line for errors."""
  text_a: list[str]
  text_b: Optional[list[str]]
  labels: list
  where: list[str]


def read_tsv(task: GlueTask, path: str) -> Rows:
  """The rows of a GLUE TSV. Rows too short to hold their texts are skipped and
  counted; a row that holds its texts but not its label is refused."""
  text = fileio.read_text(path)
  reader = csv.reader(io.StringIO(text), delimiter="\t", quotechar=None)
  rows = Rows([], [] if task.text_b is not None else None, [], [])
  skipped = []
  for line_no, line in enumerate(reader, start=1):
    if task.header and line_no == 1:
      continue
    if len(line) < task.text_columns:
      skipped.append(line_no)
      continue
    if len(line) < task.min_columns:
      raise ValueError(f"{path}:{line_no}: {len(line)} columns, but task {task.name}'s "
                       f"rows have their label after the texts ({task.min_columns} "
                       "columns or more); check the file's layout")
    rows.text_a.append(line[task.text_a])
    if rows.text_b is not None:
      rows.text_b.append(line[task.text_b])
    rows.labels.append(line[task.label])
    rows.where.append(f"{path}:{line_no}")
  if skipped:
    logging.warning("%s: skipped %d lines with fewer than %d columns (first: line %d).",
                    path, len(skipped), task.text_columns, skipped[0])
  return rows


def read_tfds(task: GlueTask, split: str, data_dir: Optional[str]) -> Rows:
  """The rows of a TFDS glue/* split; labels become the TSV label strings."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(task.tfds_name, data_dir=data_dir or None)
  names = getattr(builder.info.features["label"], "names", None)
  ds = tfds.load(task.tfds_name, split=split, data_dir=data_dir or None, shuffle_files=False)
  field_a, field_b = task.tfds_fields
  rows = Rows([], [] if field_b else None, [], [])
  for i, ex in enumerate(tfds.as_numpy(ds)):
    rows.text_a.append(ex[field_a].decode("utf-8"))
    if field_b:
      rows.text_b.append(ex[field_b].decode("utf-8"))
    label = ex["label"]
    if not task.labels:
      rows.labels.append(float(label))
    elif task.labels == _BINARY or int(label) < 0:
      rows.labels.append(str(int(label)))
    else:
      rows.labels.append(names[int(label)])
    rows.where.append(f"tfds {task.tfds_name}[{split}] example {i}")
  return rows


def _float_labels(rows: Rows) -> np.ndarray:
  out = np.empty(len(rows.labels), np.float32)
  for i, label in enumerate(rows.labels):
    try:
      out[i] = float(label)
    except ValueError:
      raise ValueError(f"{rows.where[i]}: label {label!r} is not a number "
                       "(STS-B scores are 0 to 5)") from None
  return out


def make_split(task: GlueTask, name: str, rows: Rows, tokenizer,
               max_seq_length: int) -> Split:
  arrays = features.encode_pairs(tokenizer, rows.text_a, rows.text_b, max_seq_length)
  if task.labels:
    arrays["labels"] = label_ids(rows.labels, task.labels, rows.where, task.name)
    score = functools.partial(metrics.classification, task.metrics, arrays["labels"])
  else:
    arrays["labels"] = _float_labels(rows)
    score = functools.partial(metrics.regression, task.metrics, arrays["labels"])
  return Split(name, arrays, score)


def load(task: GlueTask, split: str, tokenizer, max_seq_length: int, data_dir: str = "",
         tfds_data_dir: str = "") -> Split:
  """`split` is "train" or one of task.dev. With data_dir, reads its TSVs; else TFDS."""
  if split != "train" and split not in task.dev:
    raise ValueError(f"task {task.name} has no split {split!r}; splits: "
                     f"{['train', *task.dev]}")
  tsv, tfds_split = ("train.tsv", "train") if split == "train" else task.dev[split]
  if data_dir:
    path = os.path.join(data_dir, tsv)
    in_root = os.path.join(data_dir, GLUE_DIRS[task.name], tsv)
    if not fileio.exists(path) and fileio.exists(in_root):
      path = in_root  # data_dir is the GLUE root, with a directory per task.
    if not fileio.exists(path):
      raise FileNotFoundError(f"--config.data_dir={data_dir}: no {tsv} for task "
                              f"{task.name}, nor {GLUE_DIRS[task.name]}/{tsv} (the GLUE "
                              "distribution's layout: a task's directory or the root)")
    rows = read_tsv(task, path)
  else:
    rows = read_tfds(task, tfds_split, tfds_data_dir)
  return make_split(task, split, rows, tokenizer, max_seq_length)
