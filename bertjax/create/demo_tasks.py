"""Three labelled tasks from the demo corpus's own text, none of which asks whether
two segments belong together (what next-sentence prediction trains):

  related_words  word pairs: do two words belong to the same part of Python?
                 A word belongs to an area when most of its occurrences in
                 the training sentences are there (area_words); the dev pairs
                 hold only words that no training pair holds (DEV_WORD_SHARE
                 of the area words, drawn with SEED), so the training pairs
                 say nothing about the dev words and a bag of words is at
                 chance. What a model knows of them comes from pretraining.
  doc_area       single-sentence classification: which part of Python a
                 sentence documents (one of AREAS: the language reference, or
                 a group of standard-library modules).
  word_area      token tagging: in a sentence, each word that several parts
                 of Python use (ambiguous_words: "buffer", "connection",
                 "close", ...) is tagged with the part that this sentence
                 documents (B-<area>), every other word O.

doc_area and word_area are lexical (a bag of words does them well; docs/
recipes.md). Their labels come from where each sentence of the demo's text
files was taken (bertjax.create.demo.demo_sources: a reference topic or a
library file, mapped to its area). A sentence is a training example when it
is in text/train.txt and a dev example when it is in text/eval.txt, which
holds the demo's held-out sources: train and dev are split by source file
(check_split_by_source). Only sentences of five or more words are used (the
corpus keeps each of those once, so each has one source). Written once per
demo data directory:

  data_dir/tasks/related_words/{train,dev}.tsv  "label<TAB>word<TAB>word" per line
  data_dir/tasks/doc_area/{train,dev}.tsv       "area<TAB>sentence" per line
  data_dir/tasks/word_area/{train,dev}.txt      "word tag" per line, a blank
                                                line after each sentence

Each is capped (MAX_PAIRS, MAX_PER_AREA, MAX_SENTENCES) with a fixed seed, so
a fine-tuning run takes seconds at the demo's scale.
"""

import collections
import json
import os
import random
import re
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
# related_words: a word (lower-cased, letters only, three letters or more, not
# among the COMMON most frequent) belongs to an area when it occurs
# AREA_WORD_MIN_COUNT times or more in the training sentences of known area,
# AREA_WORD_MIN_SHARE of them in that area. DEV_WORD_SHARE of those words (drawn
# with SEED) make the dev pairs, the rest the training pairs.
AREA_WORD_MIN_COUNT, AREA_WORD_MIN_SHARE, DEV_WORD_SHARE = 5, 0.8, 0.25
RELATED_LABELS = ("different", "same")
MAX_PAIRS = {"train": 4000, "dev": 1000}  # related_words pairs, half of them "same".
# Every task's files under data_dir/tasks/TASK/, by split.
TASK_FILES = {"doc_area": {"train": "train.tsv", "dev": "dev.tsv"},
              "word_area": {"train": "train.txt", "dev": "dev.txt"},
              "related_words": {"train": "train.tsv", "dev": "dev.tsv"}}
_WORD = re.compile(r"\w+|[^\w\s]")


def task_dir(data_dir: str, task: str) -> str:
  return os.path.join(data_dir, "tasks", task)


def _area_of(module: str) -> Optional[str]:
  for area, modules in AREAS.items():
    if module in modules:
      return area
  return None


def area_of_source(source: str) -> str:
  """The area of one of demo.demo_sources' sources: "reference" for a
  reference topic, a library file's by its top-level module, "" outside AREAS."""
  if source.startswith("reference:"):
    return "reference"
  return _area_of(source.split("/")[0].removesuffix(".py")) or ""


def sentence_sources(sources=None) -> dict[str, str]:
  """sentence -> the source it was kept from (demo.demo_sources' names: a
  reference topic or a library file), for the corpus's sentences of five or
  more words, each of which the corpus keeps once. `sources` (demo_sources'
  list) is for tests."""
  if sources is None:
    sources = demo.demo_sources()
  return {sentence: name for name, docs in sources for doc in docs for sentence in doc
          if len(sentence.split()) >= 5}


def sentence_areas(sources=None) -> dict[str, str]:
  """sentence -> its area ("" outside AREAS), by sentence_sources."""
  return {s: area_of_source(name) for s, name in sentence_sources(sources).items()}


def words(sentence: str) -> list[str]:
  """Runs of letters, digits and underscores, and single punctuation marks, as
  BERT's basic tokenizer splits a sentence."""
  return _WORD.findall(sentence)


def _area_counts(labelled: list[tuple[str, str]]):
  """(word -> Counter of its areas, the COMMON most frequent words): the words
  (lower-cased, letters only, three letters or more) of (area, sentence) pairs."""
  counts = collections.defaultdict(collections.Counter)
  for area, sentence in labelled:
    for w in words(sentence):
      if w.isalpha() and len(w) >= 3:
        counts[w.lower()][area] += 1
  common = set(sorted(counts, key=lambda w: (-sum(counts[w].values()), w))[:COMMON])
  return counts, common


def ambiguous_words(labelled: list[tuple[str, str]]) -> set[str]:
  """The words that several areas share (see COMMON, MIN_COUNT, MIN_SHARE) in
  (area, sentence) pairs."""
  counts, common = _area_counts(labelled)
  out = set()
  for w, by_area in counts.items():
    total = sum(by_area.values())
    if w not in common and total >= MIN_COUNT and sum(
        n >= MIN_SHARE * total for n in by_area.values()) >= 2:
      out.add(w)
  return out


def area_words(labelled: list[tuple[str, str]]) -> dict[str, str]:
  """word -> its area, for the words that belong to one area (see
  AREA_WORD_MIN_COUNT, AREA_WORD_MIN_SHARE) in (area, sentence) pairs."""
  counts, common = _area_counts(labelled)
  out = {}
  for w, by_area in counts.items():
    area, n = by_area.most_common(1)[0]
    total = sum(by_area.values())
    if w not in common and total >= AREA_WORD_MIN_COUNT and n >= AREA_WORD_MIN_SHARE * total:
      out[w] = area
  return out


def related_pairs(words_by_area: dict[str, list[str]], count: int,
                  rng: random.Random) -> list[tuple[str, str, str]]:
  """`count` (label, word, word) rows, alternately two words of one area
  ("same") and words of two areas ("different"), areas drawn uniformly among
  those with words (two or more for "same")."""
  multi = sorted(a for a, ws in words_by_area.items() if len(ws) >= 2)
  areas = sorted(a for a, ws in words_by_area.items() if ws)
  if not multi or len(areas) < 2:
    sizes = {a: len(w) for a, w in words_by_area.items()}
    raise ValueError(f"related_words: too few area words (per area: {sizes}); the demo text "
                     "is too small for related_words")
  rows = []
  for i in range(count):
    if i % 2 == 0:
      a = rng.choice(multi)
      w1, w2 = rng.sample(words_by_area[a], 2)
      rows.append((RELATED_LABELS[1], w1, w2))
    else:
      a, b = rng.sample(areas, 2)
      rows.append((RELATED_LABELS[0], rng.choice(words_by_area[a]),
                   rng.choice(words_by_area[b])))
  return rows


def _write_related_words(dirs, labelled_train, log) -> None:
  """related_words: pairs of area words (area_words, from the training
  sentences only), the dev pairs from words that no training pair holds."""
  by_word = area_words(labelled_train)
  rng = random.Random(SEED)
  vocab = sorted(by_word)
  rng.shuffle(vocab)
  num_dev = int(round(len(vocab) * DEV_WORD_SHARE))
  for split, split_words in (("train", vocab[num_dev:]), ("dev", vocab[:num_dev])):
    grouped = {a: sorted(w for w in split_words if by_word[w] == a) for a in AREAS}
    rows = related_pairs(grouped, MAX_PAIRS[split], rng)
    fileio.write_text(os.path.join(dirs["related_words"], TASK_FILES["related_words"][split]),
                      "".join(f"{label}\t{a}\t{b}\n" for label, a, b in rows))
    log(f"demo tasks ({split}): related_words {len(rows)} pairs of {len(split_words)} "
        "area words")


def _documents(path: str) -> list[list[str]]:
  """The documents of a demo text file, each its sentences."""
  report = collections.Counter()
  return [doc for shard in documents.list_input_shards(path)
          for doc, _ in documents.iter_documents(shard, report)]


def check_split_by_source(data_dir: str) -> dict[str, list[str]]:
  """Each split's sources (text/sources.json, demo.sources_path); an error naming
  the file when it is missing (text built before the split by source) or when
  a source is on both sides."""
  path = demo.sources_path(data_dir)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"{path}: missing, so this demo text was split by document, not by source file; "
        f"delete {os.path.join(data_dir, 'text')} (and the records and vocab beside it) "
        "and build the demo data again")
  with open(path, encoding="utf-8") as f:
    sources = json.load(f)
  both = sorted(set(sources["train"]) & set(sources["eval"]))
  if both:
    raise ValueError(f"{path}: sources on both sides of the split: {both[:5]}")
  return sources


def ensure_tasks(data_dir: str, log=print,
                 areas: Optional[dict[str, str]] = None) -> dict[str, str]:
  """Writes every task's files (TASK_FILES) under data_dir/tasks from the demo's
  text files (data_dir/text/train.txt and eval.txt, split by source file:
  check_split_by_source) where absent; returns each task's directory.
  `areas` (sentence_areas' map) is for tests."""
  dirs = {t: task_dir(data_dir, t) for t in TASK_FILES}
  if all(os.path.exists(os.path.join(dirs[t], name))
         for t, names in TASK_FILES.items() for name in names.values()):
    return dirs
  check_split_by_source(data_dir)
  sentences = {}
  for split, name in _SPLITS.items():
    path = os.path.join(data_dir, "text", name)
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path}: the demo's text is missing; build the demo data "
                              "first (bertjax.create.demo.ensure_demo_data)")
    sentences[split] = [s for doc in _documents(path) for s in doc]
  areas = sentence_areas() if areas is None else areas
  _write_area_tasks(dirs, sentences, areas, log)
  _write_related_words(dirs, [(areas[s], s) for s in sentences["train"] if areas.get(s)], log)
  return dirs


def _write_area_tasks(dirs, sentences, areas, log) -> None:
  """doc_area and word_area, labelled by each sentence's area."""
  labelled = {split: [(areas[s], s) for s in sentences[split] if areas.get(s)]
              for split in _SPLITS}
  # Dev may lack an area whose every file was drawn for training (the split is
  # by source file); training may not.
  missing = sorted(set(AREAS) - {a for a, _ in labelled["train"]})
  if missing:
    raise ValueError(f"text/{_SPLITS['train']}: no sentence of a known source for areas "
                     f"{missing}; was the text built by this Python's bertjax.create.demo?")
  shared = ambiguous_words(labelled["train"])  # From the training sentences only.
  rng = random.Random(SEED)
  for split in _SPLITS:
    by_area = {area: [s for a, s in labelled[split] if a == area] for area in AREAS}
    rows = [(a, s) for a, sentences_ in by_area.items()
            for s in rng.sample(sentences_, min(len(sentences_), MAX_PER_AREA[split]))]
    rng.shuffle(rows)
    _write_rows(os.path.join(dirs["doc_area"], f"{split}.tsv"), rows)
    tagged = [[(w, f"B-{a}" if w.lower() in shared else "O") for w in words(s)]
              for a, s in labelled[split] if any(w.lower() in shared for w in words(s))]
    if not tagged:
      raise ValueError(f"{os.path.dirname(dirs['word_area'])}: no {split} sentence holds a "
                       "word that several areas share; the demo text is too small for "
                       "word_area")
    keep = sorted(rng.sample(range(len(tagged)), min(len(tagged), MAX_SENTENCES[split])))
    lines = []
    for i in keep:
      lines += [f"{w} {t}" for w, t in tagged[i]] + [""]
    fileio.write_text(os.path.join(dirs["word_area"], f"{split}.txt"), "\n".join(lines))
    absent = [a for a in AREAS if not by_area[a]]
    log(f"demo tasks ({split}): doc_area {len(rows)} sentences"
        + (f" (none from {', '.join(absent)})" if absent else "")
        + f", word_area {len(keep)} sentences ({len(shared)} shared words)")


def _write_rows(path: str, rows) -> None:
  """(label, sentence) rows as "label<TAB>sentence" lines."""
  fileio.write_text(path, "".join(f"{a}\t{s.replace(chr(9), ' ')}\n" for a, s in rows))
