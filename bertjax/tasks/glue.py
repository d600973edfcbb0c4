"""GLUE: the nine tasks from the TSVs the original run_classifier.py reads, or TFDS `glue/*`.

TSV columns are those of the GLUE distribution (download_glue_data.py) as
the original release's and Hugging Face's processors read them; MNLI is
scored on dev_matched.tsv and dev_mismatched.tsv. Test sets (load_test) are
the distribution's test TSVs, each with a header and its index in column 0;
their predictions go to the GLUE benchmark's submission files (CoLA.tsv,
MNLI-m.tsv, ..., AX.tsv from the MNLI model on diagnostic.tsv), one
"index<TAB>prediction" row per test row under that header. From TFDS, integer labels
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
class TestFile:
  """One GLUE test TSV (header, index in column 0) and its submission file."""
  tsv: str
  submission: str
  text_a: int
  text_b: Optional[int]


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
  test: dict[str, TestFile]  # Test split name -> its TSV and submission file.

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


def _test(submission: str, text_a: int, text_b: Optional[int]) -> dict[str, TestFile]:
  return {"test": TestFile("test.tsv", submission, text_a, text_b)}


# The GLUE diagnostic set (AX): index, sentence1, sentence2; predicted by the MNLI model.
AX = TestFile("diagnostic.tsv", "AX.tsv", 1, 2)
TASKS = {t.name: t for t in (
    GlueTask("cola", _BINARY, ("matthews", "accuracy"), "matthews", False, 3, None, 1,
             "glue/cola", ("sentence", None), _DEV, _test("CoLA.tsv", 1, None)),
    GlueTask("sst2", _BINARY, ("accuracy",), "accuracy", True, 0, None, 1,
             "glue/sst2", ("sentence", None), _DEV, _test("SST-2.tsv", 1, None)),
    GlueTask("mrpc", _BINARY, ("f1", "accuracy"), "f1", True, 3, 4, 0,
             "glue/mrpc", ("sentence1", "sentence2"), _DEV, _test("MRPC.tsv", 3, 4)),
    GlueTask("stsb", (), ("spearman", "pearson"), "spearman", True, 7, 8, -1,
             "glue/stsb", ("sentence1", "sentence2"), _DEV, _test("STS-B.tsv", 7, 8)),
    GlueTask("qqp", _BINARY, ("f1", "accuracy"), "f1", True, 3, 4, 5,
             "glue/qqp", ("question1", "question2"), _DEV, _test("QQP.tsv", 1, 2)),
    GlueTask("mnli", ("contradiction", "entailment", "neutral"), ("accuracy",), "accuracy",
             True, 8, 9, -1, "glue/mnli", ("premise", "hypothesis"),
             {"dev_matched": ("dev_matched.tsv", "validation_matched"),
              "dev_mismatched": ("dev_mismatched.tsv", "validation_mismatched")},
             {"test_matched": TestFile("test_matched.tsv", "MNLI-m.tsv", 8, 9),
              "test_mismatched": TestFile("test_mismatched.tsv", "MNLI-mm.tsv", 8, 9),
              "ax": AX}),
    GlueTask("qnli", _NLI, ("accuracy",), "accuracy", True, 1, 2, -1,
             "glue/qnli", ("question", "sentence"), _DEV, _test("QNLI.tsv", 1, 2)),
    GlueTask("rte", _NLI, ("accuracy",), "accuracy", True, 1, 2, -1,
             "glue/rte", ("sentence1", "sentence2"), _DEV, _test("RTE.tsv", 1, 2)),
    GlueTask("wnli", _BINARY, ("accuracy",), "accuracy", True, 1, 2, -1,
             "glue/wnli", ("sentence1", "sentence2"), _DEV, _test("WNLI.tsv", 1, 2)),
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


def _task_file(task: GlueTask, data_dir: str, name: str) -> str:
  """data_dir/name, else data_dir/<task's GLUE directory>/name (data_dir is the GLUE root)."""
  path = os.path.join(data_dir, name)
  in_root = os.path.join(data_dir, GLUE_DIRS[task.name], name)
  if not fileio.exists(path) and fileio.exists(in_root):
    return in_root
  if not fileio.exists(path):
    raise FileNotFoundError(f"--config.data_dir={data_dir}: no {name} for task "
                            f"{task.name}, nor {GLUE_DIRS[task.name]}/{name} (the GLUE "
                            "distribution's layout: a task's directory or the root)")
  return path


def read_test_tsv(test: TestFile, path: str) -> tuple[list[str], Rows]:
  """(each row's index, its texts) of a GLUE test TSV; a row too short for its
  texts is refused (a submission needs every row)."""
  reader = csv.reader(io.StringIO(fileio.read_text(path)), delimiter="\t", quotechar=None)
  index, rows = [], Rows([], [] if test.text_b is not None else None, [], [])
  needed = max(test.text_a, test.text_b or 0) + 1
  for line_no, line in enumerate(reader, start=1):
    if line_no == 1:
      continue  # Every GLUE test file starts with its column names.
    if len(line) < needed:
      raise ValueError(f"{path}:{line_no}: {len(line)} columns; {test.tsv} rows hold the "
                       f"index and their texts in {needed} columns or more")
    index.append(line[0])
    rows.text_a.append(line[test.text_a])
    if rows.text_b is not None:
      rows.text_b.append(line[test.text_b])
    rows.where.append(f"{path}:{line_no}")
  return index, rows


def _ax_path(data_dir: str) -> Optional[str]:
  """The diagnostic set: diagnostic.tsv or AX.tsv in data_dir, or diagnostic/diagnostic.tsv
  in data_dir or beside it (the GLUE distribution's layout)."""
  for path in (os.path.join(data_dir, "diagnostic.tsv"), os.path.join(data_dir, "AX.tsv"),
               os.path.join(data_dir, "diagnostic", "diagnostic.tsv"),
               os.path.join(os.path.dirname(os.path.normpath(data_dir)), "diagnostic",
                            "diagnostic.tsv")):
    if fileio.exists(path):
      return path
  return None


def submission_lines(task: GlueTask, index: list[str], outputs: np.ndarray) -> list[str]:
  """The GLUE benchmark's submission rows: header, then index and the predicted
  label string (a score with three decimals for STS-B)."""
  outputs = np.asarray(outputs)
  if task.labels:
    predicted = [task.labels[i] for i in np.argmax(outputs, axis=-1)]
  else:
    predicted = [f"{x:.3f}" for x in outputs.reshape(-1)]
  return ["index\tprediction", *(f"{i}\t{p}" for i, p in zip(index, predicted))]


def load_test(task: GlueTask, tokenizer, max_seq_length: int, data_dir: str,
              predict_file: str = "") -> list[Split]:
  """The task's test sets from data_dir's GLUE test TSVs (MNLI: matched, mismatched
  and, where found, the diagnostic set), or predict_file alone in the layout of
  the task's first test TSV. Each Split's score(outputs, output_dir=) writes its
  submission file and returns its row count."""
  if predict_file:
    name, test = next(iter(task.test.items()))
    if not fileio.exists(predict_file):
      raise FileNotFoundError(f"--config.predict_file={predict_file}: no such file")
    index, rows = read_test_tsv(test, predict_file)
    return [_test_split(task, name, test, index, rows, tokenizer, max_seq_length)]
  if not data_dir:
    raise ValueError(f"--config.data_dir: GLUE test predictions read the test TSVs of "
                     f"GLUE's download; set it to {GLUE_DIRS[task.name]}/ or the GLUE root")
  splits = []
  for name, test in task.test.items():
    if test is AX:
      path = _ax_path(data_dir)
      if path is None:
        logging.warning("No diagnostic.tsv in or beside %s: AX.tsv (the diagnostic set, "
                        "predicted with the MNLI model) is not written.", data_dir)
        continue
    else:
      path = _task_file(task, data_dir, test.tsv)
    index, rows = read_test_tsv(test, path)
    splits.append(_test_split(task, name, test, index, rows, tokenizer, max_seq_length))
  return splits


def _test_split(task, name, test, index, rows, tokenizer, max_seq_length) -> Split:
  arrays = features.encode_pairs(tokenizer, rows.text_a, rows.text_b, max_seq_length)
  return Split(name, arrays, functools.partial(_write_submission, task, test, index),
               writes_outputs=True)


def _write_submission(task: GlueTask, test: TestFile, index: list[str], outputs,
                      output_dir: Optional[str] = None) -> dict[str, float]:
  if output_dir is not None:
    fileio.write_text(os.path.join(output_dir, test.submission),
                      "\n".join(submission_lines(task, index, outputs)) + "\n")
  return {"rows": len(index)}


def load(task: GlueTask, split: str, tokenizer, max_seq_length: int, data_dir: str = "",
         tfds_data_dir: str = "") -> Split:
  """`split` is "train" or one of task.dev. With data_dir, reads its TSVs; else TFDS."""
  if split != "train" and split not in task.dev:
    raise ValueError(f"task {task.name} has no split {split!r}; splits: "
                     f"{['train', *task.dev]}")
  tsv, tfds_split = ("train.tsv", "train") if split == "train" else task.dev[split]
  if data_dir:
    rows = read_tsv(task, _task_file(task, data_dir, tsv))
  else:
    rows = read_tfds(task, tfds_split, tfds_data_dir)
  return make_split(task, split, rows, tokenizer, max_seq_length)
