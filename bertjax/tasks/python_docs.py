"""The demo corpus's labelled tasks (bertjax.create.demo_tasks writes their files):

  doc_area     single-sentence classification, accuracy: which part of Python a
               sentence of the documentation documents (LABELS).
  word_area    token tagging, span F1: each word that several parts of Python
               use, tagged with the part that its sentence documents (B-<area>),
               the other words O. As for CoNLL-2003, each word's first
               sub-token carries its tag.

data_dir is the demo data directory; the files are under data_dir/tasks/TASK/,
train and dev split by document (dev: the demo's held-out documents).
"""

import functools
import os

from bertjax.records import fileio
from bertjax.tasks import conll
from bertjax.tasks import features
from bertjax.tasks import metrics
from bertjax.tasks.split import Split, label_ids

# bertjax.create.demo_tasks.AREAS's names and WORD_TAGS, in output order.
AREA_LABELS = ("reference", "email", "asyncio", "concurrency", "internet", "markup",
               "testing", "gui", "files")
WORD_LABELS = ("O", *(f"B-{a}" for a in AREA_LABELS))
_FILES = {"doc_area": {"train": "train.tsv", "dev": "dev.tsv"},
          "word_area": {"train": "train.txt", "dev": "dev.txt"}}


def _path(task: str, split: str, config) -> str:
  if split not in _FILES[task]:
    raise ValueError(f"task {task} has no split {split!r}; splits: {sorted(_FILES[task])}")
  if not config.data_dir:
    raise ValueError(f"--config.data_dir: give the demo data directory (with tasks/{task}/)")
  path = os.path.join(config.data_dir, "tasks", task, _FILES[task][split])
  if not fileio.exists(path):
    raise FileNotFoundError(
        f"--config.data_dir={config.data_dir}: no tasks/{task}/{_FILES[task][split]} "
        "(python -m bertjax.studies.suite builds it from the demo's text)")
  return path


def load_doc_area(split: str, tokenizer, config) -> Split:
  path = _path("doc_area", split, config)
  labels, texts, where = [], [], []
  for line_no, line in enumerate(fileio.read_text(path).splitlines(), start=1):
    label, sep, text = line.partition("\t")
    if not sep or not text.strip():
      raise ValueError(f"{path}:{line_no}: expected 'area<TAB>sentence', got {line!r}")
    labels.append(label)
    texts.append(text)
    where.append(f"{path}:{line_no}")
  ids = label_ids(labels, AREA_LABELS, where, "doc_area")
  arrays = features.encode_pairs(tokenizer, texts, None, config.max_seq_length)
  arrays["labels"] = ids
  return Split(split, arrays, functools.partial(metrics.classification, ("accuracy",), ids))


def load_word_area(split: str, tokenizer, config) -> Split:
  path = _path("word_area", split, config)
  words, tags, where, _ = conll.read_sentences(path)
  tag_ids = [label_ids(t, WORD_LABELS, w, "word_area") for t, w in zip(tags, where)]
  arrays, first_positions = conll.encode(tokenizer, words, tag_ids, config.max_seq_length)
  return Split(split, arrays,
               functools.partial(conll.score, tags, first_positions, labels=WORD_LABELS),
               per_position_outputs=True)
