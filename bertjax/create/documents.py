"""The documents of the input: formats, shards and chunks.

Input formats:
  sentences  one sentence per line, blank lines between documents (the format
             of the original BERT release's create_pretraining_data.py)
  documents  raw text, blank lines between documents, split into sentences
  directory  one document per file, split into sentences
  tfds       a TensorFlow Datasets split, one document per example

An input is cut into `InputShard`s (a file, a group of small files, or an
even part of a tfds split), the unit of work of data creation; a shard's
documents come in chunks of a bounded size (`iter_chunks`), the scope of the
"random next" segment. Files are read through corpus.py (local, gs://, .gz);
invalid UTF-8 is replaced and counted in the report.
"""

import collections
import dataclasses
from typing import Any, Iterator

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

  def describe(self) -> dict[str, Any]:
    if self.input_format == "tfds":
      return {"tfds": self.tfds_name, "split": self.tfds_split,
              "part": list(self.tfds_part), "feature": self.tfds_feature}
    return {"format": self.input_format, "paths": list(self.paths),
            "bytes": self.size_bytes}


def list_input_shards(input_file: str, input_format: str = "sentences",
                      files_per_shard: int = 256, tfds_name: str = "",
                      tfds_split: str = "train", tfds_feature: str = "text",
                      num_tfds_shards: int = 64) -> list[InputShard]:
  """The input shards for `--input_file` (comma-separated globs).

  Each file is one shard, except for "directory" input (a file per document)
  where shards are groups of `files_per_shard` files, and "tfds" input where
  the split is cut into `num_tfds_shards` even parts.
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
  if not input_file:
    raise ValueError("--input_file is required (comma-separated file globs).")
  files = []
  for pattern in input_file.split(","):
    pattern = pattern.strip()
    if not pattern:
      continue
    if input_format == "directory":
      if not corpus.is_directory(pattern):
        raise ValueError(f"--input_file: {pattern} is not a directory "
                         "(--input_format=directory reads every file under "
                         "the given directories).")
      found = corpus.list_directory_files(pattern)
    else:
      found = corpus.glob_files(pattern)
    if not found:
      raise ValueError(f"--input_file: {pattern!r} matches no files.")
    for path in found:
      if not corpus.is_readable(path):
        raise ValueError(f"--input_file: {path} is not readable.")
    files.extend(found)
  files = list(dict.fromkeys(files))
  if input_format == "directory":
    groups = [files[i:i + files_per_shard]
              for i in range(0, len(files), files_per_shard)]
  else:
    groups = [[f] for f in files]
  return [InputShard(i, input_format, tuple(g),
                     sum(corpus.file_size(p) for p in g))
          for i, g in enumerate(groups)]


def describe_source(input_format: str, input_file: str = "",
                    tfds_name: str = "", tfds_split: str = "") -> str:
  """The metadata's `source` string."""
  if input_format == "tfds":
    return f"tfds:{tfds_name}/{tfds_split}"
  return f"{input_format}:{input_file}"


def _decode(line: bytes, report) -> str:
  try:
    return line.decode("utf-8")
  except UnicodeDecodeError:
    report["invalid_utf8_lines_repaired"] += 1
    return line.decode("utf-8", errors="replace")


def iter_documents(shard: InputShard, report: collections.Counter
                   ) -> Iterator[tuple[list[str], int]]:
  """Yields (document as sentences, input bytes read so far).

  "sentences" is the original format: one sentence per line, blank lines
  between documents (the end of a file also ends a document). The other
  formats hold raw text that is split into sentences (corpus.py).
  """
  if shard.input_format == "tfds":
    yield from _iter_tfds_documents(shard, report)
    return
  done = 0
  for path in shard.paths:
    try:
      f = corpus.InputFile(path)
    except OSError as e:
      raise ValueError(f"--input_file: cannot read {path}: {e}") from e
    with f:
      start, nbytes = done, 0
      if shard.input_format in ("sentences", "documents"):
        # Blocks of lines between blank lines: a document's sentences, or
        # its paragraphs of raw text to split into sentences.
        finish = ((lambda block: block) if shard.input_format == "sentences"
                  else (lambda block: _split_document(block, report)))
        block = []
        for line in f:
          nbytes += len(line)
          report["lines"] += 1
          text = _decode(line, report).strip()
          if text:
            block.append(text)
          elif block:
            yield finish(block), start + f.stored_bytes_read
            block = []
        if block:
          yield finish(block), start + f.stored_bytes_read
      else:  # directory: the whole file is one document.
        data = f.read()
        nbytes = len(data)
        paragraphs = [p.strip() for p in _decode_text(data, report).splitlines()]
        paragraphs = [p for p in paragraphs if p]
        if paragraphs:
          yield (_split_document(paragraphs, report),
                 start + f.stored_bytes_read)
      done = start + f.stored_bytes_read
    if nbytes == 0:
      report["empty_input_files"] += 1


def _decode_text(data: bytes, report) -> str:
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    text = data.decode("utf-8", errors="replace")
    report["invalid_utf8_lines_repaired"] += sum(
        1 for line in text.splitlines() if "\ufffd" in line)
    return text


def _split_document(paragraphs: list[str], report) -> list[str]:
  """Sentences of a document given as paragraphs of raw text."""
  sentences = []
  for p in paragraphs:
    sentences.extend(corpus.split_sentences(p))
  return sentences


def _iter_tfds_documents(shard: InputShard, report
                         ) -> Iterator[tuple[list[str], int]]:
  """Documents of a tfds split slice; the feature holds a document's text."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    index, count = shard.tfds_part
    split = tfds.even_splits(shard.tfds_split, n=count)[index]
    ds = tfds.load(shard.tfds_name, split=split, shuffle_files=False)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"--tfds_name={shard.tfds_name} --tfds_split="
                     f"{shard.tfds_split}: cannot load ({e}); prepare it with "
                     "`tfds build` first.") from e
  n = 0
  for example in tfds.as_numpy(ds):
    if shard.tfds_feature not in example:
      raise ValueError(f"--tfds_feature={shard.tfds_feature}: not in "
                       f"{shard.tfds_name} (has {sorted(example)}).")
    n += 1
    text = _decode_text(example[shard.tfds_feature], report)
    paragraphs = [p.strip() for p in text.splitlines() if p.strip()]
    if paragraphs:
      yield _split_document(paragraphs, report), n
    else:
      report["empty_documents_skipped"] += 1


def iter_chunks(shard: InputShard, docs_per_chunk: int, chunk_chars: int,
                report: collections.Counter
                ) -> Iterator[tuple[list[list[str]], int]]:
  """Yields (documents, input bytes read so far) in chunks.

  A chunk ends after `docs_per_chunk` documents or about `chunk_chars`
  characters; a remainder smaller than half of that joins the chunk before it,
  so no chunk but a shard's only one is tiny.
  """
  buf, chars, bytes_read = [], 0, 0
  for doc, bytes_read in iter_documents(shard, report):
    buf.append(doc)
    chars += sum(map(len, doc))
    if len(buf) * 2 >= docs_per_chunk * 3 or chars * 2 >= chunk_chars * 3:
      n, c = 0, 0
      while n < len(buf) and n < docs_per_chunk and c < chunk_chars:
        c += sum(map(len, buf[n]))
        n += 1
      yield buf[:n], bytes_read
      buf, chars = buf[n:], chars - c
  if buf:
    yield buf, bytes_read

