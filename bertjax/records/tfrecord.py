"""TFRecord framing: per-file record indexes and CRC-checked reads by offset.

A TFRecord file is a sequence of frames, each

  uint64 length (little-endian) | uint32 masked_crc32c(length bytes)
  | data[length] | uint32 masked_crc32c(data)

so a record is found by its frame's byte offset. `load_index` takes the
offsets from the `<shard>.index` file written beside each shard (one
little-endian int64 per record) or, for files without one (the original BERT
release's), builds them by walking the frame headers once; indexes are cached
in memory per (path, size, mtime). `RecordReader` reads any set of records,
one system call per run of adjacent frames, and checks both CRCs of every
frame, which reading by offset would otherwise skip.

This module does not import TensorFlow except to open remote (gs://) files.
"""

import dataclasses
import logging
import os
import struct
import threading
from typing import Optional, Sequence, Union

import google_crc32c
import numpy as np

INDEX_SUFFIX = ".index"
HEADER_BYTES = 12  # length + its CRC
FRAME_OVERHEAD = 16  # header + the data's CRC
_SCAN_CHUNK_BYTES = 4 << 20
MASK_DELTA = 0xa282ead8


class CorruptRecordError(ValueError):
  """A record that cannot be read intact; the message names file and offset."""

  def __init__(self, path: str, offset: int, reason: str, hint: str = ""):
    self.path = path
    self.offset = offset
    self.reason = reason
    super().__init__(f"{path}: corrupt TFRecord frame at byte offset {offset}: "
                     f"{reason}.{(' ' + hint) if hint else ''}")


def masked_crc32c(data: bytes) -> int:
  """The CRC32C that TFRecord frames carry, masked as TensorFlow masks it."""
  crc = google_crc32c.value(data)
  return ((((crc >> 15) | (crc << 17)) & 0xffffffff) + MASK_DELTA) & 0xffffffff


def is_remote(path: str) -> bool:
  return "://" in path


def _gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def _stat(path: str) -> tuple[int, int]:
  """(size, mtime in ns) of a local or remote file."""
  if is_remote(path):
    st = _gfile().stat(path)
    return int(st.length), int(st.mtime_nsec)
  st = os.stat(path)
  return st.st_size, st.st_mtime_ns


def _exists(path: str) -> bool:
  return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def _open_binary(path: str):
  return _gfile().GFile(path, "rb") if is_remote(path) else open(path, "rb")


@dataclasses.dataclass(frozen=True)
class FileIndex:
  """Where each record of one TFRecord file lies."""
  path: str
  offsets: np.ndarray  # int64 [n]: byte offset of each frame
  lengths: np.ndarray  # int64 [n]: data bytes of each record
  # Unreadable frames left out at the end of the file (skip_corrupt only).
  dropped: int = 0

  def __len__(self) -> int:
    return len(self.offsets)


_CACHE: dict[tuple[str, int, int], FileIndex] = {}
_CACHE_LOCK = threading.Lock()


def load_index(path: str, *, skip_corrupt: bool = False) -> FileIndex:
  """The record index of TFRecord file `path` (cached in memory).

  Uses `path + ".index"` where it exists, else walks the frame headers.
  A truncated file or a broken frame header raises CorruptRecordError naming
  the file; with skip_corrupt=True the unreadable tail is left out, counted in
  `FileIndex.dropped` and logged.
  """
  size, mtime = _stat(path)
  key = (path, size, mtime)
  with _CACHE_LOCK:
    if key in _CACHE:
      return _CACHE[key]
  if _exists(path + INDEX_SUFFIX):
    index = _read_index_file(path, size, skip_corrupt)
  else:
    index = _scan(path, size, skip_corrupt)
  if index.dropped:
    logging.warning("%s: left out %d unreadable frame(s) at the end of the file "
                    "(skip_corrupt=True).", path, index.dropped)
  with _CACHE_LOCK:
    _CACHE[key] = index
  return index


def _read_index_file(path: str, size: int, skip_corrupt: bool) -> FileIndex:
  index_path = path + INDEX_SUFFIX
  with _open_binary(index_path) as f:
    raw = f.read()
  if len(raw) % 8:
    raise ValueError(f"{index_path}: {len(raw)} bytes is not a whole number of "
                     "int64 offsets; delete it to index the shard by scanning.")
  offsets = np.frombuffer(raw, dtype="<i8").astype(np.int64)
  total = len(offsets)
  if total and (offsets[0] != 0 or np.any(np.diff(offsets) < FRAME_OVERHEAD)):
    raise ValueError(f"{index_path}: offsets do not describe consecutive "
                     "frames starting at 0; delete it to index the shard by scanning.")
  # Entries whose frame cannot even start before the end of the file.
  n = int(np.searchsorted(offsets, size - FRAME_OVERHEAD, side="right"))
  if n < total and not skip_corrupt:
    raise CorruptRecordError(
        path, int(offsets[n]), f"{index_path} lists {total} records but the file "
        f"ends ({size} bytes) before record {n} (truncated file?)", _CORRUPT_HINT)
  lengths = np.append(offsets[1:n], size) - offsets[:n] - FRAME_OVERHEAD
  # The last frame's header must say it ends exactly at the end of the file;
  # anything else means the shard was truncated (or the index is stale).
  while n:
    reason = _check_header_at(path, int(offsets[n - 1]), size, int(lengths[n - 1]))
    if reason is None:
      break
    if not skip_corrupt:
      raise CorruptRecordError(
          path, int(offsets[n - 1]), f"{reason} (record {n - 1} of {total} "
          f"in {index_path})", _CORRUPT_HINT)
    n -= 1
  return FileIndex(path, offsets[:n].copy(), lengths[:n].copy(), total - n)


def _check_header_at(path: str, offset: int, size: int, expected: int) -> Optional[str]:
  """None if the frame at `offset` has a sound header of length `expected`."""
  if expected < 0 or offset + FRAME_OVERHEAD + expected > size:
    return "the file ends inside the frame (truncated file?)"
  with _open_binary(path) as f:
    f.seek(offset)
    header = f.read(HEADER_BYTES)
  reason = _header_problem(header)
  if reason:
    return reason
  length = struct.unpack_from("<Q", header)[0]
  if length != expected:
    return (f"the frame holds {length} bytes but the file leaves room for "
            f"{expected} (truncated file or stale index?)")
  return None


def _header_problem(header: bytes) -> Optional[str]:
  if len(header) < HEADER_BYTES:
    return "the file ends inside the frame header"
  if masked_crc32c(header[:8]) != struct.unpack_from("<I", header, 8)[0]:
    return "the length's CRC does not match (not a TFRecord file, or corrupt)"
  return None


_CORRUPT_HINT = ("Re-create or re-copy the shard, or pass skip_corrupt=True to "
                 "skip unreadable records (they are counted and logged).")


def _scan(path: str, size: int, skip_corrupt: bool) -> FileIndex:
  """Indexes a file without an index file by walking its frame headers."""
  offsets, lengths = [], []
  dropped = 0
  with _open_binary(path) as f:
    buf, buf_start, pos = b"", 0, 0
    while pos < size:
      rel = pos - buf_start
      if rel < 0 or rel + HEADER_BYTES > len(buf):
        f.seek(pos)
        buf, buf_start, rel = f.read(_SCAN_CHUNK_BYTES), pos, 0
      header = buf[rel:rel + HEADER_BYTES]
      reason = _header_problem(header)
      length = struct.unpack_from("<Q", header)[0] if reason is None else 0
      if reason is None and pos + FRAME_OVERHEAD + length > size:
        reason = (f"the frame holds {length} bytes but the file ends "
                  f"{size - pos - FRAME_OVERHEAD} bytes later (truncated file?)")
      if reason is not None:
        if not skip_corrupt:
          raise CorruptRecordError(path, pos, f"{reason} (after {len(offsets)} "
                                   "good records)", _CORRUPT_HINT)
        dropped = 1  # The framing is lost: nothing after this can be found.
        break
      offsets.append(pos)
      lengths.append(length)
      pos += FRAME_OVERHEAD + length
  return FileIndex(path, np.asarray(offsets, np.int64),
                   np.asarray(lengths, np.int64), dropped)


class RecordReader:
  """Reads records of a fixed list of files by (file number, offset, length).

  Thread-safe: local files are read with os.pread on shared descriptors,
  remote ones through one tf.io.gfile handle per thread and file.
  """

  def __init__(self, paths: Sequence[str], verify_crc: bool = True):
    self.paths = list(paths)
    self.verify_crc = verify_crc
    self._fds: dict[int, int] = {}
    self._lock = threading.Lock()
    self._local = threading.local()

  def _pread(self, file_number: int, offset: int, size: int) -> bytes:
    path = self.paths[file_number]
    if is_remote(path):
      handles = self._local.__dict__.setdefault("handles", {})
      if file_number not in handles:
        handles[file_number] = _gfile().GFile(path, "rb")
      f = handles[file_number]
      f.seek(offset)
      return f.read(size)
    fd = self._fds.get(file_number)
    if fd is None:
      with self._lock:
        fd = self._fds.get(file_number)
        if fd is None:
          fd = self._fds[file_number] = os.open(path, os.O_RDONLY)
    return os.pread(fd, size, offset)

  def read(self, file_numbers: np.ndarray, offsets: np.ndarray,
           lengths: np.ndarray) -> list[Union[bytes, CorruptRecordError]]:
    """The records' data, or a CorruptRecordError in place of a bad one.

    Adjacent frames of one file (in any order in the request) are read with
    one call.
    """
    n = len(file_numbers)
    out: list = [None] * n
    if not n:
      return out
    order = np.lexsort((offsets, file_numbers))
    fn_s, off_s, len_s = file_numbers[order], offsets[order], lengths[order]
    ends = off_s + len_s + FRAME_OVERHEAD
    # A run breaks where the file changes or the next frame does not follow.
    breaks = np.flatnonzero((fn_s[1:] != fn_s[:-1]) | (off_s[1:] != ends[:-1])) + 1
    bounds = np.concatenate(([0], breaks, [n])).tolist()
    order, fn_l = order.tolist(), fn_s.tolist()
    off_l, len_l, end_l = off_s.tolist(), len_s.tolist(), ends.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
      start = off_l[a]
      try:
        buf = self._pread(fn_l[a], start, end_l[b - 1] - start)
      except OSError as e:
        for i in range(a, b):
          out[order[i]] = CorruptRecordError(self.paths[fn_l[a]], off_l[i],
                                             f"read failed: {e}")
        continue
      for i in range(a, b):
        out[order[i]] = self._check_frame(fn_l[a], buf, off_l[i] - start,
                                          off_l[i], len_l[i])
    return out

  def _check_frame(self, file_number, buf, rel, offset, length):
    def bad(reason):
      return CorruptRecordError(self.paths[file_number], offset, reason)
    if rel + FRAME_OVERHEAD + length > len(buf):
      return bad("the file ends inside the frame (truncated file?)")
    stored_length, = struct.unpack_from("<Q", buf, rel)
    if stored_length != length:
      return bad(f"the frame holds {stored_length} bytes where the index says "
                 f"{length} (stale .index file or corrupt frame)")
    data = buf[rel + HEADER_BYTES:rel + HEADER_BYTES + length]
    if self.verify_crc:
      if masked_crc32c(buf[rel:rel + 8]) != struct.unpack_from("<I", buf, rel + 8)[0]:
        return bad("the length's CRC does not match")
      if masked_crc32c(data) != struct.unpack_from("<I", buf, rel + HEADER_BYTES + length)[0]:
        return bad("the data's CRC does not match")
    return data

  def close(self):
    with self._lock:
      for fd in self._fds.values():
        os.close(fd)
      self._fds.clear()

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass
