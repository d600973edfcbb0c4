"""Length bucketing of fine-tuning batches: every eval example once in a few shapes, each
training epoch's examples kept and resumable, and predictions equal to unbucketed ones."""

import os
import sys

import jax
import numpy as np
import optax
import pytest

from bertjax.model.config import BertConfig
from bertjax.tasks import batches
from bertjax.tasks import loop
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.tasks.split import Split
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "configs", "finetune"))
import glue as glue_config  # pylint: disable=g-import-not-at-top,wrong-import-position

L = 32
BUCKETS = batches.bucket_lengths(L, 8)


def _arrays(n, seed=0, choices=None, max_len=L):
  """Inputs whose real lengths vary from 3 to max_len (a GLUE-like spread), with a
  `row` array naming each example."""
  rng = np.random.default_rng(seed)
  shape = (n, choices) if choices else (n,)
  lengths = np.minimum(rng.geometric(0.12, shape) + 2, max_len)
  positions = np.arange(L)
  mask = (positions < lengths[..., None]).astype(np.int32)
  ids = rng.integers(5, 40, (*shape, L)).astype(np.int32) * mask
  return {"input_ids": ids, "input_mask": mask,
          "segment_ids": ((positions >= lengths[..., None] // 2) * mask).astype(np.int32),
          "labels": rng.integers(0, 2, n).astype(np.int32),
          "row": np.arange(n)}


def test_bucket_lengths():
  assert batches.bucket_lengths(128, 32) == (32, 64, 128)
  assert batches.bucket_lengths(384, 32) == (32, 64, 128, 256, 384)
  assert batches.bucket_lengths(128, 0) == ()
  assert batches.padded_length(np.array([3, 9]), (8, 16, 32)) == 16


@pytest.mark.parametrize("hosts", [1, 2])
def test_bucketed_eval_batches_hold_every_example_once_in_few_shapes(hosts):
  arrays = _arrays(203)
  lengths = batches.example_lengths(arrays)
  per_host = [list(batches.eval_batches(arrays, 16, buckets=BUCKETS, process_index=h,
                                        process_count=hosts)) for h in range(hosts)]
  rows, shapes = [], set()
  for step in range(batches.num_eval_batches(203, 16)):
    parts = [per_host[h][step] for h in range(hosts)]
    width = {p["input_ids"].shape[1] for p in parts}
    assert len(width) == 1  # Every host cuts the global batch to the same length.
    shapes |= width
    real = np.concatenate([p["row"][p["weights"] > 0] for p in parts])
    assert lengths[real].max() <= width.pop()
    for p in parts:
      for k in ("input_ids", "input_mask", "segment_ids"):
        np.testing.assert_array_equal(p[k], arrays[k][p["row"]][:, :p[k].shape[1]])
    rows.append(real)
  rows = np.concatenate(rows)
  np.testing.assert_array_equal(rows, batches.eval_order(arrays, BUCKETS))
  np.testing.assert_array_equal(np.sort(rows), np.arange(203))
  assert shapes <= set(BUCKETS) and len(shapes) > 1


def test_bucketed_train_batches_keep_each_epoch_and_resume():
  n, b, steps = 203, 16, 40  # About three epochs; epochs start mid-batch.
  arrays = _arrays(n, seed=1)
  lengths = batches.example_lengths(arrays)
  kwargs = dict(seed=7, num_steps=steps, buckets=BUCKETS, group_batches=4,
                process_index=0, process_count=1)
  full = list(batches.train_batches(arrays, b, **kwargs))
  stream = np.concatenate([x["row"] for x in full])
  for e in range(steps * b // n):
    np.testing.assert_array_equal(np.sort(stream[e * n:(e + 1) * n]), np.arange(n))
  plain = np.concatenate([x["row"] for x in batches.train_batches(
      arrays, b, seed=7, num_steps=steps, process_index=0, process_count=1)])
  for e in range(steps * b // n):  # The same examples per epoch as without buckets.
    np.testing.assert_array_equal(np.sort(stream[e * n:(e + 1) * n]),
                                  np.sort(plain[e * n:(e + 1) * n]))
  widths = [x["input_ids"].shape[1] for x in full]
  assert set(widths) <= set(BUCKETS) and len(set(widths)) > 1
  assert all(lengths[x["row"]].max() <= x["input_ids"].shape[1] for x in full)
  # Similar lengths together: less padding than cutting the unbucketed batches.
  plain_widths = [batches.padded_length(lengths[r], BUCKETS) for r in plain.reshape(steps, b)]
  assert sum(widths) < sum(plain_widths)
  resumed = list(batches.train_batches(arrays, b, start_step=25, **kwargs))
  for x, y in zip(full[25:], resumed):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  halves = [list(batches.train_batches(arrays, b, **dict(kwargs, process_index=h,
                                                          process_count=2)))
            for h in range(2)]
  for step in range(steps):
    np.testing.assert_array_equal(
        np.concatenate([halves[0][step]["row"], halves[1][step]["row"]]), full[step]["row"])
    assert halves[0][step]["input_ids"].shape == halves[1][step]["input_ids"].shape


def _predictor(kind_task, num_choices=0):
  config = BertConfig(vocab_size=48, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position_embeddings=L, dtype="float32")
  task = registry.TASKS[kind_task]
  model = registry.model_for(task, config)
  mesh_config = _mesh_config()
  mesh, rules = sharding_lib.make_mesh(mesh_config), sharding_lib.rules(mesh_config)
  state, shardings = state_lib.create_train_state(
      model, optax.identity(), mesh, rules, jax.random.key(0), init=registry.init_fn(task, L))
  _, p_predict = step_lib.jit_steps(shardings, mesh, task.kind)
  return state, p_predict, mesh, rules


def _mesh_config():
  return glue_config.get_config().mesh


@pytest.mark.slow
@pytest.mark.parametrize("task,per_position", [("conll2003", True),
                                               ("swag", False), ("squad", True)])
def test_bucketed_predictions_equal_unbucketed(task, per_position):
  arrays = _arrays(37, seed=2, choices=4 if task == "swag" else None)
  split = Split("dev", arrays, None, per_position_outputs=per_position)
  state, p_predict, mesh, rules = _predictor(task)
  sharding = sharding_lib.batch_sharding(mesh)
  with sharding_lib.mesh_context(mesh, rules):
    plain = loop.predict(p_predict, state, split, 8, sharding)
    bucketed = loop.predict(p_predict, state, split, 8, sharding, BUCKETS)
    # One call on all rows at once: what reading back batch by batch would give.
    whole, _ = jax.device_get(p_predict(state, jax.device_put(
        dict(arrays, weights=np.ones(37, np.float32), example_ids=np.arange(37, dtype=np.int32)),
        sharding)))
  lengths = batches.example_lengths(arrays)
  for p, b, w in zip(jax.tree.leaves(plain), jax.tree.leaves(bucketed), jax.tree.leaves(whole)):
    np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-5)
    if not per_position:
      np.testing.assert_allclose(b, p, rtol=1e-5, atol=1e-5)
      continue
    real = np.arange(L) < lengths[:, None]
    np.testing.assert_allclose(b[real], p[real], rtol=1e-5, atol=1e-5)
    # Past its batch's bucket length a position holds NO_TOKEN_LOGIT.
    assert (b[~real] == loop.NO_TOKEN_LOGIT).mean() > 0.5
