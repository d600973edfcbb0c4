"""Evaluation batches from pre-masked TFRecords: every record once, in file order.

The records are read as the training pipeline reads them (pipeline.py: by
offset, both CRCs checked, parsed and masked by tf.data), but in the sorted
files' order without shuffling or repeating, and the last batch is padded
with rows of weight 0, so a metric summed over the batches counts every
example exactly once, on any number of hosts. With packing, the records'
lengths are read first and the packing is planned over all of them
(packing.sequential_plan), so none is left out.
"""

import functools
from typing import Any, Mapping, Optional

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
                 packing: Optional[Mapping[str, int]] = None) -> EvalBatches:
  """Evaluation batches: every record once, in file order, no repeat.

  Global batch g is records [g*B, (g+1)*B) of the sorted files and host h
  takes rows [h*b, (h+1)*b) of it, so the global batches do not depend on the
  number of hosts and every host yields ceil(N / B) batches (at most
  max_batches); rows past the last record are padding with
  next_sentence_weights = masked_lm_weights = 0. With dynamic_masking the
  mask is that of epoch 0 (seed 0 unless given), the same on every call.
  Records with metadata.json have its max_predictions_per_seq (the model
  reads any number of predictions: an MLM-only model trained at 30% masking
  evaluates on records masked at 15%); the argument is for records without.
  skip_corrupt and vocab_size as for TrainSource; the returned iterator's
  `stats()` counts skipped records and read retries.

  With `packing` (as for TrainSource; rows per global batch), the records
  are first read once for their lengths, then packed in file order into
  batches of that many rows, each batch closing when the next record fits
  in none of its rows (packing.sequential_plan): every record exactly once,
  the same global batches for any number of hosts, host h taking rows
  [h*r, (h+1)*r). max_batches counts packed batches.
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
  num_batches = -(-n // global_batch_size)
  if max_batches is not None:
    num_batches = min(num_batches, max_batches)

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
    packer = _eval_packer(reader, n, packing, index, count, max_seq_length,
                          max_predictions_per_seq, max_batches)
    return EvalBatches(reader(packer.rows, packer.slots, transform=packer),
                       packer.num_batches)
  return EvalBatches(reader(rows, b), num_batches)


_SIZES_BATCH = 256  # Records per batch of the pass that reads eval records' sizes.


def _eval_packer(reader, n, options, index, count, max_seq_length, max_predictions_per_seq,
                 max_batches) -> packing_lib.EvalPacker:
  """The packing plan of the eval records, from one pass over all of them."""
  p = packing_lib.from_options(options, process_count=count, max_seq_length=max_seq_length,
                               max_predictions_per_seq=max_predictions_per_seq)

  def all_rows(step):
    pos = step * _SIZES_BATCH + np.arange(_SIZES_BATCH, dtype=np.int64)
    return np.where(pos < n, pos, -1), np.zeros(_SIZES_BATCH, np.int64)
  sizes = [packing_lib.example_sizes(batch) for batch in
           reader(all_rows, _SIZES_BATCH).iterate(0, -(-n // _SIZES_BATCH))]
  tokens, predictions, real = (np.concatenate([s[i] for s in sizes])[:n] if sizes
                               else np.zeros(0, np.int64) for i in range(3))
  return packing_lib.EvalPacker(p, tokens, predictions, real.astype(bool), index, count,
                                max_batches)
