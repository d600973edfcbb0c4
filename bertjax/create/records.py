"""tf.train.Example serialisation, TFRecord shards and record index files.

Records are `tf.train.Example` protos in the schema of `schema.FEATURES`,
encoded by hand (no TensorFlow needed to write them): the bytes equal
`tf.train.Example(...).SerializeToString(deterministic=True)` (features in
sorted name order), and tests check that `tf.io.parse_single_example` reads
them back identically.

Shard files are TFRecord files (uint64 length, masked crc32c of the length,
data, masked crc32c of the data). Beside each shard `<shard>.index` holds the
byte offset of every record's start in the shard as a raw little-endian int64
array (`np.fromfile(path, "<i8")`), one entry per record and nothing else, so
record i spans [offsets[i], offsets[i + 1]) (the last one runs to the end of
the file) and the number of records is `len(offsets)`.
"""

import os
import struct
from typing import Iterable, Sequence

import numpy as np

from bertjax.records import fileio
from bertjax.records import tfrecord

FEATURE_ORDER = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                 "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
_LEN = 2  # Protobuf wire type of length-delimited fields.


def varint(value: int) -> bytes:
  """Protobuf base-128 varint of a non-negative int."""
  out = bytearray()
  while value > 0x7F:
    out.append((value & 0x7F) | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  return bytes([(number << 3) | _LEN]) + varint(len(payload)) + payload


def shard_name(index: int, num_shards: int) -> str:
  return f"part-{index:05d}-of-{num_shards:05d}.tfrecord"


class ExampleEncoder:
  """Encodes instances as serialised `tf.train.Example` bytes, fast.

  Features are written in sorted name order, so the bytes equal
  `tf.train.Example(...).SerializeToString(deterministic=True)`. Every id is
  a table lookup of its varint bytes, and the headers of every feature are
  precomputed per payload length.
  """

  def __init__(self, max_seq_length: int, max_predictions_per_seq: int,
               vocab_size: int):
    self.max_seq_length = L = max_seq_length
    self.max_predictions_per_seq = P = max_predictions_per_seq
    self._table = [varint(i) for i in range(max(vocab_size, L, 2))]
    self._heads = {name: {} for name in FEATURE_ORDER}
    self._mask = [self._int_head("input_mask", L) + b"\x01" * n
                  + b"\x00" * (L - n) for n in range(L + 1)]
    one = struct.pack("<f", 1.0)
    self._weights = []
    for k in range(P + 1):
      payload = one * k + b"\x00\x00\x00\x00" * (P - k)
      key = _field(1, b"masked_lm_weights")
      self._weights.append(_field(1, key + _field(2, _field(2, _field(1, payload)))))
    self._labels = [self._int_head("next_sentence_labels", 1) + bytes([v])
                    for v in (0, 1)]
    self._segment_head = self._int_head("segment_ids", L)

  def _int_head(self, name: str, num_bytes: int) -> bytes:
    """Everything of an int64 feature's map entry before its payload."""
    heads = self._heads[name]
    head = heads.get(num_bytes)
    if head is None:
      marker = b"\xff" * num_bytes  # Stands in for the payload.
      entry = _field(1, _field(1, name.encode())
                     + _field(2, _field(3, _field(1, marker))))
      head = heads[num_bytes] = entry[:-num_bytes]
    return head

  def encode(self, input_ids: Sequence[int], num_a: int,
             masked_lm_positions: Sequence[int], masked_lm_ids: Sequence[int],
             is_random_next: bool) -> bytes:
    """Serialises one instance (unpadded ids, see instances.Instance)."""
    L, P, table = self.max_seq_length, self.max_predictions_per_seq, self._table
    n, k = len(input_ids), len(masked_lm_positions)
    if n > L or k > P:
      raise ValueError(f"instance of {n} tokens / {k} predictions exceeds "
                       f"max_seq_length={L} / max_predictions_per_seq={P}")
    lookup = table.__getitem__
    ids = b"".join(map(lookup, input_ids)) + b"\x00" * (L - n)
    pos = b"".join(map(lookup, masked_lm_positions)) + b"\x00" * (P - k)
    lab = b"".join(map(lookup, masked_lm_ids)) + b"\x00" * (P - k)
    head = self._int_head
    body = b"".join((
        head("input_ids", len(ids)), ids,
        self._mask[n],
        head("masked_lm_ids", len(lab)), lab,
        head("masked_lm_positions", len(pos)), pos,
        self._weights[k],
        self._labels[1 if is_random_next else 0],
        self._segment_head, b"\x00" * (num_a + 2), b"\x01" * (n - num_a - 2),
        b"\x00" * (L - n),
    ))
    size = len(body)
    return b"\n" + (table[size] if size < len(table) else varint(size)) + body

  def encode_instance(self, instance) -> bytes:
    return self.encode(instance.input_ids, instance.num_a,
                       instance.masked_lm_positions, instance.masked_lm_ids,
                       instance.is_random_next)


def _masked_crc(data: bytes) -> bytes:
  return struct.pack("<I", tfrecord.masked_crc32c(data))


def frame_header(length: int) -> bytes:
  """A TFRecord's first 12 bytes: the data's length and its masked crc32c."""
  packed = struct.pack("<Q", length)
  return packed + _masked_crc(packed)


def frame(data: bytes) -> bytes:
  """One TFRecord: length, its masked crc32c, the data, the data's crc."""
  return frame_header(len(data)) + data + _masked_crc(data)


def write_shard(path: str, records: Iterable[bytes]) -> int:
  """Writes a TFRecord shard and its index atomically (`FramedShardWriter`);
  returns the count. Local paths only (the Beam writer handles remote ones).
  """
  with FramedShardWriter(path) as writer:
    for data in records:
      rec = frame(data)
      writer.write(rec, np.asarray([len(rec)], np.int64))
  return writer.count


class FramedShardWriter:
  """Streams TFRecord frames into a shard and its index, atomically.

  Both are written under temporary names; on a clean exit the index and
  then the shard are renamed into place, so an existing shard file is always
  complete and has its index; on an error the temporaries are removed.
  Local paths only.
  """

  def __init__(self, path: str):
    self.path = path
    self.count = 0
    self._tmp = fileio.temporary_path(path)
    self._pos = 0

  def __enter__(self) -> "FramedShardWriter":
    self._data = open(self._tmp, "wb")  # pylint: disable=consider-using-with
    self._index = open(tfrecord.index_path(self._tmp), "wb")  # pylint: disable=consider-using-with
    return self

  def write(self, frames: bytes, lengths: np.ndarray) -> None:
    """Appends frames (back to back) of the given lengths."""
    ends = self._pos + np.cumsum(lengths, dtype=np.int64)
    self._index.write((ends - lengths).astype("<i8").tobytes())
    self._data.write(frames)
    self._pos = int(ends[-1]) if len(ends) else self._pos
    self.count += len(lengths)

  def __exit__(self, exc_type, *exc) -> None:
    self._data.close()
    self._index.close()
    if exc_type is not None:
      for tmp in (self._tmp, tfrecord.index_path(self._tmp)):
        if os.path.exists(tmp):
          os.remove(tmp)
      return
    os.replace(tfrecord.index_path(self._tmp), tfrecord.index_path(self.path))
    os.replace(self._tmp, self.path)


def shard_bytes(records: Iterable[bytes]) -> tuple[bytes, bytes]:
  """(TFRecord file bytes, index bytes) of `records`, for object stores."""
  parts, offsets, pos = [], [], 0
  for data in records:
    rec = frame(data)
    offsets.append(pos)
    parts.append(rec)
    pos += len(rec)
  return b"".join(parts), np.asarray(offsets, dtype="<i8").tobytes()
