"""The demo corpus's labelled tasks (bertjax.create.demo_tasks writes their files):

  related_words  word pairs, accuracy: do two words belong to the same part of
                 Python (AREA_LABELS)? The dev pairs hold only words that no
                 training pair holds, so a bag of words is at chance.
  doc_area       single-sentence classification, accuracy: which part of Python a
                 sentence of the documentation documents (AREA_LABELS).
  word_area      token tagging, span F1: each word that several parts of Python
                 use, tagged with the part that its sentence documents (B-<area>),
                 the other words O. As for CoNLL-2003, each word's first
                 sub-token carries its tag.

data_dir is the demo data directory; the files are under data_dir/tasks/TASK/.
doc_area and word_area split train and dev by source file (dev: the demo's
held-out sources); related_words by word.
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
          "word_area": {"train": "train.txt", "dev": "dev.txt"},
          "related_words": {"train": "train.tsv", "dev": "dev.tsv"}}


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


def _load_labelled_rows(task: str, labels: tuple[str, ...], fields: tuple[str, ...],
                        split: str, tokenizer, config) -> Split:
  """A split of "label<TAB>text" lines (`fields`: one name, the text is the rest
  of the line) or "label<TAB>text<TAB>text" lines (two names: a pair):
  classification, accuracy."""
  path = _path(task, split, config)
  expected = "<TAB>".join(("label", *fields))
  names, texts, where = [], [[] for _ in fields], []
  for line_no, line in enumerate(fileio.read_text(path).splitlines(), start=1):
    label, sep, rest = line.partition("\t")
    values = rest.split("\t") if len(fields) > 1 else [rest]
    if not sep or len(values) != len(fields) or not all(v.strip() for v in values):
      raise ValueError(f"{path}:{line_no}: expected '{expected}', got {line!r}")
    names.append(label)
    for column, value in zip(texts, values):
      column.append(value)
    where.append(f"{path}:{line_no}")
  ids = label_ids(names, labels, where, task)
  arrays = features.encode_pairs(tokenizer, texts[0], texts[1] if len(fields) > 1 else None,
                                 config.max_seq_length)
  arrays["labels"] = ids
  return Split(split, arrays, functools.partial(metrics.classification, ("accuracy",), ids))


def load_doc_area(split: str, tokenizer, config) -> Split:
  return _load_labelled_rows("doc_area", AREA_LABELS, ("sentence",), split, tokenizer, config)


RELATED_LABELS = ("different", "same")  # bertjax.create.demo_tasks.RELATED_LABELS


def load_related_words(split: str, tokenizer, config) -> Split:
  """A split of related_words: "label<TAB>word<TAB>word" lines, a pair each."""
  return _load_labelled_rows("related_words", RELATED_LABELS, ("word", "word"), split,
                             tokenizer, config)


def load_word_area(split: str, tokenizer, config) -> Split:
  path = _path("word_area", split, config)
  words, tags, where, _ = conll.read_sentences(path)
  tag_ids = [label_ids(t, WORD_LABELS, w, "word_area") for t, w in zip(tags, where)]
  arrays, first_positions = conll.encode(tokenizer, words, tag_ids, config.max_seq_length)
  return Split(split, arrays,
               functools.partial(conll.score, tags, first_positions, labels=WORD_LABELS),
               per_position_outputs=True)
