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

import concurrent.futures
import functools
import os
import struct
import threading
from typing import Iterable, Sequence

import google_crc32c
import numpy as np

from bertjax.records import fileio
from bertjax.records import tfrecord

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
  instances is encoded at once in numpy (frame_batch): each row is laid out
  in a byte grid of fixed-width slots (the varints of every id, looked up in
  a table; every feature's header, looked up by payload length) with a mask
  of the bytes in use, and one `np.compress` of the grid gives the frames
  back to back.
  """

  def __init__(self, max_seq_length: int, max_predictions_per_seq: int,
               threads: int = 1):
    """`threads` > 1: frame_batch encodes batches of more than
    _ROWS_AT_ONCE rows a block of rows per thread (numpy releases Python's
    global lock in most of the work), each thread with its own encoder."""
    self.max_seq_length = L = max_seq_length
    self.max_predictions_per_seq = P = max_predictions_per_seq
    self._pool, self._local = None, None
    if threads > 1:
      self._pool = concurrent.futures.ThreadPoolExecutor(threads)
      self._local = threading.local()
    self._varint_words, self._varint_num = _varint_table(1 << 14)
    self._heads = {name: _Table(functools.partial(self._int_head, name))
                   for name in ("input_ids", "masked_lm_ids", "masked_lm_positions")}
    self._headers = _Table(frame_header)
    self._mask = _fixed([self._int_head("input_mask", L) + b"\x01" * n
                         + b"\x00" * (L - n) for n in range(L + 1)])
    one = struct.pack("<f", 1.0)
    weights = []
    for k in range(P + 1):
      payload = one * k + b"\x00\x00\x00\x00" * (P - k)
      key = _field(1, b"masked_lm_weights")
      weights.append(_field(1, key + _field(2, _field(2, _field(1, payload)))))
    self._weights = _fixed(weights)
    self._labels = _fixed([self._int_head("next_sentence_labels", 1) + bytes([v])
                           for v in (0, 1)])
    segment_head = self._int_head("segment_ids", L)
    self._segment_head = np.frombuffer(segment_head, np.uint8)
    # Below the segment ids: a row of n ones then zeros, for each n.
    self._prefix_ones = np.tri(L + 1, L, -1, np.uint8)

  def _int_head(self, name: str, num_bytes: int) -> bytes:
    """Everything of an int64 feature's map entry before its payload."""
    marker = b"\xff" * num_bytes  # Stands in for the payload.
    entry = _field(1, _field(1, name.encode())
                   + _field(2, _field(3, _field(1, marker))))
    return entry[:len(entry) - num_bytes]

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
    if B > _ROWS_AT_ONCE:  # Bounds the memory of the byte grid.
      fields = (ids_BxL, lengths_B, num_a_B, positions_BxP, labels_BxP,
                num_predictions_B, is_random_next_B)
      blocks = [[x[a:a + _ROWS_AT_ONCE] for x in fields]
                for a in range(0, B, _ROWS_AT_ONCE)]
      if self._pool is None:
        done = [self.frame_batch(*block) for block in blocks]
      else:
        done = list(self._pool.map(lambda block: self._thread_encoder().frame_batch(*block),
                                   blocks))
      frames, lengths = zip(*done)
      return b"".join(frames), np.concatenate(lengths)
    n, a = np.asarray(lengths_B, np.int64), np.asarray(num_a_B, np.int64)
    k = np.asarray(num_predictions_B, np.int64)
    # Slots of every row, in order: (bytes, mask of the bytes in use or None
    # for all, bytes in use per row).
    ids = self._varint_slot(ids_BxL)
    lab = self._varint_slot(labels_BxP)
    pos = self._varint_slot(positions_BxP)
    segments = self._prefix_ones[n] - self._prefix_ones[np.minimum(a + 2, n)]
    body = [
        self._heads["input_ids"].slot(ids[2]), ids, _take_fixed(self._mask, n),
        self._heads["masked_lm_ids"].slot(lab[2]), lab,
        self._heads["masked_lm_positions"].slot(pos[2]), pos,
        _take_fixed(self._weights, k),
        _take_fixed(self._labels, np.asarray(is_random_next_B, np.int64)),
        (np.broadcast_to(self._segment_head, (B, len(self._segment_head))), None,
         len(self._segment_head)),
        (segments, None, L),
    ]
    size = sum(slot[2] for slot in body)
    prefix = self._varint_slot(size[:, None])
    data_n = size + 1 + prefix[2]  # b"\n" (Example.features) and its length.
    slots = [self._headers.slot(data_n), (np.full((B, 1), 0x0A, np.uint8), None, 1),
             prefix, *body,
             (np.zeros((B, tfrecord.FOOTER_BYTES), np.uint8), None,
              tfrecord.FOOTER_BYTES)]
    width = sum(slot[0].shape[1] for slot in slots)
    grid = np.empty((B, width), np.uint8)
    keep = np.ones((B, width), bool)
    c = 0
    for values, valid, _ in slots:
      w = values.shape[1]
      grid[:, c:c + w] = values
      if valid is not None:
        keep[:, c:c + w] = valid
      c += w
    out = np.compress(keep.ravel(), grid.ravel())
    frame_n = data_n + tfrecord.FRAME_OVERHEAD
    ends = np.cumsum(frame_n)
    data_start = ends - frame_n + tfrecord.HEADER_BYTES
    data = out.tobytes()
    crcs = tfrecord.mask_crc32c(np.fromiter(
        (google_crc32c.value(data[s:s + m]) for s, m in
         zip(data_start.tolist(), data_n.tolist())), np.uint32, B))
    footer = (ends - tfrecord.FOOTER_BYTES)[:, None] + np.arange(tfrecord.FOOTER_BYTES)
    out[footer] = crcs.astype("<u4").view(np.uint8).reshape(B, tfrecord.FOOTER_BYTES)
    return out.tobytes(), frame_n

  def close(self) -> None:
    """Stops the threads (frame_batch then runs on the caller's)."""
    if self._pool is not None:
      self._pool.shutdown()
      self._pool = None

  def _thread_encoder(self) -> "ExampleEncoder":
    """This thread's encoder (tables grow as frame_batch meets larger
    values, so threads do not share them)."""
    encoder = getattr(self._local, "encoder", None)
    if encoder is None:
      encoder = self._local.encoder = ExampleEncoder(self.max_seq_length,
                                                     self.max_predictions_per_seq)
    return encoder

  def _varint_slot(self, values_BxM: np.ndarray):
    """The protobuf varints of B rows of M non-negative ints below 2**28, by
    table lookup: (B x 4M bytes, their mask, bytes in use per row)."""
    values = np.asarray(values_BxM)
    top = int(values.max(initial=0))
    if top >= len(self._varint_num):
      self._varint_words, self._varint_num = _varint_table(
          min(max(2 * top, 1 << 14), max(top + 1, 1 << 28)))
    B, M = values.shape
    num = np.take(self._varint_num, values)
    words = np.take(self._varint_words, values)
    return (words.view(np.uint8).reshape(B, 4 * M),
            np.take(_IN_USE, num).view(bool).reshape(B, 4 * M),
            num.sum(-1, dtype=np.int64))


# Per varint length 0-4: which of a 4-byte word's bytes are in use, as bools.
_IN_USE = np.array([0, 0x1, 0x101, 0x10101, 0x1010101], "<u4")


class _Table:
  """make(v) for v = 0, 1, ... (bytes), padded to one width: built as far as
  the values asked for, doubling."""

  def __init__(self, make):
    self._make = make
    self._items = []

  def slot(self, values_B: np.ndarray):
    """(make(v) per row, padded; mask of the bytes in use; their number)."""
    top = int(values_B.max(initial=0))
    if top >= len(self._items):
      self._items += [self._make(v) for v in range(len(self._items), 2 * top + 1)]
      width = max(map(len, self._items))
      self._lengths = np.fromiter(map(len, self._items), np.int64, len(self._items))
      self._bytes = np.zeros((len(self._items), width), np.uint8)
      for i, item in enumerate(self._items):
        self._bytes[i, :len(item)] = np.frombuffer(item, np.uint8)
      self._in_use = np.arange(width) < self._lengths[:, None]
      self._all_in_use = bool(self._in_use.all())
    return (np.take(self._bytes, values_B, axis=0),
            None if self._all_in_use else np.take(self._in_use, values_B, axis=0),
            np.take(self._lengths, values_B))


def _fixed(items: Sequence[bytes]) -> np.ndarray:
  """Items of one length as the rows of a uint8 table."""
  if len(set(map(len, items))) != 1:
    raise ValueError("items of different lengths")
  return np.frombuffer(b"".join(items), np.uint8).reshape(len(items), -1)


def _take_fixed(table: np.ndarray, index_B: np.ndarray):
  return np.take(table, index_B, axis=0), None, table.shape[1]


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
