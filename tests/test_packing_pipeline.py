"""Packing in the input pipeline: the same examples as unpacked, resumable,
every eval record once, and records of the original release's own script."""

import collections
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.create import demo
from bertjax.input import packing
from bertjax.input import evaluation
from bertjax.input import pipeline
from bertjax.records import schema
from bertjax.text import vocab as vocab_lib
import data_utils

L, P, V = 32, 5, 200
FILES, PER_FILE = 2, 60
OPTIONS = {"rows": 8, "max_examples_per_row": 3}
CHUNKED = dict(OPTIONS, rows=7, chunk_steps=3)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("packds"))
  # Lengths 6..16 of 32: two or three examples fit in a row.
  data_utils.write_dataset(directory, FILES, PER_FILE, 16, P, V, seed=0, min_length=6)
  # write_dataset writes max_seq_length=16; pad each record to 32 tokens instead.
  return _repad(directory, tmp_path_factory.mktemp("packds32"))


def _repad(src, dst):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rows = data_utils.parse_files(pipeline.list_files(os.path.join(src, "part-*")), 16, P)
  path = os.path.join(str(dst), "part-00000-of-00001.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(len(rows["input_ids"])):
      ex = {k: (np.pad(v[i], (0, L - 16)) if v.shape[1] == 16 else v[i])
            for k, v in rows.items()}
      writer.write(data_utils.serialize(ex))
  return str(dst)


def unpack(batch):
  """The examples of a packed batch as (token ids, A/B ids, label, masked labels) keys."""
  out = []
  rows, slots = np.nonzero(batch[schema.EXAMPLE_WEIGHT_KEY] > 0)
  for r, k in zip(rows, slots):
    span = np.flatnonzero(batch["packed_example_ids"][r] == k + 1)
    assert span[0] == batch["next_sentence_positions"][r, k]
    assert (batch["position_ids"][r, span] == np.arange(len(span))).all()
    inside = ((batch["masked_lm_positions"][r] >= span[0])
              & (batch["masked_lm_positions"][r] <= span[-1])
              & (batch["masked_lm_weights"][r] > 0))
    out.append((batch["input_ids"][r, span].tobytes(), batch["segment_ids"][r, span].tobytes(),
                int(batch["next_sentence_labels"][r, k]),
                (batch["masked_lm_positions"][r, inside] - span[0]).astype(np.int32).tobytes(),
                batch["masked_lm_ids"][r, inside].tobytes()))
  return out


def examples_of(batch):
  """The same keys for an unpacked batch."""
  out = []
  for i in np.flatnonzero(batch[schema.EXAMPLE_WEIGHT_KEY] > 0):
    n = int(batch["input_mask"][i].sum())
    w = batch["masked_lm_weights"][i] > 0
    out.append((batch["input_ids"][i, :n].tobytes(), batch["segment_ids"][i, :n].tobytes(),
                int(batch["next_sentence_labels"][i]),
                batch["masked_lm_positions"][i, w].tobytes(),
                batch["masked_lm_ids"][i, w].tobytes()))
  return out


def source(directory, **kw):
  return pipeline.TrainSource(os.path.join(directory, "part-*"), 16, max_seq_length=L,
                              max_predictions_per_seq=P, seed=3, process_index=0,
                              process_count=1, **kw)


@pytest.mark.parametrize("dynamic", [False, True])
def test_packed_steps_hold_the_unpacked_steps_examples_and_resume(dataset, dynamic):
  masking = {"vocab_size": V, "special_ids": data_utils.SPECIAL_IDS} if dynamic else None
  packed_src = source(dataset, packing=OPTIONS, dynamic_masking=masking)
  plain = list(itertools.islice(source(dataset, dynamic_masking=masking).iterate(0), 6))
  packed = list(itertools.islice(packed_src.iterate(0), 6))
  shapes = packing.packed_batch_shapes(packed_src.packing)
  for step, (a, b) in enumerate(zip(plain, packed)):
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == shapes
    assert collections.Counter(unpack(b)) == collections.Counter(examples_of(a)), step
  assert packed_src.stats()["packing_overflow"] == 0
  resumed = next(source(dataset, packing=OPTIONS, dynamic_masking=masking).iterate(4))
  for k in resumed:
    np.testing.assert_array_equal(resumed[k], packed[4][k], err_msg=k)


def test_chunks_pack_the_examples_of_their_steps_and_resume_inside_a_chunk(dataset):
  plain = list(itertools.islice(source(dataset).iterate(0), 6))
  src = source(dataset, packing=CHUNKED)
  packed = list(itertools.islice(src.iterate(0), 6))
  assert all(b["input_ids"].shape == (7, L) for b in packed)
  for c in range(2):
    want = collections.Counter(e for b in plain[3 * c:3 * c + 3] for e in examples_of(b))
    got = collections.Counter(e for b in packed[3 * c:3 * c + 3] for e in unpack(b))
    assert got == want, c
  assert src.stats()["packing_overflow"] == 0
  resumed = list(itertools.islice(source(dataset, packing=CHUNKED).iterate(4), 2))
  for a, b in zip(resumed, packed[4:6]):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_too_few_rows_leave_examples_out_and_count_them(dataset):
  src = source(dataset, packing={"rows": 2, "max_examples_per_row": 3})
  batch = next(src.iterate(0))
  assert len(unpack(batch)) <= 6
  assert src.stats()["packing_overflow"] == 16 - len(unpack(batch)) > 0


@pytest.mark.parametrize("process_count", [1, 2])
def test_packed_evaluation_reads_every_record_once(dataset, process_count):
  plain = evaluation.eval_batches(os.path.join(dataset, "part-*"), 16, max_seq_length=L,
                                max_predictions_per_seq=P, process_index=0, process_count=1)
  want = collections.Counter(e for b in plain for e in examples_of(b))
  got, counts = collections.Counter(), set()
  for h in range(process_count):
    batches = evaluation.eval_batches(
        os.path.join(dataset, "part-*"), 16, max_seq_length=L, max_predictions_per_seq=P,
        process_index=h, process_count=process_count, packing=OPTIONS)
    delivered = list(batches)
    counts.add((batches.num_batches, len(delivered)))
    for b in delivered:
      assert b["input_ids"].shape == (OPTIONS["rows"] // process_count, L)
      got.update(unpack(b))
  assert sum(want.values()) == FILES * PER_FILE
  assert got == want
  (num, delivered), = counts  # Every host the same number of batches.
  assert num == delivered < -(-FILES * PER_FILE // 16)


def test_packing_options_are_checked(dataset):
  with pytest.raises(ValueError, match="data.packing_chunk_steps must be at least 1"):
    source(dataset, packing=dict(OPTIONS, chunk_steps=0))
  with pytest.raises(ValueError, match="packing: unknown options"):
    source(dataset, packing={"rows": 8, "examples": 3})
  with pytest.raises(ValueError, match="not a positive multiple of the 2 processes"):
    pipeline.TrainSource(os.path.join(dataset, "part-*"), 16, max_seq_length=L,
                         max_predictions_per_seq=P, seed=0, process_index=0, process_count=2,
                         order="global", packing={"rows": 7})
  with pytest.raises(ValueError, match="packing_max_predictions_per_row=4 is below"):
    source(dataset, packing={"rows": 8, "max_predictions_per_row": 4})


def test_records_of_the_original_release_pack(tmp_path):
  corpus = tmp_path / "corpus.txt"
  with open(corpus, "w", encoding="utf-8") as f:
    for doc in demo.demo_documents()[:60]:
      f.write("\n".join(doc) + "\n\n")
  vocab = str(tmp_path / "vocab.txt")
  vocab_lib.build_wordpiece_vocab([str(corpus)], vocab, vocab_size=2000, do_lower_case=True)
  out = tmp_path / "original.tfrecord"
  subprocess.run([sys.executable, "-m", "bert.create_pretraining_data",
                  f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={vocab}",
                  "--do_lower_case=True", "--max_seq_length=128",
                  "--max_predictions_per_seq=20", "--dupe_factor=1", "--short_seq_prob=0.5",
                  "--random_seed=1"], check=True, capture_output=True, timeout=600)
  kw = dict(max_seq_length=128, max_predictions_per_seq=20, process_index=0, process_count=1)
  plain = evaluation.eval_batches(str(out), 16, **kw)
  want = collections.Counter(e for b in plain for e in examples_of(b))
  batches = evaluation.eval_batches(str(out), 16, packing={"rows": 16, "max_examples_per_row": 4},
                                  **kw)
  got = collections.Counter(e for b in batches for e in unpack(b))
  assert got == want and sum(want.values()) > 16
  assert batches.num_batches < plain.num_batches


def test_records_that_are_not_right_padded_are_refused_naming_the_record(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  path = str(tmp_path / "part-00000-of-00001.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(4):
      ex = data_utils.make_example(rng, L, P, V, True, 8)
      n = int(ex["input_mask"].sum())
      while i == 2 and n == L:
        ex = data_utils.make_example(rng, L, P, V, True, 8)
        n = int(ex["input_mask"].sum())
      if i == 2:  # Left padding: the real tokens at the end.
        for name in ("input_ids", "input_mask", "segment_ids"):
          ex[name] = np.roll(ex[name], L - n)
      writer.write(data_utils.serialize(ex))
  src = pipeline.TrainSource(path, 4, max_seq_length=L, max_predictions_per_seq=P, seed=0,
                             process_index=0, process_count=1, order="global",
                             packing={"rows": 2})
  with pytest.raises(ValueError, match=r"part-00000-of-00001\.tfrecord: record 2: input_mask "
                     r"is not 1\.\.\.1 0\.\.\.0"):
    next(src.iterate(0))
