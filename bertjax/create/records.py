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
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from bertjax.records import tfrecord

INDEX_SUFFIX = ".index"
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


def index_path(shard_path: str) -> str:
  return shard_path + INDEX_SUFFIX


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


def features_of(input_ids, num_a, masked_lm_positions, masked_lm_ids,
                is_random_next, max_seq_length, max_predictions_per_seq
                ) -> dict[str, list]:
  """The padded feature lists of one instance (the original's layout)."""
  n, k = len(input_ids), len(masked_lm_positions)
  pad_l, pad_p = max_seq_length - n, max_predictions_per_seq - k
  return {
      "input_ids": list(input_ids) + [0] * pad_l,
      "input_mask": [1] * n + [0] * pad_l,
      "segment_ids": [0] * (num_a + 2) + [1] * (n - num_a - 2) + [0] * pad_l,
      "masked_lm_positions": list(masked_lm_positions) + [0] * pad_p,
      "masked_lm_ids": list(masked_lm_ids) + [0] * pad_p,
      "masked_lm_weights": [1.0] * k + [0.0] * pad_p,
      "next_sentence_labels": [1 if is_random_next else 0],
  }


def tf_example_bytes(features: dict[str, list]) -> bytes:
  """The same record built with TensorFlow's proto classes (for checks)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  feature = {}
  for name in FEATURE_ORDER:
    values = features[name]
    if name == "masked_lm_weights":
      feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    else:
      feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString(deterministic=True)


def decode_example(data: bytes) -> dict[str, np.ndarray]:
  """Parses a serialised Example of int64/float lists into numpy arrays.

  A small protobuf reader for tools and tests that run without TensorFlow.
  """
  def read_varint(buf, pos):
    result = shift = 0
    while True:
      b = buf[pos]
      pos += 1
      result |= (b & 0x7F) << shift
      if b < 0x80:
        return result, pos
      shift += 7

  def fields(buf):
    pos = 0
    while pos < len(buf):
      tag, pos = read_varint(buf, pos)
      if tag & 7 != _LEN:
        raise ValueError(f"unexpected wire type {tag & 7} in Example")
      size, pos = read_varint(buf, pos)
      yield tag >> 3, buf[pos:pos + size]
      pos += size

  out = {}
  (_, features), = fields(data)
  for _, entry in fields(features):
    parts = dict(fields(entry))
    name = parts[1].decode()
    (kind, lst), = fields(parts[2])
    payload = b"".join(v for _, v in fields(lst))
    if kind == 2:
      out[name] = np.frombuffer(payload, "<f4").copy()
    elif kind == 3:
      values, pos = [], 0
      while pos < len(payload):
        v, pos = read_varint(payload, pos)
        values.append(v - (1 << 64) if v >= 1 << 63 else v)
      out[name] = np.asarray(values, np.int64)
    else:
      raise ValueError(f"feature {name}: bytes lists are not in the schema")
  return out


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
  """Writes a TFRecord shard and its index atomically; returns the count.

  Both are written under temporary names and renamed, the index first and
  the shard last, so an existing shard file is always complete and has its
  index. Local paths only (the Beam writer handles remote ones).
  """
  tmp = f"{path}.tmp-{os.getpid()}"
  offsets = []
  pos = 0
  with open(tmp, "wb") as f:
    for data in records:
      offsets.append(pos)
      rec = frame(data)
      f.write(rec)
      pos += len(rec)
  index = np.asarray(offsets, dtype="<i8")
  with open(tmp + INDEX_SUFFIX, "wb") as f:
    f.write(index.tobytes())
  os.replace(tmp + INDEX_SUFFIX, index_path(path))
  os.replace(tmp, path)
  return len(offsets)


class FramedShardWriter:
  """Streams TFRecord frames into a shard and its index, atomically.

  Both are written under temporary names; on a clean exit the index and
  then the shard are renamed into place (as `write_shard`), on an error the
  temporaries are removed. Local paths only.
  """

  def __init__(self, path: str):
    self.path = path
    self.count = 0
    self._tmp = f"{path}.tmp-{os.getpid()}"
    self._pos = 0

  def __enter__(self) -> "FramedShardWriter":
    self._data = open(self._tmp, "wb")  # pylint: disable=consider-using-with
    self._index = open(self._tmp + INDEX_SUFFIX, "wb")  # pylint: disable=consider-using-with
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
      for tmp in (self._tmp, self._tmp + INDEX_SUFFIX):
        if os.path.exists(tmp):
          os.remove(tmp)
      return
    os.replace(self._tmp + INDEX_SUFFIX, index_path(self.path))
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


def read_index(shard_path: str) -> np.ndarray:
  """The record offsets of a shard from its `.index` file."""
  return np.fromfile(index_path(shard_path), dtype="<i8")


def read_record_at(f, offset: int, verify: bool = True) -> bytes:
  """Reads the record starting at `offset` of an open binary file."""
  f.seek(offset)
  head = f.read(12)
  if len(head) != 12:
    raise ValueError(f"{getattr(f, 'name', '?')}: truncated record at {offset}")
  (length,) = struct.unpack("<Q", head[:8])
  data = f.read(length)
  tail = f.read(4)
  if len(data) != length or len(tail) != 4:
    raise ValueError(f"{getattr(f, 'name', '?')}: truncated record at {offset}")
  if verify and (_masked_crc(head[:8]) != head[8:] or _masked_crc(data) != tail):
    raise ValueError(f"{getattr(f, 'name', '?')}: crc mismatch at {offset}")
  return data


def iter_records(path: str, verify: bool = True) -> Iterator[bytes]:
  """Yields the data of every record of a local TFRecord file."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    pos = 0
    while pos < size:
      data = read_record_at(f, pos, verify)
      yield data
      pos += len(data) + 16


def check_index(shard_path: str, expected: Optional[int] = None) -> int:
  """Checks that a shard's index matches its records; returns the count."""
  offsets = read_index(shard_path)
  actual = []
  size = os.path.getsize(shard_path)
  with open(shard_path, "rb") as f:
    pos = 0
    while pos < size:
      actual.append(pos)
      f.seek(pos)
      (length,) = struct.unpack("<Q", f.read(8))
      pos += length + 16
  if list(offsets) != actual:
    raise ValueError(f"{index_path(shard_path)} does not match {shard_path}")
  if expected is not None and len(actual) != expected:
    raise ValueError(f"{shard_path}: {len(actual)} records, expected {expected}")
  return len(actual)
