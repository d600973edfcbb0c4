"""Documents dealt into partitions at random, so "random next" spans the corpus.

The original script reads every document into memory, shuffles them and
draws the "random next" segment B from any document of the corpus. Creation
here never holds the corpus: it first deals every document into one of
`num_partitions` partitions by a 64-bit hash of (seed, document name), where
a document's name is (its file's place in the input, the byte offset of its
first line) (documents.iter_located_documents), and orders each partition by
that hash. The partitions are hash ranges, so a partition, and every chunk
of consecutive documents in it, is a uniformly random sample of the whole
corpus: B comes from a random other document of the whole input, wherever
its file, as in the original, and not from the neighbours of A's file.

Names do not depend on how the input is cut into shards (whole files or
byte ranges) nor on the number of workers, so neither does the output.
"""

import hashlib
import math
import struct
from typing import Iterator, Sequence

import numpy as np

from bertjax.create import documents

# A document's sort key: its hash, then its name (unique), big-endian.
DOC_KEY = struct.Struct(">QIQ")


def num_partitions(shards: Sequence[documents.InputShard],
                   partition_bytes: int) -> int:
  """Partitions of the input: one per `partition_bytes` of stored input, or
  one per shard of a tfds split (whose size is not known in advance)."""
  if shards and shards[0].input_format == "tfds":
    return len(shards)
  total = sum(s.size_bytes for s in shards)
  return max(1, math.ceil(total / partition_bytes))


def document_hash(seed: int, source: int, offset: int) -> int:
  """The 64-bit hash of a document's name that places it."""
  digest = hashlib.blake2b(struct.pack("<QQQ", seed, source, offset),
                           digest_size=8).digest()
  return int.from_bytes(digest, "big")


def read_shard(shard: documents.InputShard, seed: int, partitions: int,
               report, batch_docs: int = 4096
               ) -> Iterator[tuple[np.ndarray, np.ndarray, bytes, np.ndarray]]:
  """Yields (partition, DOC_KEY bytes, text, text lengths) per batch of
  documents; a document's text is its sentences joined by newlines."""
  parts, keys, texts = [], [], []
  for source, offset, doc, _ in documents.iter_located_documents(shard, report):
    h = document_hash(seed, source, offset)
    parts.append((h * partitions) >> 64)
    keys.append(DOC_KEY.pack(h, source, offset))
    texts.append("\n".join(doc).encode("utf-8"))
    if len(texts) == batch_docs:
      yield _batch(parts, keys, texts)
      parts, keys, texts = [], [], []
  if texts:
    yield _batch(parts, keys, texts)


def _batch(parts, keys, texts):
  return (np.asarray(parts, np.int64), np.asarray(keys, f"S{DOC_KEY.size}"),
          b"".join(texts), np.fromiter(map(len, texts), np.int64, len(texts)))


def documents_of(blob: bytes, lengths: np.ndarray) -> Iterator[list[str]]:
  """The documents (lists of sentences) of a block of texts."""
  text = blob.decode("utf-8")
  if len(text) == len(blob):  # ASCII: byte offsets are character offsets.
    pos = 0
    for n in lengths.tolist():
      yield text[pos:pos + n].split("\n")
      pos += n
    return
  pos = 0
  for n in lengths.tolist():
    yield blob[pos:pos + n].decode("utf-8").split("\n")
    pos += n
