"""The host input pipeline: pre-masked TFRecords -> per-host numpy batches.

Order and exact resume
----------------------
Records are read by index, not as a stream, so that the batch at global step
s is a pure function of (seed, s) and the files: resuming at step s costs
O(1), however far into training s is, and needs nothing in the checkpoint but
the step. Epoch e of a set of n records is a permutation of them drawn from
PCG64 seeded with (seed, e, ...); epochs follow one another, and a batch that
straddles an epoch boundary takes the end of one and the start of the next.
Two orders are offered:

* order="files" (default). Host h of P owns files h, h+P, h+2P, ... of the
  sorted file list and reads only those; its epoch e is a permutation of its
  own records seeded with (seed, e, P, h), and host step s is rows
  [s*b, (s+1)*b) of its stream (b = global batch / P). The global batch is the
  hosts' slices stacked. Files are host-disjoint, which is what scales: a
  host opens F/P files, so its page cache or object-store reads cover 1/P of
  the data. Every record comes exactly once per epoch. The price: the order
  depends on P, and a host with more records has longer epochs (a warning says
  so when the files do not split evenly).
* order="global". One permutation of all records per epoch, seeded with
  (seed, e); global step s is positions [s*B, (s+1)*B) and host h takes rows
  [h*b, (h+1)*b). The global batches are the same for any number of hosts, so
  a run resumed on a different number of hosts continues the same order; every
  host reads from every file.

shuffle_block=K > 1 permutes blocks of K consecutive records instead of
single records, so that reads come in contiguous runs (one request per block
on object stores such as gs://, where single-record reads are slow). A batch
is a set, so this only coarsens the shuffle; records are already shuffled
when the data is created.

Reading
-------
Python threads read whole frames by offset (tfrecord.RecordReader: one
pread per run of adjacent frames, both CRCs checked) and hand batches of
serialized examples to tf.data, which parses them with tf.io.parse_example
after batching (vectorised), casts to int32, masks them afresh if
`dynamic_masking` is set, and prefetches. TensorFlow never sees an accelerator.

Reads go through the file layer (bertjax.records.fileio) and are retried
with exponential backoff on transient I/O errors (resets, timeouts, an
unavailable store); an error that retries do not cure, or a missing or
unreadable file, is raised as it is and never taken for corruption. Only a
frame whose CRC or length is wrong is corrupt: it raises
tfrecord.CorruptRecordError naming the file and byte offset; with
skip_corrupt=True a record found broken while indexing is left out (the next
intact frame is found and reading goes on), and one found broken when read
becomes a padding row of weight 0 (the step keeps its size and every other row
its place); both are counted in `stats()` and logged, as are the retries. A
record that parses badly (wrong max_seq_length, not a BERT example) always
raises, naming the file and the offending feature, and so does a token id at
or above the model's vocab_size.

Packing
-------
With `packing` set, the examples of each batch are packed several to a row
(bertjax/input/packing.py) after parsing and masking, so any records in the
original layout can be packed. In training, step s packs the same examples
that the unpacked batch at step s holds into a fixed number of rows (first-fit
decreasing), or the examples of `chunk_steps` consecutive steps into
chunk_steps times as many rows, handed out a step's rows at a time: the
order is still a function of (seed, step) (a resume reads one chunk), and
an example that fits in none of the rows is left out and counted
(stats()["packing_overflow"]). Evaluation (evaluation.py) plans the packing
over all its records first (one pass over their sizes): every record once,
none left out.
"""

import collections
import os
import threading
from typing import Any, Iterator, Mapping, Optional, Sequence

from absl import logging
import numpy as np

from bertjax.input import batch_reader
from bertjax.input import dynamic_masking as masking_lib
from bertjax.input import packing as packing_lib
from bertjax.records import fileio
from bertjax.records import schema
from bertjax.records import tfrecord

ORDERS = ("files", "global")


def list_files(file_pattern: str) -> list[str]:
  """Sorted shards matching a glob (or comma-separated globs), without the
  .index and metadata.json files that live beside them and without
  temporaries that an interrupted write left (fileio.glob)."""
  files = set()
  for pattern in file_pattern.split(","):
    files.update(fileio.glob(pattern.strip()))
  files = sorted(f for f in files if not f.endswith(tfrecord.INDEX_SUFFIX)
                 and os.path.basename(f) != schema.METADATA_FILENAME)
  if not files:
    raise FileNotFoundError(f"file pattern {file_pattern!r} matches no TFRecord "
                            "files; check the path (data.*_files in the config).")
  return files


def check_metadata(file_pattern: str, *, max_seq_length: int,
                   max_predictions_per_seq: Optional[int], vocab_size: Optional[int] = None,
                   vocab_hash: Optional[str] = None,
                   require: bool = False,
                   objective: Optional[str] = None,
                   evaluation: bool = False) -> Optional[schema.DatasetMetadata]:
  """Checks the metadata.json beside the files against the config.

  With `objective` (schema.OBJECTIVES) the records must have been made for
  it, or with `evaluation` for one of schema.EVAL_OBJECTIVES[objective];
  records without metadata.json count as the paper's (mlm+nsp).

  Raises ValueError naming the metadata file and field on a mismatch. The
  model's vocab may be larger than the data's (padded), not smaller. Without
  metadata.json (e.g. the original BERT release's files) nothing can be
  checked: a warning, or ValueError if `require`. Returns the metadata (of the
  first directory) or None.
  """
  result = None
  for directory in sorted({os.path.dirname(f) for f in list_files(file_pattern)}):
    md = schema.read_metadata(directory)
    path = schema.metadata_path(directory)
    made_for = md.objective if md is not None else schema.DEFAULT_OBJECTIVE
    accepted = ((schema.EVAL_OBJECTIVES[objective] if evaluation else (objective,))
                if objective is not None else ())
    if objective is not None and made_for not in accepted:
      have = (f"objective is {made_for!r}" if md is not None else
              f"there is no {schema.METADATA_FILENAME}, so the records are taken as the "
              f"original release's ({made_for!r})")
      takes = (f"evaluation of an objective={objective!r} model takes records made for "
               f"{' or '.join(repr(o) for o in accepted)}" if evaluation else
               f"the config has objective={objective!r}")
      raise ValueError(f"{path}: {have} but {takes}; create the data with --objective="
                       f"{objective} (bertjax.create_data) or set --config.objective="
                       f"{made_for}.")
    if md is None:
      if require:
        raise ValueError(f"{directory}: no {schema.METADATA_FILENAME}, so the data "
                         "cannot be checked against the config; create the data "
                         "with bertjax.create_data or do not require metadata.")
      logging.warning("%s: no %s; the data's sequence length and vocabulary cannot "
                      "be checked against the config.", directory,
                      schema.METADATA_FILENAME)
      continue

    def bad(field, have, want):
      raise ValueError(f"{path}: {field} is {have} but the config has {field}={want}; "
                       "use data made for this config or change the config.")
    if md.max_seq_length != max_seq_length:
      bad("max_seq_length", md.max_seq_length, max_seq_length)
    if (max_predictions_per_seq is not None
        and md.max_predictions_per_seq != max_predictions_per_seq):
      bad("max_predictions_per_seq", md.max_predictions_per_seq, max_predictions_per_seq)
    if vocab_size is not None and md.vocab_size > vocab_size:
      raise ValueError(f"{path}: vocab_size is {md.vocab_size} but the model's "
                       f"vocabulary has {vocab_size} ids (--config.model.vocab_size="
                       f"{vocab_size}); set --config.model.vocab_size to at least "
                       f"{md.vocab_size} or use data made with the model's vocabulary.")
    if vocab_hash is not None and md.vocab_hash != vocab_hash:
      bad("vocab_hash", md.vocab_hash, vocab_hash)
    result = result or md
  return result


def epoch_order(n: int, seed: int, epoch: int, salt: Sequence[int] = (),
                block: int = 1) -> np.ndarray:
  """The permutation of range(n) for `epoch`: a pure function of its arguments.

  With block > 1, blocks of `block` consecutive indices move together.
  """
  rng = np.random.Generator(np.random.PCG64(
      np.random.SeedSequence([seed % 2**64, epoch, *salt])))
  dtype = np.int32 if n < 2**31 else np.int64
  if block <= 1:
    return rng.permutation(n).astype(dtype, copy=False)
  starts = rng.permutation(-(-n // block)).astype(np.int64) * block
  sizes = np.minimum(block, n - starts)
  out_starts = np.cumsum(sizes) - sizes
  return (np.repeat(starts - out_starts, sizes) + np.arange(n)).astype(dtype)


class _EpochStream:
  """Epoch after epoch of `epoch_order`s: position -> (record, epoch)."""

  def __init__(self, n: int, seed: int, salt: Sequence[int], block: int):
    self.n, self._seed, self._salt, self._block = n, seed, tuple(salt), block
    self._orders: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def _order(self, epoch: int) -> np.ndarray:
    # Computed under the lock: reader threads that need a new epoch wait for
    # one permutation instead of each drawing it.
    with self._lock:
      if epoch not in self._orders:
        self._orders[epoch] = epoch_order(self.n, self._seed, epoch, self._salt,
                                          self._block)
        while len(self._orders) > 3:
          self._orders.popitem(last=False)
      self._orders.move_to_end(epoch)
      return self._orders[epoch]

  def take(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    pos = np.arange(start, start + count, dtype=np.int64)
    epochs, within = np.divmod(pos, self.n)
    records = np.empty(count, np.int64)
    for epoch in np.unique(epochs):
      sel = epochs == epoch
      records[sel] = self._order(int(epoch))[within[sel]]
    return records, epochs


class TrainSource:
  """Training batches for this host, a pure function of (seed, step).

  Args:
    file_pattern: glob (or comma-separated globs) of TFRecord shards.
    global_batch_size: rows of a global batch; this host yields
      global_batch_size // process_count of them per step.
    max_seq_length, max_predictions_per_seq: the record shapes.
    seed: the order's seed.
    process_index, process_count: this host and the number of hosts
      (default: jax's).
    skip_corrupt: skip unreadable records (weight-0 rows, counted) instead of
      raising.
    dynamic_masking: None to use the masks in the records, or a dict of
      dynamic_masking.OPTION_KEYS ({} for the defaults) to mask afresh each
      epoch.
    order: "files" or "global" (see the module docstring).
    shuffle_block: records that move together in the shuffle (1: none).
    vocab_size: the model's vocabulary size: checked against metadata.json,
      and every batch's token ids are checked to be below it (a clear error
      naming the file, rather than a non-finite loss).
    vocab_hash, require_metadata: checked against metadata.json.
    verify_crc: check each record's CRCs.
    read_threads: threads reading records; prefetch: parsed batches kept ready.
    packing: None, or a dict of packing.OPTION_KEYS (rows: packed rows per
      global batch; max_examples_per_row; max_predictions_per_row;
      chunk_steps, default 1) to pack the global_batch_size x chunk_steps
      examples of chunk_steps steps into chunk_steps x rows rows
      (packing.TrainPacker).
  """

  def __init__(self, file_pattern: str, global_batch_size: int, *, max_seq_length: int,
               max_predictions_per_seq: int, seed: int,
               process_index: Optional[int] = None, process_count: Optional[int] = None,
               skip_corrupt: bool = False,
               dynamic_masking: Optional[Mapping[str, Any]] = None,
               order: str = "files", shuffle_block: int = 1,
               vocab_size: Optional[int] = None, vocab_hash: Optional[str] = None,
               require_metadata: bool = False, verify_crc: bool = True,
               read_threads: int = 4, prefetch: int = 4,
               packing: Optional[Mapping[str, int]] = None):
    index, count = process_slot(process_index, process_count, global_batch_size)
    if order not in ORDERS:
      raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if shuffle_block < 1:
      raise ValueError(f"shuffle_block must be >= 1, got {shuffle_block}")
    self.files = list_files(file_pattern)
    self.metadata = check_metadata(
        file_pattern, max_seq_length=max_seq_length,
        max_predictions_per_seq=max_predictions_per_seq, vocab_size=vocab_size,
        vocab_hash=vocab_hash, require=require_metadata)
    masking = masking_config(dynamic_masking, self.metadata, max_predictions_per_seq,
                              seed, file_pattern)
    if order == "files":
      if len(self.files) < count:
        raise ValueError(
            f"file pattern {file_pattern!r} matches {len(self.files)} files but there "
            f"are {count} processes, and order='files' gives each its own files; "
            "write at least that many shards (a multiple of it balances them) or "
            "use order='global'.")
      numbers, salt = list(range(index, len(self.files), count)), (1, count, index)
      _warn_if_unbalanced(self.files, count, self.metadata)
    else:
      numbers, salt = list(range(len(self.files))), (2,)
    if shuffle_block == 1 and any(fileio.is_remote(f) for f in self.files):
      logging.warning("Reading single records at random from remote files is "
                      "slow; consider shuffle_block=256.")
    self.host_files = [self.files[i] for i in numbers]
    self.order, self.seed = order, seed
    self.global_batch_size = global_batch_size
    self.host_batch_size = global_batch_size // count
    self.process_index, self.process_count = index, count
    self._records = batch_reader.Records(self.files, numbers, skip_corrupt,
                                         verify_crc, read_threads)
    if not len(self._records):
      raise ValueError(f"file pattern {file_pattern!r}: no records to read on "
                       f"process {index}.")
    self._stream = _EpochStream(len(self._records), seed, salt, shuffle_block)
    self.packing, self._packer = None, None
    rows, batch_size = self._rows, self.host_batch_size
    if packing is not None:
      packing = dict(packing)
      chunk_steps = int(packing.pop("chunk_steps", 1))
      self.packing = packing_lib.from_options(
          packing, process_count=count, max_seq_length=max_seq_length,
          max_predictions_per_seq=max_predictions_per_seq)
      self._packer = packing_lib.TrainPacker(self.packing, chunk_steps, seed)
      rows, batch_size = self._chunk_rows, self.host_batch_size * chunk_steps
    self._batches = batch_reader.HostBatches(
        self._records, rows, batch_size, max_seq_length,
        max_predictions_per_seq, skip_corrupt=skip_corrupt, masking=masking,
        read_threads=read_threads, prefetch=prefetch, vocab_size=vocab_size,
        transform=self._packer)
    batch_reader.check_first_record(self._records, max_seq_length, max_predictions_per_seq)

  @property
  def num_records(self) -> int:
    """Records this host reads per epoch (all of them with order='global')."""
    return len(self._records)

  def _start(self, step: int) -> int:
    if self.order == "files":
      return step * self.host_batch_size
    return step * self.global_batch_size + self.process_index * self.host_batch_size

  def _rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    return self._stream.take(self._start(step), self.host_batch_size)

  def _chunk_rows(self, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """The records of packing chunk `chunk`: those of its steps, unpacked."""
    k = self._packer.chunk_steps
    parts = [self._rows(chunk * k + i) for i in range(k)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

  def epoch_at(self, step: int) -> int:
    """The epoch of the first row of this host's batch at `step`."""
    return self._start(step) // len(self._records)

  def iterate(self, start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Host batches for global steps start_step, start_step + 1, ... (endless)."""
    if start_step < 0:
      raise ValueError(f"start_step must be >= 0, got {start_step}")
    if self._packer is None:
      return self._batches.iterate(start_step)
    return self._packed_steps(start_step)

  def _packed_steps(self, start_step: int) -> Iterator[dict[str, np.ndarray]]:
    k = self._packer.chunk_steps
    chunks = self._batches.iterate(start_step // k)
    try:
      skip = start_step % k
      for packed in chunks:
        yield from self._packer.steps(packed)[skip:]
        skip = 0
    finally:
      chunks.close()

  def stats(self) -> dict[str, int]:
    """Counts for this process since the source was made, each summable over
    hosts: skipped_records (with skip_corrupt: broken frames left out when
    indexing, each one record or, where no intact frame follows, the rest of
    its file; plus corrupt records read as weight-0 rows, once per read),
    read_retries (further tries of reads after transient I/O errors) and,
    with packing, packing_overflow (examples left out of their step)."""
    return self._batches.stats()


def process_slot(index: Optional[int], count: Optional[int],
                 global_batch_size: Optional[int] = None) -> tuple[int, int]:
  """(process index, process count): the given ones, or jax's where None.

  With global_batch_size, also checks that the processes share it evenly:
  each takes global_batch_size // count rows of every global batch.
  """
  if index is None or count is None:
    import jax  # pylint: disable=g-import-not-at-top
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
  if not 0 <= index < count:
    raise ValueError(f"process_index {index} is not in [0, {count}).")
  if global_batch_size is not None and (global_batch_size <= 0 or global_batch_size % count):
    raise ValueError(f"global batch size {global_batch_size} is not a positive "
                     f"multiple of the {count} processes; change the batch size.")
  return index, count


def masking_config(options, metadata, max_predictions_per_seq, seed, file_pattern):
  """The dynamic-masking config of `options` (None: the records' own masks,
  refused for records made without masks)."""
  if options is not None:
    return masking_lib.from_options(options, max_predictions_per_seq=max_predictions_per_seq,
                                    seed=seed, metadata=metadata)
  if (metadata is not None and metadata.masking.get("premasked") is False
      and metadata.objective != "ltr"):  # ltr predicts every next token: no masks.
    raise ValueError(f"{file_pattern}: metadata says the records carry no masks; "
                     "set dynamic_masking (e.g. {}) to mask them as they are read.")
  return None


def _warn_if_unbalanced(files: Sequence[str], count: int,
                        metadata: Optional[schema.DatasetMetadata]) -> None:
  sizes = {f["name"]: f["num_instances"] for f in (metadata.files if metadata else [])
           if "name" in f and "num_instances" in f}
  names = [os.path.basename(f) for f in files]
  if all(name in sizes for name in names):
    per_host = [sum(sizes[name] for name in names[h::count]) for h in range(count)]
    if max(per_host) > 1.02 * max(1, min(per_host)):
      logging.warning("Records per process range from %d to %d: with order='files' "
                      "the smaller shards repeat more often. Use a number of equal "
                      "shards divisible by the process count, or order='global'.",
                      min(per_host), max(per_host))
  elif len(files) % count:
    logging.warning("%d files do not split evenly over %d processes: with "
                    "order='files' some processes' records repeat more often.",
                    len(files), count)
