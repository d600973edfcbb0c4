"""Faults in the training input, on real data files: corrupt and truncated
records in the middle of a shard, transient read failures, temporaries left by
interrupted writes, token ids beyond the model's vocabulary."""

import errno
import glob
import hashlib
import os
import re
import shutil
import threading
import types

import numpy as np
import pytest

from bertjax.create import records
from bertjax.input import evaluation
from bertjax.input import pipeline
from bertjax.records import fileio
from bertjax.records import schema
from bertjax.records import tfrecord
import data_utils

L, P, V = 32, 5, 200
FILES, PER_FILE = 4, 60
N = FILES * PER_FILE
BAD_FILE, BAD_RECORD = 2, 17  # A record in the middle of a shard.


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("ds"))
  examples = data_utils.write_dataset(directory, FILES, PER_FILE, L, P, V, seed=0)
  return directory, examples


def source(file_pattern, batch=40, **kw):
  return pipeline.TrainSource(file_pattern, batch, max_seq_length=L,
                              max_predictions_per_seq=P, seed=3, process_index=0,
                              process_count=1, **kw)


def pattern(directory):
  return os.path.join(directory, "part-*.tfrecord")


def one_epoch(src, batch=40):
  return [next(it) for it in [src.iterate(0)] for _ in range(N // batch)]


def real_rows(batches, examples):
  """Example numbers of the rows of weight 1, in the order read."""
  lookup = {data_utils.example_id(e["input_ids"]): i for i, e in enumerate(examples)}
  return [lookup[data_utils.example_id(row)] for b in batches
          for row, w in zip(b["input_ids"], b[schema.EXAMPLE_WEIGHT_KEY]) if w > 0]


def digest(batches):
  h = hashlib.sha256()
  for b in batches:
    for k in sorted(b):
      h.update(k.encode() + b[k].tobytes())
  return h.hexdigest()


def finishes(fn, seconds=60):
  """fn() run in a thread that must end within `seconds` (no hang); returns
  what it raised, or None."""
  raised = []

  def run():
    try:
      fn()
    except BaseException as e:  # pylint: disable=broad-except
      raised.append(e)
  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(seconds)
  assert not thread.is_alive(), f"still running after {seconds} s"
  return raised[0] if raised else None


def damaged_copy(directory, tmp_path, damage, with_index):
  """A copy of the dataset whose shard BAD_FILE has record BAD_RECORD damaged;
  returns (copy, shard path, the record's byte offset)."""
  target = str(tmp_path / "copy")
  shutil.copytree(directory, target)
  path = os.path.join(target, records.shard_name(BAD_FILE, FILES))
  offsets = np.fromfile(path + ".index", "<i8")
  start, end = int(offsets[BAD_RECORD]), int(offsets[BAD_RECORD + 1])
  data = bytearray(open(path, "rb").read())
  if damage == "payload":  # One flipped byte of the record's data.
    data[start + tfrecord.HEADER_BYTES + 10] ^= 0xFF
  elif damage == "length":  # One flipped byte of the frame's length.
    data[start] ^= 0x01
  else:  # "truncated": the record's last 30 bytes (data tail and CRC) gone.
    del data[end - 30:end]
  with open(path, "wb") as f:
    f.write(bytes(data))
  if not with_index:
    for name in glob.glob(os.path.join(target, "*.index")):
      os.remove(name)
  return target, path, start


@pytest.mark.parametrize("with_index", [True, False])
@pytest.mark.parametrize("damage", ["payload", "length", "truncated"])
def test_damaged_record_mid_file_names_file_and_offset_or_is_skipped(
    dataset, tmp_path, damage, with_index):
  directory, examples = dataset
  bad, path, offset = damaged_copy(directory, tmp_path, damage, with_index)
  error = finishes(lambda: one_epoch(source(pattern(bad))))
  assert isinstance(error, tfrecord.CorruptRecordError), error
  assert error.path == path and error.offset == offset
  assert f"{path}: corrupt TFRecord frame at byte offset {offset}" in str(error)

  src = source(pattern(bad), skip_corrupt=True)
  batches = one_epoch(src)
  lost = BAD_FILE * PER_FILE + BAD_RECORD
  # Skipped when read: a weight-0 row; left out of the index: an epoch of
  # N - 1 records. Either way the first N - 1 real rows are one epoch.
  epoch = real_rows(batches, examples)[:N - 1]
  assert sorted(epoch) == sorted(set(range(N)) - {lost})
  assert src.stats() == {"skipped_records": 1, "read_retries": 0}
  evals = evaluation.eval_batches(pattern(bad), 64, max_seq_length=L,
                                max_predictions_per_seq=P, process_index=0,
                                process_count=1, skip_corrupt=True)
  assert len(real_rows(list(evals), examples)) == N - 1
  assert evals.stats() == {"skipped_records": 1, "read_retries": 0}
  # Every other row holds its record as written.
  lookup = {data_utils.example_id(e["input_ids"]): e for e in examples}
  for b in batches:
    for row in np.flatnonzero(b[schema.EXAMPLE_WEIGHT_KEY] > 0):
      want = lookup[data_utils.example_id(b["input_ids"][row])]
      for name in ("masked_lm_ids", "masked_lm_positions", "segment_ids"):
        np.testing.assert_array_equal(b[name][row], want[name])


class FlakyFileSystem:
  """tf.io.gfile's functions over local files, for paths flaky://<local path>.

  The first `failures` reads of each file fail with ECONNRESET, as a reset
  connection to an object store does; `arm()` starts the count again.
  """

  def __init__(self, failures: int):
    self.failures = failures
    self.failed: dict[str, int] = {}
    self._reads: dict[str, int] = {}
    self._lock = threading.Lock()

  def arm(self):
    with self._lock:
      self._reads.clear()

  def maybe_fail(self, path):
    with self._lock:
      self._reads[path] = self._reads.get(path, 0) + 1
      if self._reads[path] <= self.failures:
        self.failed[path] = self.failed.get(path, 0) + 1
        raise ConnectionResetError(errno.ECONNRESET, f"injected failure reading {path}")

  @staticmethod
  def local(path):
    return path[len("flaky://"):]

  def glob(self, pattern):
    return ["flaky://" + p for p in glob.glob(self.local(pattern))]

  def isdir(self, path):
    return os.path.isdir(self.local(path))

  def exists(self, path):
    return os.path.exists(self.local(path))

  def stat(self, path):
    st = os.stat(self.local(path))
    return types.SimpleNamespace(length=st.st_size, mtime_nsec=st.st_mtime_ns)

  def GFile(self, path, mode="rb"):  # pylint: disable=invalid-name
    return _FlakyFile(self, path, open(self.local(path), mode))  # pylint: disable=consider-using-with


class _FlakyFile:

  def __init__(self, fs, path, f):
    self._fs, self._path, self._f = fs, path, f

  def read(self, n=-1):
    self._fs.maybe_fail(self._path)
    return self._f.read(n)

  def seek(self, offset):
    self._f.seek(offset)

  def close(self):
    self._f.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


@pytest.fixture
def flaky():
  fs = FlakyFileSystem(failures=2)
  fileio.register_filesystem("flaky", fs)
  yield fs
  fileio.register_filesystem("flaky", None)


@pytest.mark.slow
@pytest.mark.parametrize("with_index", [True, False])
def test_transient_read_failures_are_retried_and_lose_nothing(dataset, tmp_path, flaky,
                                                              with_index):
  directory, examples = dataset
  target = str(tmp_path / "remote")
  shutil.copytree(directory, target)
  if not with_index:
    for name in glob.glob(os.path.join(target, "*.index")):
      os.remove(name)
  clean = one_epoch(source(pattern(directory), shuffle_block=4))
  # Index building, metadata.json and the record reads each fail twice per
  # file first; skip_corrupt must not turn those failures into skipped records.
  src = source("flaky://" + pattern(target), shuffle_block=4, skip_corrupt=True)
  assert src.files[0].startswith("flaky://") and src.metadata is not None
  at_index = sum(flaky.failed.values())
  flaky.arm()
  batches = one_epoch(src)
  assert digest(batches) == digest(clean)
  assert sorted(real_rows(batches, examples)) == list(range(N))
  shards = {p: n for p, n in flaky.failed.items() if schema.METADATA_FILENAME not in p}
  assert sum(flaky.failed.values()) > at_index
  assert src.stats() == {"skipped_records": 0, "read_retries": sum(shards.values())}


def test_a_read_error_that_is_not_transient_is_raised_not_skipped(dataset, tmp_path,
                                                                   flaky):
  directory, _ = dataset
  target = str(tmp_path / "remote")
  shutil.copytree(directory, target)
  flaky.failures = 0
  src = source("flaky://" + pattern(target), skip_corrupt=True)
  victim = os.path.join(target, records.shard_name(1, FILES))
  os.remove(victim)  # A shard deleted while the run reads it.
  error = finishes(lambda: one_epoch(src))
  assert isinstance(error, FileNotFoundError) and victim in str(error)
  assert src.stats() == {"skipped_records": 0, "read_retries": 0}


def test_dir_star_glob_leaves_out_temporaries_of_interrupted_writes(dataset, tmp_path):
  directory, examples = dataset
  target = str(tmp_path / "out")
  shutil.copytree(directory, target)
  for name in glob.glob(os.path.join(target, "*.index")) + [
      os.path.join(target, schema.METADATA_FILENAME)]:
    os.remove(name)  # `dir/*` must match shards only.

  def interrupted():
    for i, example in enumerate(examples):
      if i == 50:
        raise KeyboardInterrupt  # The writer dies half-way through a shard.
      yield data_utils.serialize(example)
  shards = {records.shard_name(i, FILES) for i in range(FILES)}
  with pytest.raises(KeyboardInterrupt):
    records.write_shard(os.path.join(target, records.shard_name(4, 5)), interrupted())
  assert set(os.listdir(target)) == shards  # The writer removed its temporaries.
  # Names that writers killed part-way leave: this writer's (hidden, with the
  # process id) and other writers'.
  killed = os.path.basename(fileio.temporary_path(records.shard_name(4, 5)))
  for name in (killed, "part-00009.tfrecord.tmp-4242", "part-00010.tfrecord.tmp",
               ".part-00011.tfrecord.tmp-77"):
    shutil.copy(os.path.join(target, records.shard_name(0, FILES)),
                os.path.join(target, name))
  leftovers = set(os.listdir(target)) - shards
  assert len(leftovers) == 4, leftovers
  src = source(os.path.join(target, "*"))
  assert [os.path.basename(f) for f in src.files] == [
      records.shard_name(i, FILES) for i in range(FILES)]
  assert sorted(real_rows(one_epoch(src), examples)) == list(range(N))


def test_token_ids_beyond_the_model_vocab_name_the_flag_file_and_id(dataset, tmp_path):
  directory, examples = dataset
  plain = str(tmp_path / "plain")  # As the original release's: no metadata.
  shutil.copytree(directory, plain)
  os.remove(os.path.join(plain, schema.METADATA_FILENAME))
  vocab = 150
  with pytest.raises(ValueError, match=r"--config.model.vocab_size=150.*largest id "
                     r"seen is (\d+)") as raised:
    next(source(pattern(plain), vocab_size=vocab).iterate(0))
  message = str(raised.value)
  largest = int(re.search(r"largest id seen is (\d+)", message).group(1))
  path, number = message.split(": record ")[0], int(message.split(": record ")[1].split()[0])
  example = [e for e in examples if e["file"].endswith(os.path.basename(path))
             and e["record"] == number][0]
  assert largest >= vocab and os.path.dirname(path) == plain
  assert largest == max(example["input_ids"].max(), example["masked_lm_ids"].max())
  # Ids below the vocab size read as before; with metadata the check is earlier.
  assert next(source(pattern(plain), vocab_size=V).iterate(0))
  with pytest.raises(ValueError, match=r"metadata.json: vocab_size is 200 .*"
                     r"--config.model.vocab_size=150"):
    source(pattern(directory), vocab_size=vocab)
  evals = evaluation.eval_batches(pattern(plain), 40, max_seq_length=L,
                                max_predictions_per_seq=P, process_index=0,
                                process_count=1, vocab_size=vocab)
  with pytest.raises(ValueError, match="--config.model.vocab_size=150"):
    list(evals)
