"""Two labelled tasks from the demo corpus's own sentences, neither of which asks
whether two segments belong together (what next-sentence prediction trains):

  doc_area   single-sentence classification: which part of Python a sentence
             documents (one of AREAS: the language reference, or a group of
             standard-library modules).
  word_area  token tagging: in a sentence, each word that several parts of
             Python use (ambiguous_words: "buffer", "connection", "close", ...)
             is tagged with the part that this sentence documents
             (B-<area>), every other word O. Which part a word belongs to
             here is told by its context, not by the word.

The labels come from where each sentence of the demo's text files was taken
(bertjax.create.demo: the reference topics, then the standard library's
docstrings, in the same order, so a sentence repeated in the sources keeps the
place it was kept from). A sentence is a training example when its document is
in text/train.txt and a dev example when it is in text/eval.txt, the demo's
held-out documents, which pretraining never reads: train and dev are split by
document. Only sentences of five or more words are used (the corpus keeps each
of those once, so each has one source). Written once per demo data directory:

  data_dir/tasks/doc_area/{train,dev}.tsv    "area<TAB>sentence" per line
  data_dir/tasks/word_area/{train,dev}.txt   "word tag" per line, a blank line
                                             after each sentence

Both are capped (MAX_PER_AREA, MAX_SENTENCES) with a fixed seed, so a
fine-tuning run takes seconds at the demo's scale.
"""

import collections
import os
import random
import re
import sysconfig
from typing import Optional

from bertjax.create import demo
from bertjax.create import documents
from bertjax.records import fileio

# Area -> the top-level standard-library modules and packages it covers;
# "reference" is the language reference (pydoc_data.topics).
AREAS = {
    "reference": (),
    "email": ("email", "mailbox", "smtplib", "imaplib", "poplib", "mimetypes", "nntplib"),
    "asyncio": ("asyncio",),
    "concurrency": ("multiprocessing", "concurrent", "threading", "queue", "subprocess",
                    "sched", "_threading_local", "selectors"),
    "internet": ("http", "urllib", "ftplib", "socket", "ssl", "socketserver", "xmlrpc",
                 "wsgiref", "ipaddress", "webbrowser", "telnetlib"),
    "markup": ("xml", "html"),
    "testing": ("unittest", "doctest", "pdb", "bdb", "trace", "cProfile", "profile",
                "pstats", "timeit", "tracemalloc"),
    "gui": ("tkinter",),
    "files": ("os", "pathlib", "shutil", "tempfile", "glob", "fnmatch", "zipfile", "tarfile",
              "gzip", "bz2", "lzma", "filecmp", "fileinput", "_pyio", "io", "ntpath",
              "posixpath", "genericpath", "stat"),
}
WORD_TAGS = ("O", *(f"B-{a}" for a in AREAS))
MAX_PER_AREA = {"train": 250, "dev": 60}  # doc_area sentences per area, drawn with SEED.
MAX_SENTENCES = {"train": 2000, "dev": 500}  # word_area sentences, drawn with SEED.
# ambiguous_words: a word (lower-cased, three letters or more) that is not among
# the COMMON most frequent ones, occurs MIN_COUNT times or more in the training
# sentences of known area, and has at least MIN_SHARE of its occurrences in
# each of two areas or more.
COMMON, MIN_COUNT, MIN_SHARE = 150, 10, 0.2
SEED = 0
_SPLITS = {"train": "train.txt", "dev": "eval.txt"}
_WORD = re.compile(r"\w+|[^\w\s]")


def task_dir(data_dir: str, task: str) -> str:
  return os.path.join(data_dir, "tasks", task)


def _area_of(module: str) -> Optional[str]:
  for area, modules in AREAS.items():
    if module in modules:
      return area
  return None


def sentence_areas(library_root: Optional[str] = None) -> dict[str, str]:
  """sentence -> its area ("" outside AREAS), for the corpus's sentences of five
  or more words, each from where demo.documents_from_sections keeps it (its
  first appearance)."""
  areas = {}

  def add(paragraphs, area):
    for p in paragraphs:
      for sentence in demo._split_sentences(p):  # pylint: disable=protected-access
        if len(sentence.split()) >= 5:
          areas.setdefault(sentence, area)

  for sections in demo._topic_sections():  # pylint: disable=protected-access
    for paragraphs in sections:
      add(paragraphs, "reference")
  root = library_root or sysconfig.get_paths()["stdlib"]
  for path in demo.python_sources(root, demo._SKIPPED_LIBRARY_DIRS):  # pylint: disable=protected-access
    module = os.path.relpath(path, root).split(os.sep)[0].removesuffix(".py")
    for sections in demo.module_sections([path]):
      for paragraphs in sections:
        add(paragraphs, _area_of(module) or "")
  return areas


def words(sentence: str) -> list[str]:
  """Runs of letters, digits and underscores, and single punctuation marks, as
  BERT's basic tokenizer splits a sentence."""
  return _WORD.findall(sentence)


def ambiguous_words(labelled: list[tuple[str, str]]) -> set[str]:
  """The words that several areas share (see COMMON, MIN_COUNT, MIN_SHARE) in
  (area, sentence) pairs."""
  counts = collections.defaultdict(collections.Counter)
  for area, sentence in labelled:
    for w in words(sentence):
      if w.isalpha() and len(w) >= 3:
        counts[w.lower()][area] += 1
  common = set(sorted(counts, key=lambda w: (-sum(counts[w].values()), w))[:COMMON])
  out = set()
  for w, by_area in counts.items():
    total = sum(by_area.values())
    if w not in common and total >= MIN_COUNT and sum(
        n >= MIN_SHARE * total for n in by_area.values()) >= 2:
      out.add(w)
  return out


def _documents(path: str) -> list[list[str]]:
  """The documents of a demo text file, each its sentences."""
  report = collections.Counter()
  return [doc for shard in documents.list_input_shards(path)
          for doc, _ in documents.iter_documents(shard, report)]


def ensure_tasks(data_dir: str, log=print,
                 areas: Optional[dict[str, str]] = None) -> dict[str, str]:
  """Writes both tasks' files under data_dir/tasks from the demo's text files
  (data_dir/text/train.txt and eval.txt) where absent; returns each task's
  directory. `areas` (sentence_areas' map) is for tests."""
  dirs = {t: task_dir(data_dir, t) for t in ("doc_area", "word_area")}
  wanted = [os.path.join(dirs["doc_area"], f"{s}.tsv") for s in _SPLITS] + [
      os.path.join(dirs["word_area"], f"{s}.txt") for s in _SPLITS]
  if all(os.path.exists(p) for p in wanted):
    return dirs
  if areas is None:
    areas = sentence_areas()
  labelled = {}
  for split, name in _SPLITS.items():
    path = os.path.join(data_dir, "text", name)
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path}: the demo's text is missing; build the demo data "
                              "first (bertjax.create.demo.ensure_demo_data)")
    labelled[split] = [(areas[s], s) for doc in _documents(path) for s in doc
                       if areas.get(s)]
    missing = sorted(set(AREAS) - {a for a, _ in labelled[split]})
    if missing:
      raise ValueError(f"{path}: no sentence of a known source for areas {missing}; was "
                       "the text built by this Python's bertjax.create.demo?")
  shared = ambiguous_words(labelled["train"])  # From the training sentences only.
  rng = random.Random(SEED)
  for split in _SPLITS:
    by_area = {area: [s for a, s in labelled[split] if a == area] for area in AREAS}
    rows = [(a, s) for a, sentences in by_area.items()
            for s in rng.sample(sentences, min(len(sentences), MAX_PER_AREA[split]))]
    rng.shuffle(rows)
    fileio.write_text(os.path.join(dirs["doc_area"], f"{split}.tsv"),
                      "".join(f"{a}\t{s.replace(chr(9), ' ')}\n" for a, s in rows))
    tagged = [[(w, f"B-{a}" if w.lower() in shared else "O") for w in words(s)]
              for a, s in labelled[split] if any(w.lower() in shared for w in words(s))]
    if not tagged:
      raise ValueError(f"{data_dir}: no {split} sentence holds a word that several areas "
                       "share; the demo text is too small for word_area")
    keep = sorted(rng.sample(range(len(tagged)), min(len(tagged), MAX_SENTENCES[split])))
    lines = []
    for i in keep:
      lines += [f"{w} {t}" for w, t in tagged[i]] + [""]
    fileio.write_text(os.path.join(dirs["word_area"], f"{split}.txt"), "\n".join(lines))
    log(f"demo tasks ({split}): doc_area {len(rows)} sentences, word_area "
        f"{len(keep)} sentences ({len(shared)} shared words)")
  return dirs
