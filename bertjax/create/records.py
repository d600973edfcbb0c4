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

import google_crc32c
import numpy as np

from bertjax.records import fileio
from bertjax.records import tfrecord
from bertjax.text.ragged import ranges as ragged_ranges

FEATURE_ORDER = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                 "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
_LEN = 2  # Protobuf wire type of length-delimited fields.
_ROWS_AT_ONCE = 1024  # Rows ExampleEncoder.frame_batch encodes together.


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
  `tf.train.Example(...).SerializeToString(deterministic=True)`. A batch of
  instances is encoded at once in numpy (frame_batch): the varints of all ids
  together, every feature's header precomputed per payload length, and the
  parts of every record gathered into one buffer.
  """

  def __init__(self, max_seq_length: int, max_predictions_per_seq: int):
    self.max_seq_length = L = max_seq_length
    self.max_predictions_per_seq = P = max_predictions_per_seq
    self._heads = {name: {} for name in FEATURE_ORDER}
    self._varint_words, self._varint_num = _varint_table(1 << 14)
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
    frames, _ = self.frame_rows([(input_ids, num_a, masked_lm_positions, masked_lm_ids,
                                  is_random_next)])
    return frames[tfrecord.HEADER_BYTES:-tfrecord.FOOTER_BYTES]

  def encode_instance(self, instance) -> bytes:
    return self.encode(instance.input_ids, instance.num_a,
                       instance.masked_lm_positions, instance.masked_lm_ids,
                       instance.is_random_next)

  def frame_rows(self, rows) -> tuple[bytes, np.ndarray]:
    """frame_batch of (input ids, num_a, positions, labels, is_random_next)
    rows, unpadded (instances.Instance's fields)."""
    return self.frame_batch(*self.pad_rows(rows))

  def pad_rows(self, rows) -> tuple[np.ndarray, ...]:
    """frame_batch's arguments of (input ids, num_a, positions, labels,
    is_random_next) rows, unpadded (instances.Instance's fields)."""
    L, P, B = self.max_seq_length, self.max_predictions_per_seq, len(rows)
    ids, pos, lab = (np.zeros((B, L), np.int64), np.zeros((B, P), np.int64),
                     np.zeros((B, P), np.int64))
    lengths, num_a, num_pred, random_next = (np.zeros(B, np.int64) for _ in range(4))
    for i, (row_ids, a, row_pos, row_lab, r) in enumerate(rows):
      n, k = len(row_ids), len(row_pos)
      if n > L or k > P:
        raise ValueError(f"instance of {n} tokens / {k} predictions exceeds "
                         f"max_seq_length={L} / max_predictions_per_seq={P}")
      ids[i, :n], pos[i, :k], lab[i, :k] = row_ids, row_pos, row_lab
      lengths[i], num_a[i], num_pred[i], random_next[i] = n, a, k, r
    return ids, lengths, num_a, pos, lab, num_pred, random_next

  def frame_batch(self, ids_BxL: np.ndarray, lengths_B: np.ndarray, num_a_B: np.ndarray,
                  positions_BxP: np.ndarray, labels_BxP: np.ndarray,
                  num_predictions_B: np.ndarray, is_random_next_B: np.ndarray
                  ) -> tuple[bytes, np.ndarray]:
    """(TFRecord frames back to back, frame lengths) of B instances, in numpy.

    Rows are zero-padded as instance_batches.MaskedBatch holds them (ids past
    lengths_B and prediction slots past num_predictions_B are 0); each
    frame's data is `encode`'s bytes for the row.
    """
    L, P = self.max_seq_length, self.max_predictions_per_seq
    B = len(lengths_B)
    if ids_BxL.shape != (B, L) or positions_BxP.shape != (B, P):
      raise ValueError(f"rows of {ids_BxL.shape[1:]} tokens / {positions_BxP.shape[1:]} "
                       f"predictions; the encoder's are max_seq_length={L} / "
                       f"max_predictions_per_seq={P}")
    if B > _ROWS_AT_ONCE:  # Bounds the memory of the per-byte arrays.
      rows = [(a, a + _ROWS_AT_ONCE) for a in range(0, B, _ROWS_AT_ONCE)]
      frames, lengths = zip(*(self.frame_batch(*(x[a:b] for x in (
          ids_BxL, lengths_B, num_a_B, positions_BxP, labels_BxP,
          num_predictions_B, is_random_next_B))) for a, b in rows))
      return b"".join(frames), np.concatenate(lengths)
    n, a = np.asarray(lengths_B, np.int64), np.asarray(num_a_B, np.int64)
    k = np.asarray(num_predictions_B, np.int64)
    ids, ids_n = self._varints(ids_BxL)
    lab, lab_n = self._varints(labels_BxP)
    pos, pos_n = self._varints(positions_BxP)
    cols = np.arange(L)
    segments = ((cols >= a[:, None] + 2) & (cols < n[:, None])).astype(np.uint8)
    body = [
        self._head_part("input_ids", ids_n), _ragged_part(ids, ids_n),
        _table_part(self._mask, n),
        self._head_part("masked_lm_ids", lab_n), _ragged_part(lab, lab_n),
        self._head_part("masked_lm_positions", pos_n), _ragged_part(pos, pos_n),
        _table_part(self._weights, k),
        _table_part(self._labels, np.asarray(is_random_next_B, np.int64)),
        _table_part([self._segment_head], np.zeros(B, np.int64)),
        _ragged_part(segments.ravel(), np.full(B, L)),
    ]
    size = sum(part[2] for part in body)
    prefix = _lookup_part(lambda v: b"\n" + varint(v), size)
    data_n = size + prefix[2]
    header = _lookup_part(frame_header, data_n)
    footer = (np.zeros(tfrecord.FOOTER_BYTES, np.uint8), np.zeros(B, np.int64),
              np.full(B, tfrecord.FOOTER_BYTES))
    out, starts = _concat_rows([header, prefix, *body, footer])
    frame_n = data_n + tfrecord.FRAME_OVERHEAD
    data_start = starts + tfrecord.HEADER_BYTES
    data = out.tobytes()
    crcs = tfrecord.mask_crc32c(np.fromiter(
        (google_crc32c.value(data[s:s + m]) for s, m in
         zip(data_start.tolist(), data_n.tolist())), np.uint32, B))
    out[ragged_ranges(data_start + data_n, np.full(B, tfrecord.FOOTER_BYTES))] = (
        crcs.astype("<u4").view(np.uint8))
    return out.tobytes(), frame_n

  def _varints(self, values_BxM: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(protobuf varints of every value, row-major, back to back; bytes per
    row) of non-negative ints below 2**28, by table lookup."""
    values = np.asarray(values_BxM)
    top = int(values.max(initial=0))
    if top >= len(self._varint_num):
      self._varint_words, self._varint_num = _varint_table(
          min(max(2 * top, 1 << 14), max(top + 1, 1 << 28)))
    num = np.take(self._varint_num, values)  # np.take: see _concat_rows.
    words = np.take(self._varint_words, values.ravel())
    ends = np.cumsum(num, dtype=np.int64)
    starts = ends - num.ravel()
    out = np.empty(int(ends[-1]) if len(ends) else 0, np.uint8)
    out[starts] = words.astype(np.uint8)
    # Byte k of the values that have one, k = 1, 2, 3.
    for k in range(1, 4):
      longer = np.flatnonzero(num.ravel() > k)
      if not len(longer):
        break
      out[starts[longer] + k] = (words[longer] >> (8 * k)).astype(np.uint8)
    return out, num.sum(-1, dtype=np.int64)

  def _head_part(self, name: str, num_bytes_B: np.ndarray):
    return _lookup_part(lambda v: self._int_head(name, v), num_bytes_B)


def _varint_table(size: int) -> tuple[np.ndarray, np.ndarray]:
  """(varint bytes of 0..size-1, zero-padded to 4 and read as little-endian
  uint32 words; bytes of each). Values of 2**28 and up take 5 bytes: refused."""
  if size > 1 << 28:
    raise ValueError(f"ids up to {size - 1}: the encoder takes ids below 2**28")
  v = np.arange(size, dtype=np.int64)
  num = 1 + (v >= 1 << 7) + (v >= 1 << 14) + (v >= 1 << 21)
  byte = np.arange(4)
  out = ((v[:, None] >> (7 * byte)) & 0x7F) | np.where(byte < num[:, None] - 1, 0x80, 0)
  out = np.where(byte < num[:, None], out, 0).astype(np.uint8)
  return out.view("<u4").ravel(), num.astype(np.uint8)


def _ragged_part(flat: np.ndarray, counts_B: np.ndarray):
  """A part of every row: rows' bytes back to back in `flat`, counts_B per row."""
  counts = np.asarray(counts_B, np.int64)
  return flat, np.cumsum(counts) - counts, counts


def _table_part(items: Sequence[bytes], index_B: np.ndarray):
  """A part of every row: items[index_B[b]] for row b."""
  sizes = np.fromiter(map(len, items), np.int64, len(items))
  return (np.frombuffer(b"".join(items), np.uint8), (np.cumsum(sizes) - sizes)[index_B],
          sizes[index_B])


def _lookup_part(make, values_B: np.ndarray):
  """A part of every row: make(values_B[b]), made once per distinct value."""
  distinct, index = np.unique(values_B, return_inverse=True)
  return _table_part([make(int(v)) for v in distinct], index.reshape(-1))


def _concat_rows(parts) -> tuple[np.ndarray, np.ndarray]:
  """(every row's parts in order, rows back to back; where each row starts).
  A part is (flat uint8 source, start per row, count per row).

  One gather from all sources joined: the output's byte i is the source byte
  its segment (row, part) starts at plus i's place in the segment.
  """
  sources = [p[0] for p in parts]
  base = np.cumsum([0] + [len(src) for src in sources[:-1]])
  src_BxS = np.stack([p[1] + b for p, b in zip(parts, base)], axis=1).ravel()
  counts_BxS = np.stack([p[2] for p in parts], axis=1).ravel()
  ends = np.cumsum(counts_BxS)
  starts = ends - counts_BxS
  index = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int32)
  index += np.repeat((src_BxS - starts).astype(np.int32), counts_BxS)
  # np.take, not [index]: numpy's fancy indexing takes an int32 index
  # through a slower path (about 3x slower here).
  return np.take(np.concatenate(sources), index), starts[::len(parts)]


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
