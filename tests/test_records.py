"""Tests of the hand-written Example encoder, TFRecord framing and indexes."""

import os
import random

import numpy as np
import pytest
import tensorflow as tf

from bertjax.create import records
from bertjax.records import schema
from bertjax.records import tfrecord
import data_utils


def _feature_spec(max_seq_length, max_predictions_per_seq):
  spec = {}
  for name, (dtype, _) in schema.FEATURES.items():
    length = schema.feature_length(name, max_seq_length, max_predictions_per_seq)
    spec[name] = tf.io.FixedLenFeature(
        [length], tf.float32 if dtype == "float32" else tf.int64)
  return spec


def _random_instances(seed, count, max_seq_length, max_pred, vocab_size):
  rng = random.Random(seed)
  out = []
  for _ in range(count):
    n = rng.randint(5, max_seq_length)
    num_a = rng.randint(1, n - 4)
    ids = [rng.randint(0, vocab_size - 1) for _ in range(n)]
    k = rng.randint(1, min(max_pred, n - 3))
    cand = [p for p in range(1, n - 1) if p != num_a + 1]
    pos = sorted(rng.sample(cand, k))
    labels = [rng.randint(0, vocab_size - 1) for _ in pos]
    out.append((ids, num_a, pos, labels, rng.random() < 0.5))
  return out


@pytest.mark.parametrize("max_seq_length,max_pred,vocab_size",
                         [(128, 20, 30522), (512, 80, 250_000), (8, 2, 6)])
def test_encoder_bytes_equal_tensorflow_and_parse_identically(
    max_seq_length, max_pred, vocab_size):
  enc = records.ExampleEncoder(max_seq_length, max_pred)
  spec = _feature_spec(max_seq_length, max_pred)
  instances = _random_instances(0, 50, max_seq_length, max_pred, vocab_size)
  frames, lengths = enc.frame_rows(instances)  # All at once, as creation encodes them.
  ends = np.cumsum(lengths).tolist()
  for inst, start, end in zip(instances, [0] + ends[:-1], ends):
    data = enc.encode(*inst)
    assert frames[start:end] == records.frame(data)
    features = data_utils.features_of(*inst, max_seq_length, max_pred)
    reference = data_utils.tf_example_bytes(features)
    assert data == reference
    parsed = tf.io.parse_single_example(data, spec)
    for name, values in features.items():
      np.testing.assert_array_equal(parsed[name].numpy(), np.asarray(values))
    decoded = data_utils.decode_example(data)
    for name, values in features.items():
      np.testing.assert_array_equal(decoded[name], np.asarray(values))


def test_encoder_gives_the_same_frames_a_few_rows_at_a_time(monkeypatch):
  enc = records.ExampleEncoder(128, 20)
  instances = _random_instances(1, 50, 128, 20, 30522)
  frames, lengths = enc.frame_rows(instances)
  monkeypatch.setattr(records, "_ROWS_AT_ONCE", 7)
  for count in (49, 50):  # 7 groups of 7; 8 groups, the last of one row.
    got, got_lengths = enc.frame_rows(instances[:count])
    assert got == frames[:int(lengths[:count].sum())]
    np.testing.assert_array_equal(got_lengths, lengths[:count])


@pytest.mark.parametrize("max_seq_length,max_pred,vocab_size",
                         [(128, 20, 30522), (512, 80, 250_000)])
def test_encoder_on_threads_gives_the_same_frames(monkeypatch, max_seq_length,
                                                 max_pred, vocab_size):
  instances = _random_instances(2, 300, max_seq_length, max_pred, vocab_size)
  frames, lengths = records.ExampleEncoder(max_seq_length, max_pred).frame_rows(instances)
  monkeypatch.setattr(records, "_ROWS_AT_ONCE", 16)  # 19 blocks over 3 threads.
  threaded = records.ExampleEncoder(max_seq_length, max_pred, threads=3)
  for _ in range(2):
    got, got_lengths = threaded.frame_rows(instances)
    assert got == frames
    np.testing.assert_array_equal(got_lengths, lengths)
  threaded.close()  # Then on this thread, the same frames.
  assert threaded.frame_rows(instances)[0] == frames


def test_encoder_frames_no_rows():
  frames, lengths = records.ExampleEncoder(128, 20).frame_batch(
      np.zeros((0, 128), np.int64), *(np.zeros(0, np.int64),) * 2,
      np.zeros((0, 20), np.int64), np.zeros((0, 20), np.int64),
      *(np.zeros(0, np.int64),) * 2)
  assert frames == b"" and lengths.shape == (0,)


def test_encoder_rejects_oversized_instances():
  enc = records.ExampleEncoder(8, 2)
  with pytest.raises(ValueError, match="max_seq_length=8"):
    enc.encode(list(range(9)), 1, [1], [5], False)
  with pytest.raises(ValueError, match="max_predictions_per_seq=2"):
    enc.encode(list(range(8)), 1, [1, 2, 3], [5, 6, 7], False)


def test_framing_matches_tf_record_writer(tmp_path):
  payloads = [os.urandom(n) for n in (0, 1, 100, 5000)]
  ref = str(tmp_path / "ref.tfrecord")
  with tf.io.TFRecordWriter(ref) as w:
    for p in payloads:
      w.write(p)
  ours = str(tmp_path / "ours.tfrecord")
  assert records.write_shard(ours, payloads) == len(payloads)
  with open(ref, "rb") as a, open(ours, "rb") as b:
    assert a.read() == b.read()
  assert list(data_utils.iter_records(ours)) == payloads
  assert [r.numpy() for r in tf.data.TFRecordDataset(ours)] == payloads


def test_index_gives_record_offsets(tmp_path):
  enc = records.ExampleEncoder(64, 10)
  data = [enc.encode(*i) for i in _random_instances(1, 200, 64, 10, 1000)]
  path = str(tmp_path / records.shard_name(3, 8))
  assert path.endswith("part-00003-of-00008.tfrecord")
  records.write_shard(path, data)
  offsets = data_utils.read_index(path)
  assert offsets.dtype == np.dtype("<i8") and len(offsets) == 200
  assert os.path.getsize(tfrecord.index_path(path)) == 8 * 200
  index = tfrecord.load_index(path)
  np.testing.assert_array_equal(index.offsets, offsets)
  picks = np.array([0, 17, 199])
  got = tfrecord.RecordReader([path]).read(np.zeros(3, np.int64), offsets[picks],
                                           index.lengths[picks])
  assert got == [data[i] for i in picks]
  assert data_utils.check_index(path, 200) == 200
  assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]


def test_corrupt_record_is_detected(tmp_path):
  path = str(tmp_path / "x.tfrecord")
  records.write_shard(path, [b"hello world"])
  with open(path, "r+b") as f:
    f.seek(14)
    f.write(b"J")
  with pytest.raises(tfrecord.CorruptRecordError, match="byte offset 0: the data's CRC"):
    data_utils.iter_records(path)


def test_empty_shard(tmp_path):
  path = str(tmp_path / "e.tfrecord")
  assert records.write_shard(path, []) == 0
  assert os.path.getsize(path) == 0 and len(data_utils.read_index(path)) == 0


def test_scan_finds_the_next_intact_frame_after_inserted_garbage(tmp_path):
  payloads = [os.urandom(n) for n in (50, 0, 300, 7, 1000)]
  frames = [records.frame(p) for p in payloads]
  garbage = b"\x00" * 40 + os.urandom(200)
  path = str(tmp_path / "g.tfrecord")
  with open(path, "wb") as f:
    f.write(b"".join(frames[:3]) + garbage + b"".join(frames[3:]))
  at = sum(len(fr) for fr in frames[:3])
  with pytest.raises(tfrecord.CorruptRecordError, match=f"byte offset {at}: the length's CRC"):
    tfrecord.load_index(path)
  index = tfrecord.load_index(path, skip_corrupt=True)
  assert index.dropped == 1 and len(index) == 5
  got = tfrecord.RecordReader([path]).read(np.zeros(5, np.int64), index.offsets,
                                           index.lengths)
  assert got == payloads
  with pytest.raises(tfrecord.CorruptRecordError):  # Not from the skipping cache.
    tfrecord.load_index(path)
  # Not a TFRecord file at all: an error at offset 0, without a search.
  text = str(tmp_path / "t.tfrecord")
  with open(text, "w") as f:
    f.write("plain text, " * 100_000)
  with pytest.raises(tfrecord.CorruptRecordError, match="byte offset 0: "):
    tfrecord.load_index(text)
  assert len(tfrecord.load_index(text, skip_corrupt=True)) == 0
