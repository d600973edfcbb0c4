"""The documents of the input: formats, shards and chunks.

Input formats:
  sentences  one sentence per line, blank lines between documents (the format
             of the original BERT release's create_pretraining_data.py)
  documents  raw text, blank lines between documents, split into sentences
  directory  one document per file, split into sentences
  tfds       a TensorFlow Datasets split, one document per example

An input is cut into `InputShard`s (a file, a byte range of a large file, a
group of small files, or an even part of a tfds split), the unit of work of
reading; every document is named by its place in the input
(`iter_located_documents`), whatever the shards. Documents are later taken
in chunks of a bounded size (`iter_chunks`), the scope of the "random next"
segment. Files are read through the file layer (fileio: local, gs://,
.gz); invalid UTF-8 is replaced and counted in the report.
"""

import collections
import dataclasses
from typing import Any, Iterable, Iterator, Optional

from bertjax.records import fileio
from bertjax.text import corpus

INPUT_FORMATS = ("sentences", "documents", "directory", "tfds")


@dataclasses.dataclass(frozen=True)
class InputShard:
  """One map task's input: files (read in order) or a slice of a tfds split."""
  index: int
  input_format: str
  paths: tuple[str, ...] = ()
  size_bytes: int = 0
  tfds_name: str = ""
  tfds_split: str = ""
  tfds_feature: str = "text"
  # (index, count): this shard is part `index` of tfds.even_splits(split,
  # count). tfds parses no string form of such a part, so it is rebuilt.
  tfds_part: tuple[int, int] = (0, 1)
  # The place of paths[0] among all input files (the rest follow it).
  first_file: int = 0
  # (start, end): only the documents of this byte range of the one file
  # (see _blocks); empty for whole files.
  byte_range: tuple[int, ...] = ()

  def describe(self) -> dict[str, Any]:
    if self.input_format == "tfds":
      return {"tfds": self.tfds_name, "split": self.tfds_split,
              "part": list(self.tfds_part), "feature": self.tfds_feature}
    return {"format": self.input_format, "paths": list(self.paths),
            "bytes": self.size_bytes, "first_file": self.first_file,
            "byte_range": list(self.byte_range)}


def list_input_shards(input_file: str, input_format: str = "sentences",
                      files_per_shard: int = 256, tfds_name: str = "",
                      tfds_split: str = "train", tfds_feature: str = "text",
                      num_tfds_shards: int = 64,
                      split_bytes: int = 64 << 20) -> list[InputShard]:
  """The input shards for `--input_file` (comma-separated globs).

  Each file is one shard, except for "directory" input (a file per document)
  where shards are groups of `files_per_shard` files, "tfds" input where
  the split is cut into `num_tfds_shards` even parts, and uncompressed files
  over `split_bytes`, which are cut into byte ranges of that size (each
  range holds the documents that begin in it, see _blocks), so that one
  large file is read by several workers.
  """
  if input_format not in INPUT_FORMATS:
    raise ValueError(f"--input_format={input_format}: must be one of "
                     f"{', '.join(INPUT_FORMATS)}.")
  if input_format == "tfds":
    if not tfds_name:
      raise ValueError("--input_format=tfds needs --tfds_name.")
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    splits = tfds.even_splits(tfds_split, n=num_tfds_shards)
    return [InputShard(i, "tfds", tfds_name=tfds_name, tfds_split=tfds_split,
                       tfds_feature=tfds_feature,
                       tfds_part=(i, len(splits)))
            for i in range(len(splits))]
  # For "directory" input, every file under the given directories.
  files = fileio.expand(input_file, "--input_file",
                        directories=input_format == "directory")
  if split_bytes < 1:
    raise ValueError(f"--split_bytes={split_bytes}: must be at least 1.")
  sizes = [fileio.size(p) for p in files]
  if input_format == "directory":
    return [InputShard(n, input_format, tuple(files[i:i + files_per_shard]),
                       sum(sizes[i:i + files_per_shard]), first_file=i)
            for n, i in enumerate(range(0, len(files), files_per_shard))]
  shards = []
  for i, (path, size) in enumerate(zip(files, sizes)):
    if size <= split_bytes or path.endswith(".gz"):
      ranges = [()]
    else:
      ranges = [(a, min(a + split_bytes, size))
                for a in range(0, size, split_bytes)]
    for r in ranges:
      shards.append(InputShard(len(shards), input_format, (path,),
                               r[1] - r[0] if r else size, first_file=i,
                               byte_range=r))
  return shards


def describe_source(input_format: str, input_file: str = "",
                    tfds_name: str = "", tfds_split: str = "") -> str:
  """The metadata's `source` string."""
  if input_format == "tfds":
    return f"tfds:{tfds_name}/{tfds_split}"
  return f"{input_format}:{input_file}"


def iter_documents(shard: InputShard, report: collections.Counter
                   ) -> Iterator[tuple[list[str], int]]:
  """Yields (document as sentences, input bytes read so far).

  "sentences" is the original format: one sentence per line, blank lines
  between documents (the end of a file also ends a document). The other
  formats hold raw text that is split into sentences (corpus.py).
  """
  for _, _, doc, bytes_read in iter_located_documents(shard, report):
    yield doc, bytes_read


def iter_located_documents(shard: InputShard, report: collections.Counter
                           ) -> Iterator[tuple[int, int, list[str], int]]:
  """Yields (source, offset, document as sentences, input bytes read so far).

  (source, offset) names a document whatever the shards: source is the
  file's place in the whole input (or the tfds part) and offset where the
  document's first line starts in the (decompressed) file (or its number in
  the tfds part).
  """
  if shard.input_format == "tfds":
    for doc, n in _iter_tfds_documents(shard, report):
      yield shard.tfds_part[0], n, doc, n
    return
  done = 0
  for i, path in enumerate(shard.paths):
    source = shard.first_file + i
    if shard.input_format == "directory":  # The whole file: one document.
      with _open(path) as f:
        data = f.read()
        done += f.stored_bytes_read
      if not data:
        report["empty_input_files"] += 1
      sentences = _text_document(data, report)
      if sentences:
        yield source, 0, sentences, done
      continue
    read = 0
    for offset, block, read in _file_blocks(path, shard.byte_range, report):
      if shard.input_format == "documents":
        block = _split_document(block, report)
      yield source, offset, block, done + read
    done += read


def _open(path: str, stored: bool = False):
  """A reader of an input file: decompressed (fileio.open_read), or with
  `stored` the bytes as stored, for reads of byte ranges."""
  try:
    return fileio.open_binary(path) if stored else fileio.open_read(path)
  except OSError as e:
    raise ValueError(f"--input_file: cannot read {path}: {e}") from e


def _file_blocks(path: str, byte_range: tuple[int, ...], report
                 ) -> Iterator[tuple[int, list[str], int]]:
  """(offset, lines, stored bytes read) of a file's or a byte range's blocks."""
  if not byte_range:
    with _open(path) as f:
      for offset, block in _blocks(iter(f), 0, None, report):
        yield offset, block, f.stored_bytes_read
      if f.stored_bytes_read == 0:
        report["empty_input_files"] += 1
    return
  start, end = byte_range
  with _open(path, stored=True) as f:
    blank, pos = _first_blank_line(f, start)
    if blank < end:  # Else the documents after it are the next range's.
      for offset, block in _blocks(iter(f.readline, b""), pos, end, report):
        yield offset, block, f.tell() - start


def _first_blank_line(f, start: int) -> tuple[int, int]:
  """(where it starts, where the next line starts) of the first blank line
  that starts at or after `start`, the file left at the latter; (0, 0) for
  start 0, and the file's size twice if there is none."""
  if start == 0:
    return 0, 0
  f.seek(start - 1)
  pos = start - 1 + len(f.readline())  # The first line start >= start.
  for line in iter(f.readline, b""):
    if not line.decode("utf-8", errors="replace").strip():
      return pos, pos + len(line)
    pos += len(line)
  return pos, pos


def _blocks(lines: Iterator[bytes], pos: int, end: Optional[int], report
            ) -> Iterator[tuple[int, list[str]]]:
  """(offset, stripped lines) of the blocks between blank lines, from
  position `pos`, up to the first blank line starting at or after `end`.

  A byte range [start, end) of a file thus holds the blocks after the first
  blank line starting in it (_first_blank_line; none if there is none) up to
  the first one at or after `end`: consecutive ranges read every line once
  and give the blocks of the file read whole.
  """
  block, block_start = [], pos
  for line in lines:
    line_start, pos = pos, pos + len(line)
    report["lines"] += 1
    text = corpus.decode_line(line, report).strip()
    if text:
      if not block:
        block_start = line_start
      block.append(text)
      continue
    if block:
      yield block_start, block
      block = []
    if end is not None and line_start >= end:
      return
  if block:
    yield block_start, block


def _decode_text(data: bytes, report) -> str:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    text = data.decode("utf-8", errors="replace")
    report["invalid_utf8_lines_repaired"] += sum(
        1 for line in text.splitlines() if "\ufffd" in line)
    return text


def _text_document(data: bytes, report) -> list[str]:
  """Sentences of a document given as raw text, one paragraph a line."""
  paragraphs = [p.strip() for p in _decode_text(data, report).splitlines()]
  return _split_document([p for p in paragraphs if p], report)


def _split_document(paragraphs: list[str], report) -> list[str]:
  """Sentences of a document given as paragraphs of raw text."""
  sentences = []
  for p in paragraphs:
    sentences.extend(corpus.split_sentences(p))
  return sentences


def _iter_tfds_documents(shard: InputShard, report
                         ) -> Iterator[tuple[list[str], int]]:
  """Documents of a tfds split slice; the feature holds a document's text."""
  n = 0
  for example in corpus.tfds_examples(shard.tfds_name, shard.tfds_split,
                                      shard.tfds_part):
    if shard.tfds_feature not in example:
      raise ValueError(f"--tfds_feature={shard.tfds_feature}: not in "
                       f"{shard.tfds_name} (has {sorted(example)}).")
    n += 1
    sentences = _text_document(example[shard.tfds_feature], report)
    if sentences:
      yield sentences, n
    else:
      report["empty_documents_skipped"] += 1


def iter_chunks(docs: Iterable[list[str]], docs_per_chunk: int,
                chunk_chars: int) -> Iterator[list[list[str]]]:
  """Groups documents into chunks.

  A chunk ends after `docs_per_chunk` documents or about `chunk_chars`
  characters; a remainder smaller than half of that joins the chunk before it,
  so no chunk but a partition's only one is tiny.
  """
  buf, chars = [], 0
  for doc in docs:
    buf.append(doc)
    chars += sum(map(len, doc))
    if len(buf) * 2 >= docs_per_chunk * 3 or chars * 2 >= chunk_chars * 3:
      n, c = 0, 0
      while n < len(buf) and n < docs_per_chunk and c < chunk_chars:
        c += sum(map(len, buf[n]))
        n += 1
      yield buf[:n]
      buf, chars = buf[n:], chars - c
  if buf:
    yield buf
