"""Reading MediaWiki dumps the tests write in the real schema: every kind of
file, any byte ranges, and damaged input (bertjax/corpus/dumps.py,
bz2_units.py)."""

import bz2
import collections
import io
import logging
import random

import pytest

import wiki_dumps
from bertjax.corpus import bz2_units
from bertjax.corpus import dumps
from bertjax.corpus import sources


def _pages(n=250):
  pages = []
  for i in range(n):
    if i % 7 == 3:
      pages.append(wiki_dumps.page_xml(f"Redirect {i}", "#REDIRECT [[Place 1]]",
                                       10 + i, redirect="Place 1"))
    elif i % 11 == 5:
      pages.append(wiki_dumps.page_xml(f"Talk:Place {i}", "Talk text.", 10 + i,
                                       ns=1))
    else:
      pages.append(wiki_dumps.page_xml(f"Place {i} & co", wiki_dumps.filler(i),
                                       10 + i))
  return pages


def _read(path, split_bytes):
  report = collections.Counter()
  ranges = dumps.list_ranges([path], split_bytes)
  pages = [(p.title, p.ns, p.page_id, p.redirect, p.text)
           for r in ranges for p in dumps.iter_pages(r, report)]
  return pages, report, ranges


@pytest.mark.parametrize("kind", ["xml", "gz", "bz2", "multistream"])
def test_every_kind_and_any_ranges_give_the_same_pages(tmp_path, kind):
  pages = _pages()
  suffix = {"xml": "", "gz": ".gz", "bz2": ".bz2", "multistream": ".bz2"}
  path = wiki_dumps.write_dump(
      str(tmp_path / f"enwiki-pages-articles-{kind}.xml{suffix[kind]}"),
      pages, kind, pages_per_stream=20)
  if kind == "multistream":
    assert dumps.file_kind(path) == "bz2-streams"
  expected, report, _ = _read(path, 1 << 30)
  assert len(expected) == 250 and report["read"] == 250
  assert expected[0][0] == "Place 0 & co" and expected[3][3]
  assert expected[5][1] == 1 and expected[0][4].startswith("Place 0 is a")
  for split in (997, 4096, 20000):
    got, report, ranges = _read(path, split)
    assert got == expected, (kind, split)
    assert report["read"] == 250
    if kind != "gz":
      assert len(ranges) > 1


def test_single_stream_bz2_is_read_by_blocks(tmp_path):
  # Level 1: 100 kB blocks, so a 1 MB dump has several.
  rng = random.Random(0)
  pages = [wiki_dumps.page_xml(f"P{i}", wiki_dumps.filler(rng.randrange(10**6),
                                                        400), i)
           for i in range(700)]
  path = wiki_dumps.write_dump(str(tmp_path / "d.xml.bz2"), pages, "bz2")
  assert dumps.file_kind(path) == "bz2-blocks"
  with open(path, "rb") as f:
    blocks = list(bz2_units.iter_blocks(f, 0, path))
  assert len(blocks) > 3
  expected, _, _ = _read(path, 1 << 30)
  got, _, ranges = _read(path, 30000)
  assert len(ranges) > 5 and got == expected and len(got) == 700


def test_siteinfo_namespaces_and_pages_without_ns(tmp_path):
  names = {**wiki_dumps.NAMESPACES, 6: "Datei", 14: "Kategorie"}
  pages = [wiki_dumps.page_xml("Kategorie:Orte", "[[Kategorie:X]]", 1, 14,
                               with_ns=False),
           wiki_dumps.page_xml("Ort", "[[Datei:A.png|mini|Bild]]Der Ort liegt "
                               "am Fluss. " * 20, 2, with_ns=False)]
  path = wiki_dumps.write_dump(str(tmp_path / "dewiki.xml"), pages,
                               namespaces=names)
  assert dumps.namespaces(path)[6] == "Datei"
  shard = sources.SourceShard(0, "wikipedia",
                              dump=dumps.list_ranges([path], 1 << 20)[0])
  report = collections.Counter()
  docs = list(sources.iter_documents(shard, 10, report))
  assert report["dropped.namespace"] == 1 and len(docs) == 1
  assert docs[0][0][0] == "Der Ort liegt am Fluss."


def test_truncated_bz2_is_an_error_naming_the_file(tmp_path):
  pages = _pages(60)
  for kind in ("bz2", "multistream"):
    path = wiki_dumps.write_dump(str(tmp_path / f"{kind}-multistream.xml.bz2"),
                                 pages, kind, pages_per_stream=10)
    data = open(path, "rb").read()
    cut = str(tmp_path / f"cut-{kind}.xml.bz2")
    with open(cut, "wb") as f:
      f.write(data[:len(data) * 2 // 3])
    with pytest.raises(ValueError, match=f"{cut}: truncated"):
      _read(cut, 1 << 30)


def test_corrupt_bz2_is_an_error_naming_the_file(tmp_path):
  path = wiki_dumps.write_dump(str(tmp_path / "x-multistream.xml.bz2"),
                               _pages(60), "multistream", pages_per_stream=10)
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2:len(data) // 2 + 40] = b"\x00" * 40
  bad = str(tmp_path / "bad.xml.bz2")
  with open(bad, "wb") as f:
    f.write(bytes(data))
  with pytest.raises(ValueError, match=f"{bad}: (corrupt|truncated)"):
    _read(bad, 1 << 30)


def test_truncated_plain_xml_is_an_error(tmp_path):
  text = wiki_dumps.dump_xml(_pages(20))
  path = tmp_path / "cut.xml"
  path.write_text(text[:len(text) // 2])
  with pytest.raises(ValueError, match="cut.xml: truncated: the file ends "
                     "inside the page"):
    _read(str(path), 1 << 30)
  path.write_text(text[:text.rindex("</mediawiki>")])
  with pytest.raises(ValueError, match="no </mediawiki>.*Place 19"):
    _read(str(path), 1 << 30)


def test_malformed_page_and_page_without_text_are_counted_skips(
    tmp_path, caplog):
  pages = _pages(6)
  pages[1] = pages[1].replace("</title>", "</titel>")  # Malformed XML.
  pages[2] = wiki_dumps.page_xml("No text", None, 99)
  pages[4] = pages[4].replace("</page>", "")  # Never closed.
  path = wiki_dumps.write_dump(str(tmp_path / "bad.xml"), pages)
  with caplog.at_level(logging.WARNING):
    got, report, _ = _read(path, 1 << 30)
  assert [p[0] for p in got] == ["Place 0 & co", "Redirect 3", "Talk:Place 5"]
  assert report["read"] == 6
  assert report["dropped.malformed_xml"] == 2
  assert report["dropped.no_text"] == 1
  assert "bad.xml: page at byte" in caplog.text and "'No text'" in caplog.text
  assert "('Place 4 & co') skipped: malformed xml" in caplog.text


def test_block_scanner_finds_magics_at_every_bit():
  for shift in range(8):
    bits = bz2_units._BLOCK_MAGIC << (160 - 48 - (40 + shift))  # pylint: disable=protected-access
    buf = bits.to_bytes(20, "big")
    found = bz2_units._find_bits(buf, bz2_units._BLOCK_PATTERNS, 0, 160)  # pylint: disable=protected-access
    assert found == [40 + shift]


def test_a_range_starting_inside_a_block_begins_at_the_next_one(tmp_path):
  rng = random.Random(1)
  data = " ".join(str(rng.random()) for _ in range(60000)).encode()
  comp = bz2.compress(data, 1)
  whole = [d for _, d in bz2_units.iter_blocks(io.BytesIO(comp), 0, "x")]
  starts = [at for at, _ in bz2_units.iter_blocks(io.BytesIO(comp), 0, "x")]
  assert b"".join(whole) == data and len(starts) > 3
  later = list(bz2_units.iter_blocks(io.BytesIO(comp), starts[1] + 1, "x"))
  assert [at for at, _ in later] == starts[2:]


def test_a_file_that_is_not_a_dump_is_named(tmp_path):
  path = wiki_dumps.write_dump(str(tmp_path / "enwiki-multistream.xml.bz2"),
                               _pages(5), "multistream")
  index = str(tmp_path / "enwiki-multistream-index.txt.bz2")
  assert dumps.list_ranges([path], 1 << 20)
  with pytest.raises(ValueError, match="--input_file: .*-index.txt.bz2 is not "
                     "a MediaWiki XML dump"):
    dumps.list_ranges([path, index], 1 << 20)
