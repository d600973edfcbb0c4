"""Sorted spill runs on disk and their streaming k-way merge.

Both steps of creation that regroup data use them: reading (documents ->
their partition) and mapping (records -> their output shard). A writer
buffers (part, key, bytes) entries and, every `spill_bytes`, writes a run:

  run-XXXXX.bin      each part's entries' bytes, part after part, every part
                     sorted by key
  run-XXXXX.keys     their keys and lengths (KEY_FIELDS), in the same order
  run-XXXXX.offsets  where each part begins, in entries and in bytes

Keys are fixed-width big-endian byte strings (numpy "S<n>"), which sort as
the tuples they pack. `merge_part` streams one part of many runs in key
order, a block at a time, so memory is bounded by `block_bytes` whatever the
size of the part.

Entries are either byte strings of any length (`SpillWriter.add`) or rows
of one numpy dtype (`add_rows`, merged with `merge_part(row_dtype=...)`),
which are reordered with one numpy gather instead of a Python step per
entry.
"""

import os
from typing import Any, Iterator, Optional, Sequence

import numpy as np


WRITE_BUFFER_BYTES = 1 << 20


def key_dtype(key_width: int) -> np.dtype:
  """A run's `.keys` entry: the key and the entry's length in bytes."""
  return np.dtype([("key", f"S{key_width}"), ("length", "<u4")])


class SpillWriter:
  """Buffers keyed entries per part and writes them as sorted runs."""

  def __init__(self, directory: str, num_parts: int, key_width: int,
               spill_bytes: int):
    self.directory = directory
    self.num_parts = num_parts
    self.dtype = key_dtype(key_width)
    self.spill_bytes = spill_bytes
    self.runs = 0
    self._blobs, self._keys, self._parts, self._rows = [], [], [], []
    self._buffered = 0
    os.makedirs(directory, exist_ok=True)

  def add(self, parts: np.ndarray, keys: np.ndarray, blob: bytes,
          lengths: np.ndarray) -> None:
    """Entry i is part parts[i], key keys[i] and the next lengths[i] bytes."""
    if self._rows:
      raise ValueError("a spill run holds byte strings or rows, not both")
    entries = np.empty(len(keys), self.dtype)
    entries["key"], entries["length"] = keys, lengths
    self._blobs.append(blob)
    self._keys.append(entries)
    self._parts.append(np.asarray(parts, np.int64))
    self._buffered += len(blob)
    if self._buffered >= self.spill_bytes:
      self.flush()

  def add_rows(self, parts: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> None:
    """Entry i is part parts[i], key keys[i] and the bytes of rows[i] (a 1-D
    array of any fixed-width dtype, the same for every call)."""
    if self._blobs:
      raise ValueError("a spill run holds byte strings or rows, not both")
    entries = np.empty(len(keys), self.dtype)
    entries["key"], entries["length"] = keys, rows.dtype.itemsize
    self._rows.append(rows)
    self._keys.append(entries)
    self._parts.append(np.asarray(parts, np.int64))
    self._buffered += rows.nbytes
    if self._buffered >= self.spill_bytes:
      self.flush()

  def flush(self) -> None:
    """Writes the buffered entries as one run (an empty one if none)."""
    keys = np.concatenate([np.zeros(0, self.dtype), *self._keys])
    parts = np.concatenate([np.zeros(0, np.int64), *self._parts])
    lengths = keys["length"].astype(np.int64)
    order = np.lexsort([keys["key"], parts])  # By part, then by key.
    path = os.path.join(self.directory, f"run-{self.runs:05d}")
    if self._rows:
      rows = np.concatenate(self._rows)
      self._rows = []
      rows[order].tofile(path + ".bin")
    else:
      self._write_blobs(path + ".bin", lengths, order)
    keys[order].tofile(path + ".keys")
    counts = np.bincount(parts, minlength=self.num_parts)
    nbytes = np.bincount(parts, weights=lengths, minlength=self.num_parts)
    offsets = np.zeros((self.num_parts + 1, 2), "<i8")
    offsets[1:, 0] = np.cumsum(counts)
    offsets[1:, 1] = np.cumsum(nbytes.astype(np.int64))
    offsets.tofile(path + ".offsets")
    self.runs += 1
    self._blobs, self._keys, self._parts = [], [], []
    self._buffered = 0

  def _write_blobs(self, path: str, lengths: np.ndarray, order: np.ndarray) -> None:
    """Writes the buffered byte strings' entries in `order`."""
    # Each entry's buffer and its start there (the buffers are not joined:
    # that would hold the spill twice).
    blob_of = np.repeat(np.arange(len(self._keys)), [len(k) for k in self._keys])
    blob_sizes = np.fromiter(map(len, self._blobs), np.int64, len(self._blobs))
    starts = (np.cumsum(lengths) - lengths) - (np.cumsum(blob_sizes) - blob_sizes)[blob_of]
    views = [memoryview(b) for b in self._blobs]
    # The pieces are records of hundreds of bytes: a large buffer makes few
    # write calls of them (with the default 8 KiB, tens of thousands).
    with open(path, "wb", buffering=WRITE_BUFFER_BYTES) as f:
      f.writelines([views[b][a:a + n] for b, a, n in zip(
          blob_of[order].tolist(), starts[order].tolist(), lengths[order].tolist())])


def list_runs(directories: Sequence[str]) -> list[str]:
  """The runs (paths without suffix) in the given directories, in order."""
  return [os.path.join(d, name[:-len(".bin")]) for d in directories
          for name in sorted(os.listdir(d)) if name.endswith(".bin")]


class _Cursor:
  """Reads one part of one run, a block at a time."""

  def __init__(self, run: str, part: int, dtype: np.dtype):
    self.run = run
    offsets = np.fromfile(run + ".offsets", "<i8").reshape(-1, 2)
    (self._next, b0), (self._end, _) = offsets[part], offsets[part + 1]
    self._keys_path, self._dtype = run + ".keys", dtype
    self._file = open(run + ".bin", "rb")  # pylint: disable=consider-using-with
    self._file.seek(int(b0))
    self.keys = np.zeros(0, dtype)  # The loaded, not yet merged entries.
    self.blob, self.starts = b"", np.zeros(0, np.int64)

  @property
  def more_on_disk(self) -> bool:
    return self._next < self._end

  def load(self, block_bytes: int) -> None:
    """Loads the next entries, about `block_bytes` of them (at least one)."""
    count = int(min(self._end - self._next, 1 + block_bytes // 64))
    keys = np.fromfile(self._keys_path, self._dtype, count=count,
                       offset=int(self._next) * self._dtype.itemsize)
    ends = np.cumsum(keys["length"], dtype=np.int64)
    take = max(1, int(np.searchsorted(ends, block_bytes, side="right")))
    self.keys, self._next = keys[:take], self._next + take
    self.starts = ends[:take] - keys["length"][:take]
    self.blob = self._file.read(int(ends[take - 1]))

  def close(self) -> None:
    self._file.close()


def merge_part(runs: Sequence[str], part: int, key_width: int,
               block_bytes: int = 64 << 20, row_dtype: Optional[np.dtype] = None
               ) -> Iterator[tuple[np.ndarray, Any, np.ndarray]]:
  """Yields (keys, entries, lengths) blocks of one part of `runs`, in key order:
  the entries as bytes back to back, or with `row_dtype` (runs written by
  SpillWriter.add_rows) as an array of rows.

  A blocked k-way merge: every run keeps one block loaded; the entries up to
  the smallest last key among runs with more on disk are sorted and yielded,
  and the runs that ran dry load their next block.
  """
  dtype = key_dtype(key_width)
  opened = [_Cursor(run, part, dtype) for run in runs]
  per_run = max(1, block_bytes // max(1, len(opened)))
  try:
    cursors = [c for c in opened if c.more_on_disk]
    while cursors:
      for c in cursors:
        if not len(c.keys):
          c.load(per_run)
          if row_dtype is not None and (c.keys["length"] != row_dtype.itemsize).any():
            raise ValueError(f"{c.run}.bin: entries of {set(c.keys['length'].tolist())} "
                             f"bytes, not rows of {row_dtype.itemsize}; it was written by "
                             "other code: remove the unfinished output and rerun")
      limits = [c.keys["key"][-1] for c in cursors if c.more_on_disk]
      keys, blobs = [], []
      for c in cursors:
        cut = (len(c.keys) if not limits else
               int(np.searchsorted(c.keys["key"], min(limits), side="right")))
        if row_dtype is not None:
          if cut:
            blobs.append(np.frombuffer(c.blob, row_dtype, count=cut, offset=int(c.starts[0])))
        else:
          view = memoryview(c.blob)
          blobs.extend(view[a:a + n] for a, n in zip(
              c.starts[:cut].tolist(), c.keys["length"][:cut].tolist()))
        keys.append(c.keys[:cut])
        c.keys, c.starts = c.keys[cut:], c.starts[cut:]
      keys = np.concatenate(keys)
      order = np.argsort(keys["key"], kind="stable")
      if row_dtype is not None:
        entries = np.concatenate([np.zeros(0, row_dtype), *blobs])[order]
      else:
        entries = b"".join([blobs[i] for i in order.tolist()])
      yield keys["key"][order], entries, keys["length"][order].astype(np.int64)
      cursors = [c for c in cursors if len(c.keys) or c.more_on_disk]
  finally:
    for c in opened:
      c.close()
