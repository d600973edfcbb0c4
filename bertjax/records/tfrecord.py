"""TFRecord framing: per-file record indexes and CRC-checked reads by offset.

A TFRecord file is a sequence of frames, each

  uint64 length (little-endian) | uint32 masked_crc32c(length bytes)
  | data[length] | uint32 masked_crc32c(data)

so a record is found by its frame's byte offset. `load_index` takes the
offsets from the `<shard>.index` file written beside each shard (one
little-endian int64 per record) when that index fits the file, or else (the
original BERT release's files have none; a damaged shard no longer fits its
index) builds them by walking the frame headers once; indexes are cached in
memory per (path, size, mtime). `RecordReader` reads any set of records, one
system call per run of adjacent frames, and checks both CRCs of every frame,
which reading by offset would otherwise skip.

Only a frame whose CRC or length is wrong is corrupt (CorruptRecordError,
naming the file and byte offset). Reads go through the file layer
(bertjax.records.fileio) and are retried with backoff on transient I/O
errors, which are raised, never taken for corruption, when the retries run
out. With skip_corrupt, a scan that meets a broken frame finds the next
intact frame and goes on from there, so one bad record costs one record.

This module does not import TensorFlow except to open remote (gs://) files.
"""

import dataclasses
import logging
import os
import struct
import threading
from typing import Any, Callable, Optional, Sequence, Union

import google_crc32c
import numpy as np

from bertjax.records import fileio

INDEX_SUFFIX = ".index"
HEADER_BYTES = 12  # length + its CRC
FOOTER_BYTES = 4  # the data's CRC
FRAME_OVERHEAD = HEADER_BYTES + FOOTER_BYTES
_SCAN_CHUNK_BYTES = 4 << 20
_SEARCH_WINDOW_BYTES = 1 << 20
MASK_DELTA = 0xa282ead8
_CORRUPT_HINT = ("Re-create or re-copy the shard, or pass skip_corrupt=True to "
                 "skip unreadable records (they are counted and logged).")


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


def mask_crc32c(crcs: np.ndarray) -> np.ndarray:
  """masked_crc32c's masking of an array of CRC32Cs (uint32)."""
  crcs = crcs.astype(np.uint32)
  return ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(MASK_DELTA)


def index_path(path: str) -> str:
  """The index file beside a shard: its records' offsets as int64s."""
  return path + INDEX_SUFFIX


@dataclasses.dataclass(frozen=True)
class FileIndex:
  """Where each record of one TFRecord file lies."""
  path: str
  offsets: np.ndarray  # int64 [n]: byte offset of each frame
  lengths: np.ndarray  # int64 [n]: data bytes of each record
  # Unreadable stretches of the file left out (skip_corrupt only): each is
  # one broken frame, or the rest of the file where no intact frame follows.
  dropped: int = 0

  def __len__(self) -> int:
    return len(self.offsets)


# (path, size, mtime, skip_corrupt) -> index.
_CACHE: dict[tuple[str, int, int, bool], FileIndex] = {}
_CACHE_LOCK = threading.Lock()


def load_index(path: str, *, skip_corrupt: bool = False,
               on_retry: Optional[Callable[[], Any]] = None) -> FileIndex:
  """The record index of TFRecord file `path` (cached in memory).

  Uses `path + ".index"` where it exists and fits the file, else walks the
  frame headers. A broken frame raises CorruptRecordError naming the file and
  offset; with skip_corrupt=True it is left out, counted in
  `FileIndex.dropped` and logged. Transient I/O errors are retried
  (`on_retry` is called before each further try).
  """
  size, mtime = fileio.retry(lambda: fileio.stat(path), f"stat of {path}",
                             on_retry=on_retry)
  key = (path, size, mtime, skip_corrupt)
  with _CACHE_LOCK:
    if key in _CACHE:
      return _CACHE[key]
  index = fileio.retry(lambda: _build_index(path, size, skip_corrupt),
                       f"indexing {path}", on_retry=on_retry)
  if index.dropped:
    logging.warning("%s: left out %d unreadable stretch(es) of the file "
                    "(skip_corrupt=True).", path, index.dropped)
  with _CACHE_LOCK:
    _CACHE[key] = index
  return index


def _build_index(path: str, size: int, skip_corrupt: bool) -> FileIndex:
  if fileio.exists(index_path(path)):
    index, problem = _index_from_file(path, size)
    if index is not None:
      return index
    logging.warning("%s: %s; indexing %s by scanning its frames instead.",
                    index_path(path), problem, path)
  return _scan(path, size, skip_corrupt)


def _index_from_file(path: str, size: int) -> tuple[Optional[FileIndex], str]:
  """(the index from `path`.index, "") if it fits the file, else (None, why)."""
  with fileio.open_binary(index_path(path)) as f:
    raw = f.read()
  if len(raw) % 8:
    return None, f"{len(raw)} bytes is not a whole number of int64 offsets"
  offsets = np.frombuffer(raw, dtype="<i8").astype(np.int64)
  if not len(offsets):
    return (FileIndex(path, offsets, offsets.copy()), "") if size == 0 else (
        None, f"it lists no records but the file has {size} bytes")
  if offsets[0] != 0 or np.any(np.diff(offsets) < FRAME_OVERHEAD):
    return None, "its offsets do not describe consecutive frames starting at 0"
  lengths = np.append(offsets[1:], size) - offsets - FRAME_OVERHEAD
  # The last frame's header must say it ends exactly at the end of the file;
  # anything else means the shard lost or gained bytes since it was indexed.
  with fileio.open_binary(path) as f:
    reason = _frame_problem(_Window(f), int(offsets[-1]), size, int(lengths[-1]))
  if reason is not None:
    return None, (f"its last record (at byte offset {int(offsets[-1])}) does not "
                  f"end the file: {reason}")
  return FileIndex(path, offsets, lengths), ""


class _Window:
  """Reads a file at any offset through a buffer of _SCAN_CHUNK_BYTES."""

  def __init__(self, f):
    self._f, self._buf, self._start = f, b"", 0

  def read(self, pos: int, n: int) -> bytes:
    rel = pos - self._start
    if rel < 0 or rel + n > len(self._buf):
      self._f.seek(pos)
      self._buf, self._start, rel = self._f.read(max(n, _SCAN_CHUNK_BYTES)), pos, 0
    return self._buf[rel:rel + n]


def _header_problem(header: bytes) -> Optional[str]:
  if len(header) < HEADER_BYTES:
    return "the file ends inside the frame header"
  if masked_crc32c(header[:8]) != struct.unpack_from("<I", header, 8)[0]:
    return "the length's CRC does not match (not a TFRecord file, or corrupt)"
  return None


def _frame_problem(window: _Window, pos: int, size: int,
                   expected: Optional[int] = None) -> Optional[str]:
  """None if a sound frame header starts at `pos` whose frame fits the file
  (and holds `expected` bytes, where given)."""
  header = window.read(pos, HEADER_BYTES)
  reason = _header_problem(header)
  if reason is not None:
    return reason
  length = struct.unpack_from("<Q", header)[0]
  if pos + FRAME_OVERHEAD + length > size:
    return (f"the frame holds {length} bytes but the file ends "
            f"{size - pos - FRAME_OVERHEAD} bytes later (truncated file?)")
  if expected is not None and length != expected:
    return (f"the frame holds {length} bytes but the file leaves room for "
            f"{expected} (truncated file or stale index?)")
  return None


def _scan(path: str, size: int, skip_corrupt: bool) -> FileIndex:
  """Indexes a file by walking its frame headers (see `_skip_broken`)."""
  offsets, lengths = [], []
  dropped = 0
  with fileio.open_binary(path) as f:
    window = _Window(f)
    pos = 0
    while pos < size:
      reason = _frame_problem(window, pos, size)
      if reason is None:
        length = struct.unpack_from("<Q", window.read(pos, 8))[0]
        offsets.append(pos)
        lengths.append(length)
        pos += FRAME_OVERHEAD + length
        continue
      bad, resume, reason = _skip_broken(window, size, offsets, lengths, pos, reason,
                                         skip_corrupt)
      if not skip_corrupt:
        raise CorruptRecordError(path, bad, f"{reason} (after {len(offsets)} good "
                                 "records)", _CORRUPT_HINT)
      logging.warning("%s: skipped the broken frame at byte offset %d: %s", path,
                      bad, reason)
      dropped += 1
      if resume is None:
        break
      pos = resume
  return FileIndex(path, np.asarray(offsets, np.int64),
                   np.asarray(lengths, np.int64), dropped)


def _skip_broken(window: _Window, size: int, offsets: list, lengths: list,
                 pos: int, reason: str, skip_corrupt: bool
                 ) -> tuple[int, Optional[int], str]:
  """(offset of the broken frame, where the next intact frame starts or None,
  why) when no sound frame starts at `pos`.

  Either the frame at `pos` is broken, or the frame before it was cut short:
  its stated length runs over the start of the next frame, which then lies
  between the previous frame's header and `pos`. In that case the previous
  frame is dropped from `offsets` and `lengths`. The search past `pos` for
  the next intact frame is made only with skip_corrupt.
  """
  if offsets:
    prev = offsets[-1]
    found = _next_frame(window, size, prev + HEADER_BYTES, end=pos)
    if found is not None:
      offsets.pop()
      lengths.pop()
      return prev, found, (f"the frame was cut short: the next intact frame "
                           f"starts at byte offset {found}, {pos - found} bytes "
                           "before this frame's stated end (truncated record)")
  return pos, _next_frame(window, size, pos + 1) if skip_corrupt else None, reason


def _next_frame(window: _Window, size: int, start: int,
                end: Optional[int] = None) -> Optional[int]:
  """The first offset in [start, end) where an intact frame (both CRCs)
  begins; `end` defaults to the end of the file."""
  end = size if end is None else min(end, size)
  while start < end and start + FRAME_OVERHEAD <= size:
    chunk = window.read(start, min(_SEARCH_WINDOW_BYTES, size - start))
    if len(chunk) < HEADER_BYTES:
      return None
    as_u8 = np.frombuffer(chunk, np.uint8)
    stated = np.lib.stride_tricks.sliding_window_view(as_u8, 8)[:len(chunk) - 11]
    stated = np.ascontiguousarray(stated).view("<u8")[:, 0]
    room = size - (start + np.arange(len(stated))) - FRAME_OVERHEAD
    for rel in np.flatnonzero(stated.astype(np.float64) <= room).tolist():
      if start + rel >= end:
        return None
      if _is_intact(window, start + rel, int(stated[rel])):
        return start + rel
    start += len(stated)
  return None


def _is_intact(window: _Window, pos: int, length: int) -> bool:
  header = window.read(pos, HEADER_BYTES)
  if _header_problem(header) is not None:
    return False
  data = window.read(pos + HEADER_BYTES, length + 4)
  return masked_crc32c(data[:length]) == struct.unpack_from("<I", data, length)[0]


class RecordReader:
  """Reads records of a fixed list of files by (file number, offset, length).

  Thread-safe: local files are read with os.pread on shared descriptors,
  remote ones through one file-layer handle per thread and file. Transient
  I/O errors are retried with backoff; `retries` counts the further tries.
  """

  def __init__(self, paths: Sequence[str], verify_crc: bool = True):
    self.paths = list(paths)
    self.verify_crc = verify_crc
    self.retries = 0
    self._fds: dict[int, int] = {}
    self._lock = threading.Lock()
    self._local = threading.local()

  def count_retry(self) -> None:
    with self._lock:
      self.retries += 1

  def _pread(self, file_number: int, offset: int, size: int) -> bytes:
    path = self.paths[file_number]
    read = self._remote_read if fileio.is_remote(path) else self._local_read
    return fileio.retry(lambda: read(file_number, offset, size),
                        f"read of {path} at byte offset {offset}",
                        on_retry=self.count_retry)

  def _local_read(self, file_number: int, offset: int, size: int) -> bytes:
    fd = self._fds.get(file_number)
    if fd is None:
      with self._lock:
        fd = self._fds.get(file_number)
        if fd is None:
          fd = self._fds[file_number] = os.open(self.paths[file_number], os.O_RDONLY)
    return os.pread(fd, size, offset)

  def _remote_read(self, file_number: int, offset: int, size: int) -> bytes:
    handles = self._local.__dict__.setdefault("handles", {})
    f = handles.get(file_number)
    if f is None:
      f = handles[file_number] = fileio.open_binary(self.paths[file_number])
    try:
      f.seek(offset)
      return f.read(size)
    except Exception:
      # The handle may be broken (e.g. a reset connection): the next try
      # opens a fresh one.
      del handles[file_number]
      try:
        f.close()
      except Exception:  # pylint: disable=broad-except
        pass
      raise

  def read(self, file_numbers: np.ndarray, offsets: np.ndarray,
           lengths: np.ndarray) -> list[Union[bytes, CorruptRecordError]]:
    """The records' data, or a CorruptRecordError in place of a bad one.

    Adjacent frames of one file (in any order in the request) are read with
    one call. I/O errors that retries did not cure are raised: they are not
    corruption.
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
      buf = self._pread(fn_l[a], start, end_l[b - 1] - start)
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
