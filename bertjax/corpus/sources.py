"""The three sources -> shards of input -> documents of sentences.

  wikipedia  MediaWiki XML dumps (dumps.py) -> articles' passages
             (wikitext.py), one article a document
  books      plain-text books (books.py), one book a document
  tfds       a prepared TensorFlow Datasets split: `wikipedia/*` examples
             (tfds_text.py) or `pg19` books (books.py)

A `SourceShard` is the unit of work of extraction: a byte range of a dump
file, a group of book files, or an even part of a tfds split. Its documents
come out in input order, so the corpus's order, and the output, do not
depend on how the input was cut. A document is its paragraphs split into
sentences with the project's splitter (bertjax.text.corpus), dropped when
it has fewer than `min_words` words. `report` counts the input items read
(`read`), the ones dropped by reason (`dropped.<reason>`) and what the rules
removed inside the kept ones.
"""

import dataclasses
import functools
import logging
from typing import Any, Iterator, Optional

from bertjax.corpus import books
from bertjax.corpus import dumps
from bertjax.corpus import markup_scan
from bertjax.corpus import tfds_text
from bertjax.corpus import wikitext
from bertjax.records import fileio
from bertjax.text import corpus

SOURCES = ("wikipedia", "books", "tfds")
# tfds datasets with rules, by the name before "/": their text feature.
TFDS_FEATURES = {"wikipedia": "text", "pg19": "book_text"}
NUM_TFDS_PARTS = 64


@dataclasses.dataclass(frozen=True)
class SourceShard:
  """One extraction task's input."""
  index: int
  source: str
  dump: Optional[dumps.DumpRange] = None  # wikipedia
  paths: tuple[str, ...] = ()  # books
  tfds_name: str = ""
  tfds_split: str = ""
  tfds_part: tuple[int, int] = (0, 1)

  def describe(self) -> dict[str, Any]:
    if self.dump is not None:
      return self.dump.describe()
    if self.paths:
      return {"paths": list(self.paths)}
    return {"tfds": self.tfds_name, "split": self.tfds_split,
            "part": list(self.tfds_part)}


def unit(source: str, tfds_name: str = "") -> str:
  """What the source's input items are, in the manifest: pages or books."""
  if source == "books" or (source == "tfds" and _tfds_kind(tfds_name) == "pg19"):
    return "books"
  return "pages"


def _tfds_kind(name: str) -> str:
  return name.split("/")[0].split(":")[0]


def list_shards(source: str, input_file: str = "", tfds_name: str = "",
                tfds_split: str = "train",
                split_bytes: int = 32 << 20) -> list[SourceShard]:
  """The input's shards; ValueError naming the flag for a bad input."""
  if source not in SOURCES:
    raise ValueError(f"--source={source}: must be one of {', '.join(SOURCES)}.")
  if input_file and source == "tfds":
    raise ValueError("--input_file: not used with --source=tfds.")
  if source == "tfds":
    if not tfds_name:
      raise ValueError("--source=tfds needs --tfds_name (wikipedia/... or pg19).")
    if _tfds_kind(tfds_name) not in TFDS_FEATURES:
      raise ValueError(f"--tfds_name={tfds_name}: only wikipedia/* and pg19 "
                       "have rules here.")
    return [SourceShard(i, source, tfds_name=tfds_name, tfds_split=tfds_split,
                        tfds_part=(i, NUM_TFDS_PARTS))
            for i in range(NUM_TFDS_PARTS)]
  files = fileio.expand(input_file, "--input_file")
  if source == "wikipedia":
    return [SourceShard(i, source, dump=r)
            for i, r in enumerate(dumps.list_ranges(files, split_bytes))]
  groups, size = [[]], 0
  for path in files:  # Books: groups of about split_bytes.
    if groups[-1] and size >= split_bytes:
      groups.append([])
      size = 0
    groups[-1].append(path)
    size += fileio.size(path)
  return [SourceShard(i, source, paths=tuple(g)) for i, g in enumerate(groups)]


def iter_documents(shard: SourceShard, min_words: int, report
                   ) -> Iterator[tuple[list[str], int]]:
  """A shard's documents, as (sentences, words), in input order."""
  if shard.source == "wikipedia":
    items = _wikipedia(shard.dump, report)
  elif shard.source == "books":
    items = _books(shard.paths, report)
  else:
    items = _tfds(shard, report)
  for paragraphs in items:
    sentences = [s for p in paragraphs for s in corpus.split_sentences(p)]
    words = sum(len(s.split()) for s in sentences)
    if not sentences or words < min_words:
      report["dropped.too_short"] += 1
      continue
    yield sentences, words


@functools.lru_cache(maxsize=64)
def _link_rules(path: str) -> markup_scan.LinkRules:
  return markup_scan.LinkRules(dumps.namespaces(path))


def _wikipedia(dump: dumps.DumpRange, report) -> Iterator[list[str]]:
  links = _link_rules(dump.path)
  for page in dumps.iter_pages(dump, report):
    if page.ns is None and ":" in page.title:
      ns = _namespace_from_title(page.title, dumps.namespaces(dump.path))
    else:
      ns = page.ns or 0
    if ns != 0:
      report["dropped.namespace"] += 1
    elif page.redirect or wikitext.is_redirect(page.text):
      report["dropped.redirect"] += 1
    elif wikitext.is_disambiguation(page.title, page.text):
      report["dropped.disambiguation"] += 1
    else:
      try:
        yield wikitext.passages(page.text, links)
      except wikitext.ParseFailure as e:
        report["dropped.parser_error"] += 1
        logging.warning("%s: page %r (id %s) skipped: %s.", dump.path,
                        page.title, page.page_id, e)


def _namespace_from_title(title: str, names: dict[int, str]) -> int:
  """A page's namespace in dumps without `<ns>` (schema before 0.6): the
  namespace whose name prefixes its title."""
  prefix = title.split(":", 1)[0]
  return next((k for k, name in names.items() if name and name == prefix), 0)


def _decode(data: bytes, report) -> str:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    report["invalid_utf8_repaired"] += 1
    return data.decode("utf-8", errors="replace")


def _books(paths, report) -> Iterator[list[str]]:
  for path in paths:
    report["read"] += 1
    try:
      data = fileio.read_bytes(path)
    except OSError as e:
      raise ValueError(f"--input_file: cannot read {path}: {e}") from e
    yield books.paragraphs(_decode(data, report), report)


def _tfds(shard: SourceShard, report) -> Iterator[list[str]]:
  kind = _tfds_kind(shard.tfds_name)
  feature = TFDS_FEATURES[kind]
  for example in corpus.tfds_examples(shard.tfds_name, shard.tfds_split,
                                      shard.tfds_part):
    report["read"] += 1
    if feature not in example:
      raise ValueError(f"--tfds_name={shard.tfds_name}: examples have no "
                       f"{feature!r} (they have {sorted(example)}).")
    text = _decode(example[feature], report)
    if kind == "pg19":
      yield books.paragraphs(text, report)
      continue
    title = _decode(example.get("title", b""), report)
    paragraphs = tfds_text.wikipedia_paragraphs(title, text, report)
    if paragraphs is None:
      report["dropped.disambiguation"] += 1
    else:
      yield paragraphs
