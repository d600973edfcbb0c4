"""MediaWiki XML dumps: files -> byte ranges -> pages.

A dump (`enwiki-*-pages-articles*.xml*`: plain XML, bz2, multistream bz2,
or gzip) is cut into byte ranges of about `split_bytes` stored bytes, the
unit of work of extraction. A range holds the pages whose `<page>` tag
starts in it: in a plain file the tag's own byte, in a compressed one the
unit (bz2_units: stream or block) whose decompressed bytes hold it. The
reader of a range reads on past its end to finish its last page, so
consecutive ranges read every page once, whatever their size. Gzip files
are read whole (gzip has no units to start from).

Each page's XML (`<page>...</page>`) is parsed on its own (expat, through
xml.etree), in the dump schema: `<title>`, `<ns>`, `<id>`, `<redirect
title=.../>` and the last `<revision>`'s `<text>`. The namespace names
(`<siteinfo>`) are read once per file from its start. Damaged input is an
error naming the file and the page (a truncated file, corrupt compressed
data) or, for one page, a counted skip with a warning (a page whose XML does
not parse: `malformed_xml`; a page without a text element: `no_text`).
"""

import bisect
import dataclasses
import html
import functools
import logging
import re
from typing import Any, IO, Iterator, Optional
import xml.etree.ElementTree as ET

from bertjax.corpus import bz2_units
from bertjax.records import fileio

_PAGE_OPEN = b"<page>"
_PAGE_CLOSE = b"</page>"
_READ = 4 << 20
_NAMESPACE = re.compile(
    rb'<namespace\s+key="(-?\d+)"[^>]*?(?:/>|>(.*?)</namespace>)', re.S)
_TITLE = re.compile(rb"<title>(.*?)</title>", re.S)


@dataclasses.dataclass(frozen=True)
class DumpRange:
  """Pages of one dump file: those that start in `byte_range` of it."""
  path: str
  kind: str  # xml, bz2-streams, bz2-blocks or whole (gzip: read whole).
  byte_range: tuple[int, int]
  file_size: int

  def describe(self) -> dict[str, Any]:
    return {"path": self.path, "kind": self.kind, "range": list(self.byte_range),
            "size": self.file_size}


@dataclasses.dataclass(frozen=True)
class Page:
  """A page of a dump; `text` is None when it has no text element."""
  title: str
  ns: Optional[int]
  page_id: str
  redirect: bool
  text: Optional[str]
  offset: int  # Where its `<page>` starts (stored bytes, or its unit's).


def file_kind(path: str) -> str:
  """How a dump file is split: plain XML by bytes, bz2 by stream
  (multistream files) or block, gzip not at all."""
  if path.endswith(".gz"):
    return "whole"
  if path.endswith(".bz2"):
    with fileio.open_binary(path) as f:
      return "bz2-streams" if bz2_units.is_multistream(f) else "bz2-blocks"
  return "xml"


def list_ranges(paths: list[str], split_bytes: int) -> list[DumpRange]:
  """Each file's byte ranges of `split_bytes` stored bytes (one for gzip).
  ValueError naming --input_file for a file that is not a dump."""
  ranges = []
  for path in paths:
    if b"<mediawiki" not in _head(path):
      raise ValueError(f"--input_file: {path} is not a MediaWiki XML dump (no "
                       "<mediawiki> element at its start; a multistream "
                       "index file?).")
    size = fileio.size(path)
    kind = file_kind(path)
    step = size if kind == "whole" else max(1, split_bytes)
    for start in range(0, max(size, 1), step):
      ranges.append(DumpRange(path, kind, (start, min(size, start + step)), size))
  return ranges


@functools.lru_cache(maxsize=64)
def _head(path: str) -> bytes:
  """The decompressed start of a file, up to its first page (or 4 MiB)."""
  head = b""
  kind = ("whole" if path.endswith(".gz") else
          "bz2-streams" if path.endswith(".bz2") else "xml")
  with fileio.open_binary(path) as raw:
    try:
      for _, data in _units(raw, path, kind, 0):
        head += data
        if b"</siteinfo>" in head or b"<page>" in head or len(head) > 4 << 20:
          break
    except (OSError, EOFError) as e:
      raise ValueError(f"{path}: cannot read its start ({e}).") from e
  return head.split(b"<page>", 1)[0]


def namespaces(path: str) -> dict[int, str]:
  """The namespace names (key -> name, "" for articles) of a dump's
  `<siteinfo>`, read from the start of the file; {} if it has none."""
  return {int(k): ET.fromstring(b"<n>" + (v or b"") + b"</n>").text or ""
          for k, v in _NAMESPACE.findall(_head(path))}


def _units(raw: IO[bytes], path: str, kind: str, start: int
           ) -> Iterator[tuple[int, bytes]]:
  """(offset, bytes) of a file's decompressed data from `start`: for plain
  XML the offset of each chunk's first byte, for compressed files that of
  the unit (bz2_units) the bytes come from (0 for gzip)."""
  if kind == "bz2-streams":
    yield from bz2_units.iter_streams(raw, start, path)
  elif kind == "bz2-blocks":
    yield from bz2_units.iter_blocks(raw, start, path)
  elif kind == "whole":
    with fileio.open_read(path) as f:
      lines, size = [], 0
      for line in f:
        lines.append(line)
        size += len(line)
        if size >= _READ:
          yield 0, b"".join(lines)
          lines, size = [], 0
      yield 0, b"".join(lines)
  else:
    raw.seek(start)
    pos = start
    while True:
      data = raw.read(_READ)
      if not data:
        return
      yield pos, data
      pos += len(data)


class _Window:
  """The decompressed bytes read so far and not yet consumed, with the
  stored offset of each piece (`marks`: (index in buf, offset))."""

  def __init__(self, units: Iterator[tuple[int, bytes]], exact: bool):
    self.units = units
    self.exact = exact  # Plain XML: offsets advance byte by byte.
    self.buf = b""
    self.marks: list[tuple[int, int]] = []

  def more(self) -> bool:
    """Appends the next piece; False at the end of the file."""
    for off, data in self.units:
      self.marks.append((len(self.buf), off))
      self.buf += data
      return True
    return False

  def offset_of(self, i: int) -> int:
    k = bisect.bisect_right(self.marks, (i, float("inf"))) - 1
    at, off = self.marks[k]
    return off + (i - at if self.exact else 0)

  def drop(self, cut: int) -> None:
    """Forgets the first `cut` bytes."""
    marks = []
    for at, off in self.marks:
      if at <= cut:
        marks = [(0, off + (cut - at if self.exact else 0))]
      else:
        marks.append((at - cut, off))
    self.marks = marks
    self.buf = self.buf[cut:]


def iter_pages(dump: DumpRange, report) -> Iterator[Page]:
  """The pages of a range, in order. Every page is counted in
  report["read"]; malformed pages and pages without text are counted
  (dropped.malformed_xml, dropped.no_text), logged and skipped."""
  start, end = dump.byte_range
  last_title = None
  with fileio.open_binary(dump.path) as raw:
    w = _Window(_units(raw, dump.path, dump.kind, start), dump.kind == "xml")
    while True:
      p = w.buf.find(_PAGE_OPEN)
      while p < 0:
        w.drop(max(0, len(w.buf) - 64))  # The end, for _check_end.
        if not w.more():
          _check_end(dump, w.buf, last_title)
          return
        p = w.buf.find(_PAGE_OPEN)
      off = w.offset_of(p)
      if off >= end:
        return
      q = w.buf.find(_PAGE_CLOSE, p)
      while q < 0:
        if not w.more():
          raise ValueError(
              f"{dump.path}: truncated: the file ends inside the page that "
              f"starts at byte {off}{_named(w.buf[p:p + 4096])}.")
        q = w.buf.find(_PAGE_CLOSE, p)
      nested = w.buf.find(_PAGE_OPEN, p + 1, q)
      cut = nested if nested >= 0 else q + len(_PAGE_CLOSE)
      if off >= start:  # Else the page is the range before's (plain XML).
        report["read"] += 1
        if nested >= 0:  # A page without its end.
          _skip(report, "malformed_xml", dump.path, off, w.buf[p:nested])
        else:
          page = _parse(w.buf[p:cut], off, dump.path, report)
          if page is not None:
            last_title = page.title
            yield page
      w.drop(cut)


def _check_end(dump: DumpRange, tail: bytes, last_title) -> None:
  """At the end of a file: a plain or gzip dump must end with
  `</mediawiki>`, else it was cut short."""
  if dump.byte_range[1] < dump.file_size:
    return
  if dump.kind in ("xml", "whole") and b"</mediawiki>" not in tail:
    after = f" after the page {last_title!r}" if last_title else ""
    raise ValueError(f"{dump.path}: truncated: no </mediawiki> at the end of "
                     f"the file{after}.")


def _named(xml_head: bytes) -> str:
  m = _TITLE.search(xml_head)
  return f" ({html.unescape(m.group(1).decode('utf-8', 'replace'))!r})" if m else ""


def _skip(report, reason: str, path: str, offset: int, xml_head: bytes) -> None:
  report[f"dropped.{reason}"] += 1
  logging.warning("%s: page at byte %d%s skipped: %s.", path, offset,
                  _named(xml_head), reason.replace("_", " "))


def _parse(xml: bytes, offset: int, path: str, report) -> Optional[Page]:
  """A page's fields, or None (counted, logged) if its XML does not parse
  or it has no text element."""
  try:
    el = ET.fromstring(xml)
  except ET.ParseError:
    _skip(report, "malformed_xml", path, offset, xml[:4096])
    return None
  title = el.findtext("title") or ""
  ns = el.findtext("ns")
  revisions = el.findall("revision")
  text = revisions[-1].find("text") if revisions else None
  if text is None:
    _skip(report, "no_text", path, offset, xml[:4096])
    return None
  return Page(title=title, ns=int(ns) if ns and ns.strip().lstrip("-").isdigit()
              else None, page_id=el.findtext("id") or "",
              redirect=el.find("redirect") is not None,
              text=text.text or "", offset=offset)
