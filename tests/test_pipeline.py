"""Tests of the host input pipeline (bertjax/input/pipeline.py)."""

import hashlib
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from bertjax.create import records
from bertjax.input import device as device_lib
from bertjax.input import evaluation
from bertjax.input import pipeline
from bertjax.records import schema
from bertjax.records import tfrecord
import data_utils

L, P, V = 32, 5, 200
FILES, PER_FILE = 4, 100
N = FILES * PER_FILE


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("ds"))
  examples = data_utils.write_dataset(directory, FILES, PER_FILE, L, P, V, seed=0)
  return directory, examples


def pattern(directory):
  return os.path.join(directory, "part-*.tfrecord")


def source(directory, batch, **kw):
  kw.setdefault("process_index", 0)
  kw.setdefault("process_count", 1)
  return pipeline.TrainSource(pattern(directory), batch, max_seq_length=L,
                              max_predictions_per_seq=P, seed=kw.pop("seed", 7), **kw)


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def digest(batch):
  h = hashlib.sha256()
  for k in sorted(batch):
    h.update(k.encode() + batch[k].tobytes())
  return h.hexdigest()


def ids_of(batches, examples, real_only=True):
  """Example numbers of the rows of `batches`, in order."""
  lookup = {data_utils.example_id(e["input_ids"]): i for i, e in enumerate(examples)}
  out = []
  for b in batches:
    for row, w in zip(b["input_ids"], b[schema.EXAMPLE_WEIGHT_KEY]):
      if w > 0 or not real_only:
        out.append(lookup[data_utils.example_id(row)])
  return out


def test_batches_have_the_model_shapes_and_the_written_values(dataset):
  directory, examples = dataset
  batch = next(source(directory, 16).iterate(0))
  for name, (shape, dtype) in schema.batch_shapes(16, L, P).items():
    assert batch[name].shape == shape and batch[name].dtype == dtype, name
  for row, i in enumerate(ids_of([batch], examples)):
    for name in schema.FEATURES:
      want = examples[i][name].reshape(-1)
      got = batch[name][row].reshape(-1)
      np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=name)
  assert np.all(batch[schema.EXAMPLE_WEIGHT_KEY] == 1.0)


@pytest.mark.parametrize("order,block", [("files", 1), ("global", 1), ("files", 8)])
def test_every_example_once_per_epoch_and_new_order_each_epoch(dataset, order, block):
  directory, examples = dataset
  src = source(directory, 48, order=order, shuffle_block=block)
  # 48 does not divide 400: batch 8 straddles the epoch boundary.
  seen = ids_of(take(src.iterate(0), 17), examples)
  epoch0, epoch1 = seen[:N], seen[N:2 * N]
  assert sorted(epoch0) == list(range(N))
  assert sorted(epoch1) == list(range(N))
  assert epoch0 != epoch1
  assert src.epoch_at(8) == 0 and src.epoch_at(9) == 1
  assert src.stats() == {"skipped_records": 0, "read_retries": 0}


@pytest.mark.parametrize("order", ["files", "global"])
def test_resume_gives_bit_identical_batches(dataset, order):
  directory, _ = dataset
  src = source(directory, 48, order=order)
  full = [digest(b) for b in take(src.iterate(0), 12)]
  # Mid-epoch, the batch straddling the boundary, and the first one after it.
  for start in (3, 8, 9):
    resumed = source(directory, 48, order=order)
    assert [digest(b) for b in take(resumed.iterate(start), 12 - start)] == full[start:]
  other_seed = source(directory, 48, order=order, seed=8)
  assert digest(next(other_seed.iterate(0))) != full[0]


def test_files_order_gives_hosts_disjoint_files_and_all_examples(dataset):
  directory, examples = dataset
  hosts = [source(directory, 40, process_index=h, process_count=2) for h in range(2)]
  assert set(hosts[0].host_files).isdisjoint(hosts[1].host_files)
  assert sorted(hosts[0].host_files + hosts[1].host_files) == sorted(hosts[0].files)
  per_host = []
  for src in hosts:
    assert src.host_batch_size == 20 and src.num_records == N // 2
    rows = ids_of(take(src.iterate(0), N // 2 // 20), examples)
    assert len(set(rows)) == len(rows) == N // 2  # One host-epoch, each once.
    assert {examples[i]["file"] for i in rows} == set(src.host_files)
    per_host.append(set(rows))
  assert per_host[0].isdisjoint(per_host[1])
  assert per_host[0] | per_host[1] == set(range(N))


def test_global_order_does_not_depend_on_the_number_of_hosts(dataset):
  directory, _ = dataset
  one = take(source(directory, 48, order="global").iterate(5), 5)
  for count in (2, 3):
    hosts = [take(source(directory, 48, order="global", process_index=h,
                         process_count=count).iterate(5), 5) for h in range(count)]
    for step in range(5):
      for name in one[step]:
        stacked = np.concatenate([hosts[h][step][name] for h in range(count)])
        np.testing.assert_array_equal(stacked, one[step][name])


def test_bad_host_configurations_raise(dataset):
  directory, _ = dataset
  with pytest.raises(ValueError, match="part-\\*.tfrecord.*matches 4 files.*8 processes"):
    source(directory, 64, process_index=0, process_count=8)
  assert source(directory, 64, process_index=7, process_count=8, order="global")
  with pytest.raises(ValueError, match="not a positive multiple"):
    source(directory, 41, process_index=0, process_count=2)
  with pytest.raises(FileNotFoundError, match="nothing-here"):
    pipeline.TrainSource(os.path.join(directory, "nothing-here*"), 8, max_seq_length=L,
                         max_predictions_per_seq=P, seed=0, process_index=0,
                         process_count=1)


@pytest.mark.parametrize("field,kwargs", [
    ("max_seq_length", dict(max_seq_length=64)),
    ("max_predictions_per_seq", dict(max_predictions_per_seq=6)),
    ("vocab_size", dict(vocab_size=V - 1)),
    ("vocab_hash", dict(vocab_hash="sha256:0000000000000000")),
])
def test_metadata_mismatch_names_the_directory_and_field(dataset, field, kwargs):
  directory, _ = dataset
  args = dict(max_seq_length=L, max_predictions_per_seq=P, vocab_size=V,
              vocab_hash=schema.vocab_hash(data_utils.vocab_tokens(V)))
  assert pipeline.check_metadata(pattern(directory), **args).max_seq_length == L
  args.update(kwargs)
  with pytest.raises(ValueError, match=f"{directory}.*{field} is"):
    pipeline.check_metadata(pattern(directory), **args)


def test_original_release_files_without_index_or_metadata(dataset, tmp_path):
  directory, _ = dataset
  plain = str(tmp_path)
  examples = data_utils.write_dataset(plain, 2, 60, L, P, V, seed=3, with_index=False,
                                      with_metadata=False)
  assert not [f for f in os.listdir(plain) if not f.endswith(".tfrecord")]
  src = pipeline.TrainSource(pattern(plain), 24, max_seq_length=L,
                             max_predictions_per_seq=P, seed=0, process_index=0,
                             process_count=1)
  assert src.metadata is None
  assert sorted(ids_of(take(src.iterate(0), 5), examples)) == list(range(120))
  # The index built by scanning equals the written index of the same framing.
  indexed = os.path.join(directory, "part-00000-of-00004.tfrecord")
  scanned = tfrecord._scan(indexed, os.path.getsize(indexed), False)
  np.testing.assert_array_equal(scanned.offsets, np.fromfile(indexed + ".index", "<i8"))
  np.testing.assert_array_equal(scanned.offsets, tfrecord.load_index(indexed).offsets)
  with pytest.raises(ValueError, match="no metadata.json"):
    pipeline.check_metadata(pattern(plain), max_seq_length=L, max_predictions_per_seq=P,
                            require=True)


def test_remote_files_through_tf_gfile(dataset):
  """gs:// and other remote paths go through tf.io.gfile (here TF's ram://)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  directory, examples = dataset
  # Sorted: TF's ram:// loses a file written after another that it prefixes.
  for name in sorted(os.listdir(directory)):
    if name != "part-00001-of-00004.tfrecord.index":  # That shard gets scanned.
      tf.io.gfile.copy(os.path.join(directory, name), "ram://remote/" + name, True)
  src = pipeline.TrainSource("ram://remote/part-*.tfrecord", 40, max_seq_length=L,
                             max_predictions_per_seq=P, seed=7, process_index=0,
                             process_count=1, shuffle_block=8)
  assert src.metadata is not None and src.files[0].startswith("ram://")
  assert sorted(ids_of(take(src.iterate(0), N // 40), examples)) == list(range(N))
  local = source(directory, 40, shuffle_block=8)
  assert digest(next(local.iterate(3))) == digest(next(src.iterate(3)))


def test_wrong_shapes_without_metadata_name_the_file(tmp_path):
  data_utils.write_dataset(str(tmp_path / "a"), 1, 30, L, P, V, seed=1,
                           with_metadata=False)
  with pytest.raises(ValueError, match="part-00000-of-00001.tfrecord: record 0.*"
                     "input_ids has 32 values where max_seq_length=48"):
    pipeline.TrainSource(pattern(str(tmp_path / "a")), 8, max_seq_length=48,
                         max_predictions_per_seq=P, seed=0, process_index=0,
                         process_count=1)
  # A later file of another length is found when its batch fails to parse.
  mixed = str(tmp_path / "mixed")
  data_utils.write_dataset(mixed, 2, 30, L, P, V, seed=1, with_metadata=False)
  data_utils.write_dataset(str(tmp_path / "b"), 2, 30, 16, P, V, seed=2,
                           with_metadata=False)
  for suffix in ("", ".index"):
    shutil.copy(str(tmp_path / "b" / ("part-00001-of-00002.tfrecord" + suffix)),
                os.path.join(mixed, "part-00001-of-00002.tfrecord" + suffix))
  src = pipeline.TrainSource(pattern(mixed), 60, max_seq_length=L,
                             max_predictions_per_seq=P, seed=0, process_index=0,
                             process_count=1)
  with pytest.raises(ValueError, match="part-00001-of-00002.tfrecord: record .*"
                     "input_ids has 16 values"):
    next(src.iterate(0))


def _copy(directory, tmp_path):
  target = str(tmp_path / "copy")
  shutil.copytree(directory, target)
  return target


@pytest.mark.parametrize("with_index", [True, False])
def test_file_truncated_at_the_end_fails_with_the_file_name_or_is_skipped(dataset, tmp_path,
                                                               with_index):
  directory, examples = dataset
  bad = _copy(directory, tmp_path)
  path = os.path.join(bad, "part-00003-of-00004.tfrecord")
  if not with_index:
    for f in os.listdir(bad):
      if f.endswith(".index"):
        os.remove(os.path.join(bad, f))
  os.truncate(path, os.path.getsize(path) - 7)
  with pytest.raises(tfrecord.CorruptRecordError, match=f"{path}: .*truncated"):
    source(bad, 50)
  src = source(bad, 50, skip_corrupt=True)
  assert src.stats()["skipped_records"] == 1 and src.num_records == N - 1
  rows = ids_of(take(src.iterate(0), 8), examples)
  assert sorted(rows[:N - 1]) == list(range(N - 1))


@pytest.mark.parametrize("count", [1, 3])
def test_eval_batches_count_every_example_once(dataset, count):
  directory, examples = dataset
  per_host = []
  for h in range(count):
    per_host.append(list(evaluation.eval_batches(
        pattern(directory), 48, max_seq_length=L, max_predictions_per_seq=P,
        process_index=h, process_count=count)))
  assert {len(batches) for batches in per_host} == {-(-N // 48)}
  rows = [i for batches in per_host for i in ids_of(batches, examples)]
  assert sorted(rows) == list(range(N))
  pads = 0
  for batches in per_host:
    for b in batches:
      pad = b[schema.EXAMPLE_WEIGHT_KEY] == 0
      pads += pad.sum()
      assert np.all(b["masked_lm_weights"][pad] == 0)
      assert b["input_ids"].shape == (48 // count, L)
  assert pads == -(-N // 48) * 48 - N
  again = evaluation.eval_batches(pattern(directory), 48, max_seq_length=L,
                                max_predictions_per_seq=P, process_index=0,
                                process_count=count, max_batches=2)
  got = list(again)
  assert len(got) == 2 and digest(got[1]) == digest(per_host[0][1])


def test_reads_shards_written_by_records(tmp_path):
  encoder = records.ExampleEncoder(L, P)
  rng = np.random.default_rng(0)
  data = []
  for _ in range(40):
    ids = [2] + rng.integers(5, V, 20).tolist() + [3, 7, 3]
    data.append(encoder.encode(ids, 10, [1, 4], [ids[1], ids[4]], True))
  records.write_shard(str(tmp_path / records.shard_name(0, 1)), data)
  src = pipeline.TrainSource(str(tmp_path / "*.tfrecord"), 40, max_seq_length=L,
                             max_predictions_per_seq=P, seed=0, process_index=0,
                             process_count=1)
  batch = next(src.iterate(0))
  want = {data_utils.decode_example(d)["input_ids"].tobytes() for d in data}
  assert {row.astype(np.int64).tobytes() for row in batch["input_ids"]} == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_malloc_thresholds_restored_after_the_generator_dataset_starts(dataset):
  # tf.data's generator dataset fixes glibc's mmap threshold at 128 KiB; the
  # reader sets the adaptive ceilings back once its first batch is out.
  from bertjax.records import hostmem  # pylint: disable=g-import-not-at-top
  directory, _ = dataset
  calls = []
  real = hostmem.restore_malloc_thresholds
  hostmem.restore_malloc_thresholds = lambda: calls.append(real())
  try:
    take(source(directory, 16).iterate(0), 3)
  finally:
    hostmem.restore_malloc_thresholds = real
  assert calls == [True]


def test_to_global_and_prefetch_to_device(dataset):
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  directory, _ = dataset
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  sharding = NamedSharding(mesh, PartitionSpec("data"))
  host = take(source(directory, 16).iterate(0), 3)
  device = take(device_lib.prefetch_to_device(source(directory, 16).iterate(0), sharding), 3)
  for h, d in zip(host, device):
    assert set(h) == set(d)
    for k in h:
      assert isinstance(d[k], jax.Array) and d[k].sharding == sharding
      np.testing.assert_array_equal(np.asarray(d[k]), h[k])

  def failing():
    yield host[0]
    raise RuntimeError("reader broke")
  it = device_lib.prefetch_to_device(failing(), sharding, size=2)
  next(it)
  with pytest.raises(RuntimeError, match="reader broke"):
    next(it)

  # Closing stops the thread and closes the source in it: a thread left
  # running into interpreter shutdown mid-transfer aborts the process.
  closed = []

  def endless():
    try:
      while True:
        yield host[0]
    finally:
      closed.append(True)
  it = device_lib.prefetch_to_device(endless(), sharding, size=2)
  next(it)
  it.close()
  assert closed == [True]
  assert not [t for t in threading.enumerate() if t.name == "prefetch_to_device"]


def test_epoch_order_is_a_seeded_permutation_of_blocks():
  a = pipeline.epoch_order(103, seed=1, epoch=0, block=10)
  assert sorted(a.tolist()) == list(range(103))
  starts = np.flatnonzero(np.diff(a) != 1) + 1
  assert len(starts) <= 10  # 11 blocks, so at most 10 breaks.
  np.testing.assert_array_equal(a, pipeline.epoch_order(103, seed=1, epoch=0, block=10))
  assert not np.array_equal(a, pipeline.epoch_order(103, seed=1, epoch=1, block=10))


def test_resume_on_another_number_of_slices_continues_the_global_order(dataset):
  # Two slices of two hosts each (4 processes, numbered slice by slice as JAX
  # numbers a multi-slice job's) train steps 0-3; the run resumes at step 4 on
  # one slice of two hosts. Every host's rows depend only on the seed, the
  # step and its place among all hosts, so the global batches are those of
  # one host reading alone.
  directory, _ = dataset
  alone = take(source(directory, 48, order="global").iterate(0), 8)

  def global_batches(count, start, steps):
    hosts = [take(source(directory, 48, order="global", process_index=h,
                         process_count=count).iterate(start), steps) for h in range(count)]
    return [{k: np.concatenate([hosts[h][s][k] for h in range(count)]) for k in hosts[0][s]}
            for s in range(steps)]

  before = global_batches(4, 0, 4)
  after = global_batches(2, 4, 4)
  assert [digest(b) for b in before + after] == [digest(b) for b in alone]


def test_process_that_leaves_an_iterator_open_still_exits(dataset):
  # Without the exit hook the interpreter destroys the open tf.data iterator
  # while its generator thread waits for the GIL, and the process never ends.
  directory, _ = dataset
  script = (
      "from bertjax.input import pipeline\n"
      f"src = pipeline.TrainSource({pattern(directory)!r}, 8, max_seq_length={L}, "
      f"max_predictions_per_seq={P}, seed=0, process_index=0, process_count=1)\n"
      "it = src.iterate(0)\n"
      "for _ in range(3): next(it)\n"
      "print('read', flush=True)\n")
  try:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, check=False)
  except subprocess.TimeoutExpired:
    pytest.fail("a process that left a TrainSource iterator open did not exit in 240 s")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "read" in done.stdout
