"""Reads, checks and parses host batches of records with tf.data.

`HostBatches` turns a function step -> record indices into batches: Python
threads read the records by offset (tfrecord.RecordReader, CRCs checked),
tf.data parses each batch with tf.io.parse_example (vectorised), casts it to
int32, masks it afresh when asked (dynamic_masking) and prefetches. Batch
`step` depends only on `step`, so any step can be re-read, which is how a
record that fails to parse is found and named.
"""

import atexit
import collections
import concurrent.futures
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

from absl import logging
import numpy as np

from bertjax.input import dynamic_masking as masking_lib
from bertjax.input import packing
from bertjax.records import fileio
from bertjax.records import hostmem
from bertjax.records import schema
from bertjax.records import tfrecord

KEY_FILE_SHIFT = 40  # example key = file number << 40 | record number in file


def describe_mismatch(serialized: bytes, max_seq_length: int,
                      max_predictions_per_seq: int) -> Optional[str]:
  """What makes a serialized record unlike the schema; None if nothing."""
  tf = fileio.tensorflow()
  try:
    feats = tf.train.Example.FromString(serialized).features.feature
  except Exception as e:  # pylint: disable=broad-except
    return f"not a tf.train.Example ({e})"
  problems = []
  for name, (dtype, key) in schema.FEATURES.items():
    want_kind = "float_list" if dtype == "float32" else "int64_list"
    want = schema.feature_length(name, max_seq_length, max_predictions_per_seq)
    kind = feats[name].WhichOneof("kind") if name in feats else None
    if kind is None:
      problems.append(f"{name} is missing")
    elif kind != want_kind:
      problems.append(f"{name} is a {kind}, not a {want_kind}")
    elif len(getattr(feats[name], kind).value) != want:
      problems.append(f"{name} has {len(getattr(feats[name], kind).value)} values "
                      f"where {key}={want} needs {want}")
  return "; ".join(problems) or None


class Records:
  """The records of some of the files, numbered in file order."""

  def __init__(self, files: Sequence[str], file_numbers: Sequence[int],
               skip_corrupt: bool, verify_crc: bool, threads: int):
    self.reader = tfrecord.RecordReader(files, verify_crc=verify_crc)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
      indexes = list(pool.map(
          lambda i: tfrecord.load_index(files[i], skip_corrupt=skip_corrupt,
                                        on_retry=self.reader.count_retry),
          file_numbers))
    sizes = np.array([len(ix) for ix in indexes], np.int64)
    self.file_numbers = np.asarray(file_numbers, np.int64)
    self.starts = np.concatenate(([0], np.cumsum(sizes)))
    self.offsets = np.concatenate([ix.offsets for ix in indexes] + [np.zeros(0, np.int64)])
    self.lengths = np.concatenate([ix.lengths for ix in indexes]
                                  + [np.zeros(0, np.int64)]).astype(np.int32)
    self.dropped = sum(ix.dropped for ix in indexes)

  def __len__(self) -> int:
    return len(self.offsets)

  def locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(file number, record number within the file) of records `idx`."""
    slot = np.searchsorted(self.starts, idx, side="right") - 1
    return self.file_numbers[slot], idx - self.starts[slot]

  def read(self, idx: np.ndarray) -> tuple[list, np.ndarray, np.ndarray]:
    """(data or CorruptRecordError per record, file numbers, example keys)."""
    files, numbers = self.locate(idx)
    data = self.reader.read(files, self.offsets[idx], self.lengths[idx])
    return data, files, (files << KEY_FILE_SHIFT) | numbers


def _feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict[str, Any]:
  tf = fileio.tensorflow()
  return {name: tf.io.FixedLenFeature(
      [schema.feature_length(name, max_seq_length, max_predictions_per_seq)],
      tf.float32 if dtype == "float32" else tf.int64)
          for name, (dtype, _) in schema.FEATURES.items()}


def _padding_example(max_seq_length: int, max_predictions_per_seq: int) -> bytes:
  """A valid all-zero example, the stand-in for padding rows."""
  tf = fileio.tensorflow()
  feature = {}
  for name, (dtype, _) in schema.FEATURES.items():
    n = schema.feature_length(name, max_seq_length, max_predictions_per_seq)
    feature[name] = (tf.train.Feature(float_list=tf.train.FloatList(value=[0.0] * n))
                     if dtype == "float32" else
                     tf.train.Feature(int64_list=tf.train.Int64List(value=[0] * n)))
  return tf.train.Example(
      features=tf.train.Features(feature=feature)).SerializeToString()


class HostBatches:
  """Reads, checks and parses host batches; `rows(step)` says which records.

  rows(step) -> (record indices [b] with -1 for padding, epochs [b]).
  With `vocab_size`, a batch holding a token id >= vocab_size raises
  ValueError naming the record's file and the id. `transform(step, batch)`,
  if given, turns each checked batch into the one delivered (packing.py's
  packers); its stats(), if any, join stats().
  """

  def __init__(self, records: Records, rows: Callable[[int], tuple[np.ndarray, np.ndarray]],
               batch_size: int, max_seq_length: int, max_predictions_per_seq: int, *,
               skip_corrupt: bool, masking: Optional[masking_lib.MaskingConfig],
               read_threads: int, prefetch: int, vocab_size: Optional[int] = None,
               transform: Optional[Callable[[int, dict], dict]] = None):
    self._records, self._rows, self._b = records, rows, batch_size
    self._transform = transform
    self._lengths = (max_seq_length, max_predictions_per_seq)
    self._skip_corrupt, self._masking = skip_corrupt, masking
    self._threads, self._prefetch = read_threads, prefetch
    self._vocab_size = vocab_size
    self._spec = _feature_spec(max_seq_length, max_predictions_per_seq)
    self._padding = _padding_example(max_seq_length, max_predictions_per_seq)
    self.corrupt_skipped = 0
    self.last_step: Optional[int] = None

  def stats(self) -> dict[str, int]:
    """skipped_records: broken frames left out when indexing plus corrupt
    records skipped in delivered batches (weight-0 rows, once per read);
    read_retries: further tries of reads after transient I/O errors."""
    stats = {"skipped_records": self._records.dropped + self.corrupt_skipped,
             "read_retries": self._records.reader.retries}
    stats.update(getattr(self._transform, "stats", dict)())
    return stats

  def read(self, step: int):
    """(serialized [b], valid [b] float32, example keys [b], epochs [b],
    number of corrupt records skipped)."""
    idx, epochs = self._rows(step)
    real = np.flatnonzero(idx >= 0)
    serialized = np.empty(self._b, dtype=object)
    serialized.fill(self._padding)  # np.full would strip trailing NUL bytes.
    valid = np.zeros(self._b, np.float32)
    keys = np.full(self._b, -1, np.int64)
    skipped = 0
    data, _, keys[real] = self._records.read(idx[real])
    for row, item in zip(real.tolist(), data):
      if isinstance(item, tfrecord.CorruptRecordError):
        if not self._skip_corrupt:
          raise tfrecord.CorruptRecordError(
              item.path, item.offset, item.reason,
              "Pass skip_corrupt=True to skip such records (counted and logged), "
              "or re-create the shard.")
        skipped += 1
        logging.log_every_n(logging.WARNING, "Skipped a corrupt record (weight 0 "
                            "in its batch): %s", 100, item)
        keys[row] = -1
        continue
      serialized[row] = item
      valid[row] = 1.0
    return serialized, valid, keys, epochs, skipped

  def _parse(self, serialized, valid, keys, epochs, skipped):
    tf = fileio.tensorflow()
    out = {}
    for name, value in tf.io.parse_example(serialized, self._spec).items():
      out[name] = tf.cast(value, tf.int32) if value.dtype == tf.int64 else value
    out["next_sentence_labels"] = out["next_sentence_labels"][:, 0]
    out["masked_lm_weights"] = out["masked_lm_weights"] * valid[:, None]
    out[schema.EXAMPLE_WEIGHT_KEY] = valid
    if self._masking is not None:
      names = ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
      cfg = self._masking

      def mask(ids, input_mask, positions, mlm_ids, weights, keys, epochs):
        fields = dict(input_ids=ids, input_mask=input_mask, masked_lm_positions=positions,
                      masked_lm_ids=mlm_ids, masked_lm_weights=weights)
        masked = masking_lib.mask_batch(fields, keys, epochs, cfg)
        return [masked[n] for n in names]
      args = [out[n] for n in ("input_ids", "input_mask", "masked_lm_positions",
                               "masked_lm_ids", "masked_lm_weights")] + [keys, epochs]
      results = tf.numpy_function(mask, args, [tf.int32, tf.int32, tf.int32, tf.float32],
                                  stateful=False)
      for name, value in zip(names, results):
        value.set_shape(out[name].shape)
        out[name] = value
    return out, skipped

  def _explain(self, step: int, error: Exception) -> Exception:
    """Finds the record of batch `step` that failed to parse."""
    tf = fileio.tensorflow()
    idx, _ = self._rows(step)
    real = idx[idx >= 0]
    data, files, keys = self._records.read(real)
    for item, file_number, key in zip(data, files, keys):
      if isinstance(item, bytes):
        try:
          tf.io.parse_example([item], self._spec)
        except tf.errors.OpError:
          path = self._records.reader.paths[file_number]
          number = int(key) & ((1 << KEY_FILE_SHIFT) - 1)
          what = describe_mismatch(item, *self._lengths) or "it does not parse"
          return ValueError(
              f"{path}: record {number} does not match max_seq_length="
              f"{self._lengths[0]}, max_predictions_per_seq={self._lengths[1]}: "
              f"{what}. Check the config against the data.")
    return RuntimeError(f"input pipeline failed at step {step}: {error}")

  def record_name(self, step: int, row: int) -> str:
    """'FILE: record N' of row `row` of batch `step`."""
    idx, _ = self._rows(step)
    file_numbers, numbers = self._records.locate(idx[row:row + 1])
    return f"{self._records.reader.paths[int(file_numbers[0])]}: record {int(numbers[0])}"

  def check_vocab(self, step: int, batch: dict[str, np.ndarray]) -> None:
    """Raises ValueError naming the file if batch `step` holds an id that
    the model's vocabulary (vocab_size) does not have."""
    if self._vocab_size is None:
      return
    largest_R = np.maximum(batch["input_ids"].max(axis=1),
                           batch["masked_lm_ids"].max(axis=1))
    row = int(np.argmax(largest_R))
    largest = int(largest_R[row])
    if largest < self._vocab_size:
      return
    v = self._vocab_size
    raise ValueError(
        f"{self.record_name(step, row)} holds token id {largest}, but the model's vocabulary "
        f"has {v} ids (--config.model.vocab_size={v}); the largest id seen is "
        f"{largest}. Set --config.model.vocab_size to the size of the vocabulary "
        f"the data was made with (at least {largest + 1}), or use data made with "
        "the model's vocabulary.")

  def _dataset(self, start_step: int, stop_step: Optional[int],
               stopping: threading.Event, failure: list):
    """The tf.data pipeline of parsed batches (and skip counts) from start_step."""
    tf = fileio.tensorflow()

    def generate():
      pool = concurrent.futures.ThreadPoolExecutor(self._threads)
      pending = collections.deque()
      step = start_step
      try:
        while not stopping.is_set():
          while len(pending) < 2 * self._threads and (stop_step is None or step < stop_step):
            pending.append(pool.submit(self.read, step))
            step += 1
          if not pending:
            return
          yield pending.popleft().result()
      except Exception as e:
        failure.append(e)
        raise
      finally:
        pool.shutdown(wait=False, cancel_futures=True)

    b = self._b
    signature = (tf.TensorSpec([b], tf.string), tf.TensorSpec([b], tf.float32),
                 tf.TensorSpec([b], tf.int64), tf.TensorSpec([b], tf.int64),
                 tf.TensorSpec([], tf.int64))
    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    ds = ds.map(self._parse, num_parallel_calls=self._threads, deterministic=True)
    options = tf.data.Options()
    # No autotuning: its background thread can miss the cancellation when the
    # iterator is dropped and hold the caller for up to a minute; the
    # parallelism here is fixed anyway.
    options.autotune.enabled = False
    return ds.prefetch(self._prefetch).with_options(options)

  def iterate(self, start_step: int, stop_step: Optional[int] = None
              ) -> Iterator[dict[str, np.ndarray]]:
    failure = []
    stopping = threading.Event()
    it = self._dataset(start_step, stop_step, stopping, failure).as_numpy_iterator()
    token = object()
    _OPEN[token] = (it, stopping)
    step = start_step
    try:
      while stop_step is None or step < stop_step:
        try:
          batch, skipped = next(it)
        except StopIteration:
          return
        except Exception as e:  # pylint: disable=broad-except
          # A parse error (an OpError, or a UnicodeDecodeError when its message
          # quotes binary data), or the reader's error from `failure`.
          if failure:
            raise failure[0] from None
          raise self._explain(step, e) from e
        if step == start_step:
          hostmem.restore_malloc_thresholds()  # Set by the generator's first call.
        self.check_vocab(step, batch)
        if self._transform is not None:
          try:
            batch = self._transform(step, batch)
          except packing.NotRightPadded as e:
            raise ValueError(f"{self.record_name(step, e.example)}: {e}") from None
        self.last_step = step
        self.corrupt_skipped += int(skipped)  # Counted as batches are delivered.
        yield batch
        step += 1
    finally:
      _OPEN.pop(token, None)
      _drain(it, stopping)


# The tf.data iterators of HostBatches.iterate generators not yet finished.
# A generator still open when the interpreter exits is not closed before its
# tf.data iterator is destroyed, which would then wait forever (see _drain).
_OPEN: dict[object, tuple] = {}


@atexit.register
def _drain_open_iterators() -> None:
  """Runs the still-open iterators dry at exit, before the interpreter tears
  them down, so that a process that leaves one open still exits."""
  while _OPEN:
    _drain(*_OPEN.popitem()[1])


def _drain(it, stopping: threading.Event) -> None:
  """Stops and drops a tf.data iterator of `HostBatches._dataset`.

  Destroying a tf.data iterator waits for its threads, and the thread that
  destroys it holds the GIL: a tf.data thread still inside the generator
  would wait for the GIL in turn. So the generator is told to stop and the
  iterator is run dry before it is dropped.
  """
  stopping.set()
  try:
    for _ in it:
      pass
  except Exception:  # pylint: disable=broad-except
    pass  # Its error, if any, was raised by the caller or is of no use now.


def check_first_record(records: Records, max_seq_length: int,
                        max_predictions_per_seq: int) -> None:
  """Fails early, naming the file, when the records have the wrong shapes."""
  (item,), (file_number,), _ = records.read(np.zeros(1, np.int64))
  if isinstance(item, bytes):
    what = describe_mismatch(item, max_seq_length, max_predictions_per_seq)
    if what:
      raise ValueError(
          f"{records.reader.paths[file_number]}: record 0 does not match "
          f"max_seq_length={max_seq_length}, max_predictions_per_seq="
          f"{max_predictions_per_seq}: {what}. Check the config against the data.")
