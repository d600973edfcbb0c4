"""Tests of on-the-fly masking (bertjax/input/dynamic_masking.py)."""

import os

import numpy as np
import pytest

from bertjax.input import dynamic_masking
from bertjax.input import evaluation
from bertjax.input import pipeline
from bertjax.records import schema
import data_utils

L, P, V = 128, 20, 1000
SPECIALS = data_utils.SPECIAL_IDS


def config(**kw):
  return dynamic_masking.MaskingConfig(vocab_size=V, special_ids=SPECIALS,
                                       max_predictions_per_seq=P, **kw)


@pytest.fixture(scope="module")
def unmasked():
  """12,000 unmasked sequences of 96..128 tokens, stacked."""
  rng = np.random.default_rng(0)
  rows = [data_utils.make_example(rng, L, P, V, premasked=False, min_length=96)
          for _ in range(12_000)]
  return {k: np.stack([r[k] for r in rows]).astype(np.float32 if k == "masked_lm_weights"
                                                  else np.int32)
          for k in ("input_ids", "input_mask", "masked_lm_positions", "masked_lm_ids",
                    "masked_lm_weights")}


def mask_all(batch, epoch, cfg, chunk=2000):
  n = len(batch["input_ids"])
  parts = []
  for a in range(0, n, chunk):
    part = {k: v[a:a + chunk] for k, v in batch.items()}
    keys = np.arange(a, min(n, a + chunk))
    parts.append(dynamic_masking.mask_batch(part, keys, np.full(len(keys), epoch), cfg))
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def test_masking_statistics(unmasked):
  out = mask_all(unmasked, 0, config())
  ids = unmasked["input_ids"]
  specials = np.isin(ids, list(SPECIALS.values()))
  maskable = (unmasked["input_mask"] > 0) & ~specials
  w = out["masked_lm_weights"] > 0
  assert 14.5 <= 100 * w.sum() / maskable.sum() <= 15.5
  # The creation rule, per sequence.
  n_tokens = unmasked["input_mask"].sum(1)
  want = np.minimum(P, np.maximum(1, np.round(n_tokens * 0.15)))
  np.testing.assert_array_equal(w.sum(1), want)
  rows = np.broadcast_to(np.arange(len(ids))[:, None], w.shape)[w]
  pos = out["masked_lm_positions"][w]
  # Never a special token or padding; the labels are the original ids.
  assert maskable[rows, pos].all()
  np.testing.assert_array_equal(out["masked_lm_ids"][w], ids[rows, pos])
  # Ascending positions, unused slots zero.
  assert np.all(w[:, :-1] >= w[:, 1:])
  p = np.where(w, out["masked_lm_positions"], L + np.arange(P))
  assert np.all(np.diff(p, axis=1) > 0)
  assert np.all(out["masked_lm_positions"][~w] == 0) and np.all(out["masked_lm_ids"][~w] == 0)
  # 80% [MASK], 10% unchanged, 10% random.
  new = out["input_ids"][rows, pos]
  frac_mask = 100 * np.mean(new == SPECIALS["mask"])
  frac_same = 100 * np.mean(new == ids[rows, pos])
  frac_random = 100 - frac_mask - frac_same
  assert abs(frac_mask - 80) <= 1.5 and abs(frac_same - 10) <= 1.5
  assert abs(frac_random - 10) <= 1.5
  random_ids = new[(new != SPECIALS["mask"]) & (new != ids[rows, pos])]
  assert not np.isin(random_ids, list(SPECIALS.values())).any()
  # Nothing else changes.
  changed = out["input_ids"] != ids
  changed[rows, pos] = False
  assert not changed.any()


def test_masks_are_fresh_each_epoch_and_independent_of_the_batch(unmasked):
  cfg = config(seed=3)
  first = {k: v[:500] for k, v in unmasked.items()}
  e0 = mask_all(first, 0, cfg)
  e1 = mask_all(first, 1, cfg)
  differ = np.any(e0["masked_lm_positions"] != e1["masked_lm_positions"], axis=1)
  assert differ.mean() > 0.99
  # Same (seed, epoch, key) -> same mask, whatever the batch around it.
  order = np.random.default_rng(1).permutation(500)
  shuffled = dynamic_masking.mask_batch({k: v[order] for k, v in first.items()},
                                        order, np.zeros(500, np.int64), cfg)
  for k in shuffled:
    np.testing.assert_array_equal(shuffled[k], e0[k][order])
  other_seed = mask_all(first, 0, config(seed=4))
  assert np.any(other_seed["masked_lm_positions"] != e0["masked_lm_positions"])


def test_restoring_premasked_records_recovers_the_originals():
  rng = np.random.default_rng(5)
  rows = [data_utils.make_example(rng, L, P, V, premasked=True, min_length=20)
          for _ in range(300)]
  stack = {k: np.stack([r[k] for r in rows]) for k in rows[0] if k not in ("file", "record")}
  assert np.any(stack["input_ids"] != stack["original_input_ids"])
  restored = dynamic_masking.restore_original_ids(
      stack["input_ids"], stack["masked_lm_positions"], stack["masked_lm_ids"],
      stack["masked_lm_weights"])
  np.testing.assert_array_equal(restored, stack["original_input_ids"])


def test_bad_options_raise():
  with pytest.raises(ValueError, match="special_ids lacks \\['mask'\\]"):
    dynamic_masking.MaskingConfig(vocab_size=V, special_ids={"pad": 0, "cls": 2, "sep": 3},
                                  max_predictions_per_seq=P)
  with pytest.raises(ValueError, match="unknown options \\['masked_prob'\\]"):
    dynamic_masking.from_options({"masked_prob": 0.2}, max_predictions_per_seq=P, seed=0)
  with pytest.raises(ValueError, match="needs 'vocab_size'"):
    dynamic_masking.from_options({}, max_predictions_per_seq=P, seed=0)


def test_pipeline_masks_unmasked_and_premasked_records(tmp_path):
  for name, premasked in (("plain", False), ("premasked", True)):
    directory = str(tmp_path / name)
    examples = data_utils.write_dataset(directory, 2, 40, 32, 5, V, seed=1,
                                        premasked=premasked)
    files = os.path.join(directory, "*.tfrecord")
    if not premasked:
      with pytest.raises(ValueError, match="carry no masks; set dynamic_masking"):
        pipeline.TrainSource(files, 40, max_seq_length=32, max_predictions_per_seq=5,
                             seed=0, process_index=0, process_count=1)
    src = pipeline.TrainSource(files, 40, max_seq_length=32, max_predictions_per_seq=5,
                               seed=0, process_index=0, process_count=1,
                               dynamic_masking={"masked_lm_prob": 0.15})
    lookup = {data_utils.example_id(e["original_input_ids"]): e for e in examples}
    it = src.iterate(0)
    masks = {}
    for epoch in range(2):
      for _ in range(2):  # 80 records, 40 a batch: two batches an epoch.
        b = next(it)
        restored = dynamic_masking.restore_original_ids(
            b["input_ids"], b["masked_lm_positions"], b["masked_lm_ids"],
            b["masked_lm_weights"])
        assert b["masked_lm_weights"].sum(1).min() >= 1
        for row in range(40):
          key = data_utils.example_id(restored[row])
          assert key in lookup  # Restoring the new mask gives the original.
          masks.setdefault(key, []).append(b["masked_lm_positions"][row].tobytes())
    assert len(masks) == 80
    assert np.mean([m[0] != m[1] for m in masks.values()]) > 0.9
    assert set(b) == set(schema.batch_shapes(40, 32, 5))
    # Evaluation masks are fixed: the same on every pass.
    passes = [list(evaluation.eval_batches(files, 48, max_seq_length=32,
                                         max_predictions_per_seq=5, process_index=0,
                                         process_count=1, dynamic_masking={}))
              for _ in range(2)]
    assert len(passes[0]) == 2 and passes[0][0]["masked_lm_weights"].sum() > 0
    for a, b in zip(*passes):
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])
