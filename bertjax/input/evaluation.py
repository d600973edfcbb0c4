"""Evaluation batches from pre-masked TFRecords: every record once, none repeated.

The records are read as the training pipeline reads them (pipeline.py: by
offset, both CRCs checked, parsed and masked by tf.data), but in the sorted
files' order without shuffling or repeating, and the last batch is padded
with rows of weight 0, so a metric summed over the batches counts every
example exactly once, on any number of hosts. With packing, each host reads
the sizes of its own contiguous share of the records scored and plans the
packing of that share alone (packing.EvalPacker), so none is left out and a
host's size pass costs its share, not the whole set; the hosts then agree
on the most batches any of them needs. A limit on the batches selects the
same records packed or not: the first max_batches x global_batch_size.
"""


import functools
from typing import Any, Callable, Mapping, Optional

import numpy as np

from bertjax.input import batch_reader
from bertjax.input import packing as packing_lib
from bertjax.input import pipeline


class EvalBatches:
  """An iterator of evaluation batches (see `eval_batches`) with `stats()`."""

  def __init__(self, batches: batch_reader.HostBatches, num_batches: int):
    self._batches = batches
    self._it = batches.iterate(0, num_batches)
    self.num_batches = num_batches

  def __iter__(self) -> "EvalBatches":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._it)

  def close(self) -> None:
    self._it.close()

  def stats(self) -> dict[str, int]:
    """As TrainSource.stats: skipped_records and read_retries so far."""
    return self._batches.stats()


def eval_batches(file_pattern: str, global_batch_size: int, *, max_seq_length: int,
                 max_predictions_per_seq: int, process_index: Optional[int] = None,
                 process_count: Optional[int] = None, max_batches: Optional[int] = None,
                 skip_corrupt: bool = False,
                 dynamic_masking: Optional[Mapping[str, Any]] = None,
                 vocab_size: Optional[int] = None, verify_crc: bool = True,
                 read_threads: int = 4,
                 packing: Optional[Mapping[str, int]] = None,
                 agree: Optional[Callable[[int], int]] = None) -> EvalBatches:
  """Evaluation batches: every record once, no repeat (unpacked: in file order).

  Unpacked, global batch g is records [g*B, (g+1)*B) of the sorted files and
  host h takes rows [h*b, (h+1)*b) of it, so the global batches do not depend
  on the number of hosts and every host yields ceil(N / B) batches; rows past the
  last record are padding with example_weights = masked_lm_weights = 0.
  max_batches, if given, keeps the first max_batches x B records (N above),
  packed or not, so packed and unpacked runs score the same examples.
  With dynamic_masking the mask is that of epoch 0 (seed 0 unless given),
  the same on every call.
  Records with metadata.json have its max_predictions_per_seq (the model
  reads any number of predictions: an MLM-only model trained at 30% masking
  evaluates on records masked at 15%); the argument is for records without.
  skip_corrupt and vocab_size as for TrainSource; the returned iterator's
  `stats()` counts skipped records and read retries.

  With `packing` (as for TrainSource; R rows per global batch, r = R / P
  per host of P), host h takes the contiguous share [h*N//P, (h+1)*N//P)
  of the N records, reads the sizes of those records only and packs them
  first-fit decreasing into as many rows as they take (packing.first_fit);
  its batch g is rows [g*r, (g+1)*r) of them. Each batch is a collective
  over all the devices, so every host runs the same number of batches:
  `agree` maps this host's count, ceil(own rows / r), to the count all
  hosts run (the max over hosts); None: the count itself where one process
  runs, else the max over jax's processes (process_allgather). A host with
  fewer rows pads its last batches with rows of weight 0. Every record is
  scored exactly once, but which records share a global batch now depends
  on the number of hosts; evaluation reports sums over the whole set, so
  no figure changes beyond float rounding. Unpacked batches ignore `agree`.
  """
  index, count = pipeline.process_slot(process_index, process_count)
  if global_batch_size <= 0 or global_batch_size % count:
    raise ValueError(f"eval batch size {global_batch_size} is not a positive multiple "
                     f"of the {count} processes; change the batch size.")
  files = pipeline.list_files(file_pattern)
  metadata = pipeline.check_metadata(file_pattern, max_seq_length=max_seq_length,
                            max_predictions_per_seq=None, vocab_size=vocab_size)
  if metadata is not None:
    max_predictions_per_seq = metadata.max_predictions_per_seq
  masking = pipeline.masking_config(dynamic_masking, metadata, max_predictions_per_seq, 0,
                            file_pattern)
  records = batch_reader.Records(files, range(len(files)), skip_corrupt, verify_crc,
                                 read_threads)
  n, b = len(records), global_batch_size // count
  if max_batches is not None:
    if max_batches < 0:
      raise ValueError(f"max_batches (logging.eval_batches) must be 0 or more, got "
                       f"{max_batches}")
    n = min(n, max_batches * global_batch_size)
  num_batches = -(-n // global_batch_size)

  def rows(step):
    pos = step * global_batch_size + index * b + np.arange(b, dtype=np.int64)
    return np.where(pos < n, pos, -1), np.zeros(b, np.int64)

  if n:
    batch_reader.check_first_record(records, max_seq_length, max_predictions_per_seq)
  reader = functools.partial(
      batch_reader.HostBatches, records, max_seq_length=max_seq_length,
      max_predictions_per_seq=max_predictions_per_seq, skip_corrupt=skip_corrupt,
      masking=masking, read_threads=read_threads, prefetch=2, vocab_size=vocab_size)
  if packing is not None:
    start, stop = index * n // count, (index + 1) * n // count
    packer = _eval_packer(reader, start, stop, packing, count, max_seq_length,
                          max_predictions_per_seq)
    agreed = (agree or _max_over_processes)(packer.num_batches)
    if agreed < packer.num_batches:
      raise ValueError(f"eval_batches: the agreed {agreed} packed batches are fewer than "
                       f"the {packer.num_batches} that host {index} needs; `agree` must "
                       "return the max over the hosts.")
    return EvalBatches(reader(packer.rows, packer.slots, transform=packer), agreed)
  return EvalBatches(reader(rows, b), num_batches)


def _max_over_processes(num_batches: int) -> int:
  """The most packed eval batches any of jax's processes needs."""
  import jax  # pylint: disable=g-import-not-at-top  # The input layer runs without it.
  if jax.process_count() == 1:
    return num_batches
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return int(np.max(multihost_utils.process_allgather(np.int64(num_batches))))


_SIZES_BATCH = 256  # Records per batch of the pass that reads eval records' sizes.


def _eval_packer(reader, start, stop, options, count, max_seq_length,
                 max_predictions_per_seq) -> packing_lib.EvalPacker:
  """This host's packing plan of eval records [start, stop), from one pass
  over those records only."""
  p = packing_lib.from_options(options, process_count=count, max_seq_length=max_seq_length,
                               max_predictions_per_seq=max_predictions_per_seq)
  n = stop - start

  def share_rows(step):
    pos = start + step * _SIZES_BATCH + np.arange(_SIZES_BATCH, dtype=np.int64)
    return np.where(pos < stop, pos, -1), np.zeros(_SIZES_BATCH, np.int64)
  sizes = [packing_lib.example_sizes(batch) for batch in
           reader(share_rows, _SIZES_BATCH).iterate(0, -(-n // _SIZES_BATCH))]
  tokens, predictions, real = (np.concatenate([s[i] for s in sizes])[:n] if sizes
                               else np.zeros(0, np.int64) for i in range(3))
  return packing_lib.EvalPacker(p, tokens, predictions, real.astype(bool), first_record=start)
