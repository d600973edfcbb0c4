"""The optimizer, the learning-rate schedule and gradient accumulation.

Schedules, masks and single updates run here on small trees. The steps of a
tiny model (accumulation, LAMB) run in a child process with 2 CPU devices
(this file, run as a script; see jax_child.py).
"""

import functools
import json
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import jax_child
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.train import optimizer as opt_lib
from bertjax.train import run_config
from bertjax.train import state as state_lib

sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position

TINY = dict(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
            max_position_embeddings=16)


def optimizer_config(**changes) -> ml_collections.ConfigDict:
  config = base.get_config().optimizer
  config.update(changes)
  return config


@functools.lru_cache(maxsize=None)
def boxed_params():
  """The tiny model's parameter tree (shapes only), with logical-axis boxes."""
  model = BertForPreTraining(BertConfig(**TINY))
  return jax.eval_shape(lambda: state_lib.init_params(model, jax.random.key(0)))


def random_params(seed=0):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: rng.normal(0, 1, x.shape).astype(np.float32),
                      nn.unbox(boxed_params()))


def by_name(tree) -> dict:
  return {"/".join(k.key for k in path): x for path, x in
          jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: isinstance(x, bool))}


def test_base_config_is_the_papers_adamw():
  c = base.get_config().optimizer
  assert (c.name, c.learning_rate, c.b1, c.b2, c.eps) == ("adamw", 1e-4, 0.9, 0.999, 1e-6)
  assert (c.weight_decay, c.clip_norm, c.end_learning_rate) == (0.01, 1.0, 0.0)


def test_decay_mask_spares_exactly_layer_norm_and_biases():
  mask = by_name(opt_lib.decay_mask(nn.unbox(boxed_params())))
  spared = sorted(n for n, decayed in mask.items() if not decayed)
  decayed = sorted(n for n, d in mask.items() if d)
  is_norm_or_bias = lambda n: n.endswith("bias") or "layer_norm/" in n
  assert spared == sorted(n for n in mask if is_norm_or_bias(n))
  assert "mlm/output_bias" in spared
  assert "bert/encoder/layers/attention_layer_norm/scale" in spared
  assert "mlm/transform_layer_norm/scale" in spared
  assert "bert/embeddings/layer_norm/scale" in spared
  assert "bert/embeddings/word_embeddings/embedding" in decayed
  assert "bert/encoder/layers/mlp/intermediate/kernel" in decayed
  assert "nsp/kernel" in decayed
  # The boxed tree (what the optimizer state is built from) gets the same mask.
  boxed_mask = opt_lib.decay_mask(boxed_params())
  assert by_name(nn.unbox(boxed_mask)) == mask


def test_weight_decay_applies_only_under_the_mask():
  # Zero gradients: Adam's step is zero, so the update is the decay alone.
  lr, wd = 1e-2, 0.1
  config = optimizer_config(learning_rate=lr, weight_decay=wd)
  tx = opt_lib.make_optimizer(config, optax.constant_schedule(lr))
  params = random_params()
  zeros = jax.tree.map(np.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
  mask = by_name(opt_lib.decay_mask(params))
  for name, u in by_name(updates).items():
    p = by_name(params)[name]
    expected = -lr * wd * p if mask[name] else np.zeros_like(p)
    np.testing.assert_allclose(u, expected, rtol=1e-6, atol=1e-12, err_msg=name)


def schedule_for(total_steps, fractions, warmup, phase_warmups=None, per_phase=False,
                 schedule="linear"):
  config = optimizer_config(warmup_steps=warmup, per_phase_warmup=per_phase, schedule=schedule)
  bounds = opt_lib.phase_boundaries(total_steps, fractions)
  phase_warmups = phase_warmups or [0] * len(fractions)
  return opt_lib.learning_rate_schedule(config, total_steps, bounds, phase_warmups)


def test_schedule_warms_up_then_decays_linearly_to_zero():
  # configs/base.py: 1M steps, 10k warmup, 90% of the steps at 128 then 512.
  config = base.get_config()
  plan = run_config.phases(config)
  assert [p.start for p in plan] == [0, 900_000]
  schedule = opt_lib.learning_rate_schedule(
      config.optimizer, config.total_steps, [p.start for p in plan] + [plan[-1].end],
      [p.warmup_steps for p in plan])
  peak = 1e-4
  expected = {0: 0.0, 5_000: peak / 2, 10_000: peak,
              505_000: peak / 2,  # Half way down from 10k to 1M.
              900_000: peak * 100_000 / 990_000,  # The phase boundary: no restart.
              1_000_000: 0.0}
  for step, lr in expected.items():
    np.testing.assert_allclose(float(schedule(step)), lr, rtol=1e-5, atol=1e-12,
                               err_msg=f"step {step}")
  assert float(schedule(10_001)) < float(schedule(10_000))


def test_per_phase_warmup_restarts_at_each_phase():
  schedule = schedule_for(1000, [0.9, 0.1], warmup=0, phase_warmups=[100, 10],
                          per_phase=True)
  peak = 1e-4
  expected = {0: 0.0, 50: peak / 2, 100: peak, 500: peak / 2,
              900: 0.0, 905: peak / 2, 910: peak, 955: peak / 2, 1000: 0.0}
  for step, lr in expected.items():
    np.testing.assert_allclose(float(schedule(step)), lr, rtol=1e-5, atol=1e-12,
                               err_msg=f"step {step}")


def original_release_learning_rate(step, init_lr, num_train_steps, num_warmup_steps,
                                   end_lr=0.0):
  """The original release's optimization.create_optimizer, in numpy:
  tf.train.polynomial_decay(init_lr, step, num_train_steps, end_lr, power=1.0,
  cycle=False), replaced by init_lr * step / num_warmup_steps while
  step < num_warmup_steps."""
  decayed = (init_lr - end_lr) * (1 - min(step, num_train_steps) / num_train_steps) + end_lr
  if num_warmup_steps and step < num_warmup_steps:
    return init_lr * step / num_warmup_steps
  return decayed


@pytest.mark.parametrize("total,warmup,end", [(1000, 100, 0.0), (1000, 0, 0.0),
                                              (640, 64, 1e-6)])
def test_original_schedule_is_the_original_releases(total, warmup, end):
  config = optimizer_config(warmup_steps=warmup, schedule="original", end_learning_rate=end)
  schedule = opt_lib.learning_rate_schedule(config, total, [0, total], [0])
  for step in list(range(0, total + 1, 7)) + [warmup - 1, warmup, warmup + 1, total]:
    if step < 0:
      continue
    want = original_release_learning_rate(step, config.learning_rate, total, warmup, end)
    np.testing.assert_allclose(float(schedule(step)), want, rtol=1e-5, atol=1e-12,
                               err_msg=f"step {step}")
  # Unlike 'linear', the rate right after warmup is below the peak.
  if warmup:
    assert float(schedule(warmup)) < config.learning_rate
    linear = schedule_for(total, [1.0], warmup)
    assert float(linear(warmup)) == pytest.approx(config.learning_rate)


def test_original_schedule_restarts_per_phase():
  schedule = schedule_for(1000, [0.9, 0.1], warmup=0, phase_warmups=[100, 10],
                          per_phase=True, schedule="original")
  peak = 1e-4
  expected = {0: 0.0, 50: peak / 2, 100: peak * 0.8 / 0.9, 450: peak / 2,
              900: 0.0, 905: peak / 2, 910: peak * 0.9, 950: peak / 2, 1000: 0.0}
  for step, lr in expected.items():
    np.testing.assert_allclose(float(schedule(step)), lr, rtol=1e-5, atol=1e-12,
                               err_msg=f"step {step}")


def test_unknown_schedule_is_refused():
  with pytest.raises(ValueError, match="optimizer.schedule"):
    schedule_for(100, [1.0], 10, schedule="cosine")


def test_phase_boundaries_split_total_steps_by_fraction():
  assert opt_lib.phase_boundaries(1000, [0.9, 0.1]) == [0, 900, 1000]
  assert opt_lib.phase_boundaries(10, [0.25, 0.25, 0.5]) == [0, 2, 5, 10]
  assert opt_lib.phase_boundaries(7, [1.0]) == [0, 7]


def _hand_adam_no_bias_correction(params, grads_seq, lr, b1, b2, eps, wd, clip):
  """The original release's AdamWeightDecayOptimizer, written out in numpy."""
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  p = dict(params)
  for grads in grads_seq:
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
    scale = min(1.0, clip / norm) if clip else 1.0
    for k in p:
      g = grads[k] * scale
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      update = m[k] / (np.sqrt(v[k]) + eps)
      if k != "bias":
        update = update + wd * p[k]
      p[k] = p[k] - lr * update
  return p


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_adam_without_bias_correction_matches_the_hand_computed_update(clip):
  rng = np.random.default_rng(0)
  params = {"kernel": rng.normal(0, 1, (3, 4)).astype(np.float32),
            "bias": rng.normal(0, 1, (4,)).astype(np.float32)}
  # Gradient norms well above 1, so clipping changes the result, and some
  # entries near eps, where the update depends on the gradient's scale.
  grads_seq = [{k: (rng.normal(0, 3, x.shape) * rng.choice([1, 1e-6], x.shape)
                    ).astype(np.float32) for k, x in params.items()} for _ in range(3)]
  lr, wd = 1e-2, 0.01
  config = optimizer_config(bias_correction=False, learning_rate=lr, weight_decay=wd,
                            clip_norm=clip)
  tx = opt_lib.make_optimizer(config, optax.constant_schedule(lr))
  state, p = tx.init(params), dict(params)
  for grads in grads_seq:
    updates, state = tx.update(grads, state, p)
    p = optax.apply_updates(p, updates)
  expected = _hand_adam_no_bias_correction(params, grads_seq, lr, 0.9, 0.999, 1e-6, wd, clip)
  for k in params:
    np.testing.assert_allclose(p[k], expected[k], rtol=1e-5, atol=1e-7, err_msg=k)
  unclipped = _hand_adam_no_bias_correction(params, grads_seq, lr, 0.9, 0.999, 1e-6, wd, 0)
  if clip:
    assert not np.allclose(p["kernel"], unclipped["kernel"], rtol=1e-5, atol=1e-7)


def test_adamw_with_bias_correction_is_optax_adamw():
  rng = np.random.default_rng(1)
  params = random_params(2)
  config = optimizer_config(learning_rate=1e-3, clip_norm=0.0)
  schedule = optax.linear_schedule(1e-3, 0.0, 10)
  ours = opt_lib.make_optimizer(config, schedule)
  reference = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                          mask=opt_lib.decay_mask)

  @jax.jit
  def three_steps(params, grads_seq):
    out = []
    for tx in (ours, reference):
      p, s = params, tx.init(params)
      for grads in grads_seq:
        u, s = tx.update(grads, s, p)
        p = optax.apply_updates(p, u)
      out.append(p)
    return out
  grads_seq = [jax.tree.map(lambda x: rng.normal(0, 1, x.shape).astype(np.float32), params)
               for _ in range(3)]
  got, want = three_steps(params, grads_seq)
  for name, x in by_name(got).items():
    np.testing.assert_allclose(x, by_name(want)[name], rtol=1e-6, atol=1e-7, err_msg=name)


def _hand_lamb(params, grads_seq, lr, b1, b2, eps, wd, clip, decayed, adapted=None):
  """LAMB as NVIDIA's and TF-Addons' write it, in numpy: bias-corrected Adam
  plus decoupled decay for the `decayed` parameters, times ||w|| / ||update||
  for the `adapted` ones (by default the same)."""
  adapted = decayed if adapted is None else adapted
  m = {k: np.zeros_like(v, np.float64) for k, v in params.items()}
  v = {k: np.zeros_like(x, np.float64) for k, x in params.items()}
  p = {k: x.astype(np.float64) for k, x in params.items()}
  for t, grads in enumerate(grads_seq, start=1):
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values()))
    scale = min(1.0, clip / norm) if clip else 1.0
    for k in p:
      g = grads[k] * scale
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      update = (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps)
      ratio = 1.0
      if decayed[k]:
        update = update + wd * p[k]
      if adapted[k]:
        w_norm, u_norm = np.linalg.norm(p[k]), np.linalg.norm(update)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
      p[k] = p[k] - lr * ratio * update
  return p


def test_lamb_matches_the_reference_and_spares_biases_and_layer_norm():
  rng = np.random.default_rng(3)
  params = {"dense": {"kernel": rng.normal(0, 0.5, (6, 4)).astype(np.float32),
                      "bias": rng.normal(0, 0.1, (4,)).astype(np.float32)},
            "layer_norm": {"scale": (1 + rng.normal(0, 0.1, (4,))).astype(np.float32),
                           "bias": rng.normal(0, 0.1, (4,)).astype(np.float32)}}
  grads_seq = [jax.tree.map(lambda x: rng.normal(0, 2, x.shape).astype(np.float32),
                            params) for _ in range(4)]
  lr, wd, clip = 1e-2, 0.01, 1.0
  config = optimizer_config(name="lamb", learning_rate=lr, weight_decay=wd, clip_norm=clip)
  tx = opt_lib.make_optimizer(config, optax.constant_schedule(lr))
  state, p = tx.init(params), params
  for grads in grads_seq:
    updates, state = jax.jit(tx.update)(grads, state, p)
    p = optax.apply_updates(p, updates)
  adapted = by_name(opt_lib.decay_mask(params))
  assert adapted == {"dense/kernel": True, "dense/bias": False,
                     "layer_norm/scale": False, "layer_norm/bias": False}
  flat = lambda tree: {k: np.asarray(x) for k, x in by_name(tree).items()}
  expected = _hand_lamb(flat(params), [flat(g) for g in grads_seq], lr, 0.9, 0.999,
                        1e-6, wd, clip, adapted)
  for k, x in flat(p).items():
    np.testing.assert_allclose(x, expected[k], rtol=2e-5, atol=1e-6, err_msg=k)
  # A trust ratio on every parameter differs from it.
  everywhere = _hand_lamb(flat(params), [flat(g) for g in grads_seq], lr, 0.9, 0.999,
                          1e-6, wd, clip, adapted, {k: True for k in adapted})
  assert not np.allclose(everywhere["layer_norm/scale"], expected["layer_norm/scale"],
                         rtol=1e-3)


def _unstack(params, num_layers):
  """A scanned model's parameters in the unrolled model's layout (layer_i)."""
  params = jax.tree.map(lambda x: x, params)  # A copy to edit.
  encoder = params["bert"]["encoder"]
  stacked = encoder.pop("layers")
  for i in range(num_layers):
    encoder[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return params


def test_lamb_trust_ratio_is_per_layer_scanned_or_not():
  """A scanned encoder's LAMB step equals the unrolled encoder's, layer by layer."""
  config = BertConfig(**TINY)
  scanned = jax.eval_shape(lambda: nn.unbox(state_lib.init_params(
      BertForPreTraining(config), jax.random.key(0))))
  unrolled = jax.eval_shape(lambda: nn.unbox(state_lib.init_params(
      BertForPreTraining(config.replace(scan_layers=False)), jax.random.key(0))))
  rng = np.random.default_rng(7)
  params = jax.tree.map(lambda x: rng.normal(0, 1, x.shape).astype(np.float32), scanned)
  # Layer 1 a hundred times smaller than layer 0: one ratio for the stack
  # would give it a step far out of proportion to its size.
  params["bert"]["encoder"]["layers"] = jax.tree.map(
      lambda x: x * np.array([1.0, 0.01], np.float32).reshape((2,) + (1,) * (x.ndim - 1)),
      params["bert"]["encoder"]["layers"])
  grads = jax.tree.map(lambda x: rng.normal(0, 1, x.shape).astype(np.float32), scanned)
  assert jax.tree.structure(_unstack(params, 2)) == jax.tree.structure(unrolled)
  lr = 1e-2
  tx = opt_lib.make_optimizer(optimizer_config(name="lamb", learning_rate=lr),
                              optax.constant_schedule(lr))

  def step(p, g):
    updates, _ = jax.jit(tx.update)(g, tx.init(p), p)
    return optax.apply_updates(p, updates)

  from_scanned = by_name(_unstack(step(params, grads), 2))
  from_unrolled = by_name(step(_unstack(params, 2), _unstack(grads, 2)))
  assert from_scanned.keys() == from_unrolled.keys()
  for name, x in from_unrolled.items():
    np.testing.assert_allclose(from_scanned[name], x, rtol=1e-5, atol=1e-7, err_msg=name)
  # Each layer's kernel moved by lr x its own norm (the first Adam step is
  # about sign(g), whatever the gradient's size).
  before = by_name(_unstack(params, 2))
  for i in range(2):
    name = f"bert/encoder/layer_{i}/mlp/intermediate/kernel"
    ratio = np.linalg.norm(from_scanned[name] - before[name]) / np.linalg.norm(before[name])
    np.testing.assert_allclose(ratio, lr, rtol=1e-3, err_msg=name)


def test_unknown_optimizer_name_is_refused():
  with pytest.raises(ValueError, match="optimizer.name"):
    opt_lib.make_optimizer(optimizer_config(name="sgd"), optax.constant_schedule(1.0))


def _child(_) -> dict:
  """In a 2-device child: accumulation over micro-batches, and LAMB, on a tiny model."""
  from bertjax.input import device as device_lib  # pylint: disable=g-import-not-at-top
  from bertjax.input.synthetic import SyntheticSource  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top

  model = BertForPreTraining(BertConfig(**TINY, hidden_dropout_rate=0.0,
                                        attention_dropout_rate=0.0))
  mesh_config = ml_collections.ConfigDict(dict(base.get_config().mesh, data=-1))
  mesh = sharding_lib.make_mesh(mesh_config)
  rules = sharding_lib.rules(mesh_config)
  batch = SyntheticSource(16, max_seq_length=16, max_predictions_per_seq=3,
                          vocab_size=TINY["vocab_size"], seed=0).batch(0)

  def one_step(name, grad_accum_steps, **changes):
    config = optimizer_config(name=name, learning_rate=1e-2, warmup_steps=0, **changes)
    tx = opt_lib.make_optimizer(config, optax.constant_schedule(config.learning_rate))
    state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
    before = jax.device_get(state.params)
    with sharding_lib.mesh_context(mesh, rules):
      step = step_lib.jit_train_step(shardings, mesh, grad_accum_steps=grad_accum_steps)
      device_batch = device_lib.to_global(batch, sharding_lib.batch_sharding(mesh))
      state, metrics = step(state, device_batch, jax.random.key(1))
    return before, jax.device_get(state.params), jax.device_get(metrics)

  # Adam's first step is about lr x sign(gradient) whatever the gradient's
  # size; with eps far above the gradients it is about lr x gradient, so the
  # parameters show any difference between the two gradients.
  before, whole, whole_metrics = one_step("adamw", 1, eps=1.0)
  _, accumulated, accumulated_metrics = one_step("adamw", 4, eps=1.0)
  lamb_before, lamb, lamb_metrics = one_step("lamb", 1)
  leaves = lambda t: [np.asarray(x) for x in jax.tree.leaves(t)]
  return dict(
      devices=jax.device_count(),
      max_update=max(float(np.max(np.abs(a - b))) for a, b in
                     zip(leaves(whole), leaves(before))),
      max_param_diff=max(float(np.max(np.abs(a - b))) for a, b in
                         zip(leaves(whole), leaves(accumulated))),
      metrics={k: [float(whole_metrics[k]), float(accumulated_metrics[k])]
               for k in ("loss", "mlm_accuracy", "nsp_accuracy", "grad_norm")},
      lamb_loss=float(lamb_metrics["loss"]),
      lamb_finite=all(bool(np.all(np.isfinite(x))) for x in leaves(lamb)),
      # LAMB scales each parameter's step to lr x its norm.
      lamb_step_ratio={name: float(np.linalg.norm(by_name(lamb)[name]
                                                  - by_name(lamb_before)[name])
                                   / np.linalg.norm(by_name(lamb_before)[name]))
                       for name in ("bert/encoder/layers/mlp/intermediate/kernel",
                                    "bert/embeddings/word_embeddings/embedding")})


@pytest.mark.slow
def test_accumulation_equals_the_whole_batch_and_lamb_trains(tmp_path_factory):
  result, _ = jax_child.run(os.path.abspath(__file__), None, devices=2,
                            cache=jax_child.cache_dir(tmp_path_factory))
  assert result["devices"] == 2
  assert result["max_update"] > 1e-4  # The step moved the parameters.
  # 4 micro-batches of 4 give the update of the batch of 16, up to rounding
  # of the parameters (float32 spacing is 1.2e-7 at 1.0).
  assert result["max_param_diff"] < 2.5e-7, result["max_param_diff"]
  for name, (whole, accumulated) in result["metrics"].items():
    np.testing.assert_allclose(accumulated, whole, rtol=1e-5, err_msg=name)
  assert result["lamb_finite"] and np.isfinite(result["lamb_loss"])
  for name, ratio in result["lamb_step_ratio"].items():
    np.testing.assert_allclose(ratio, 1e-2, rtol=1e-3, err_msg=name)


if __name__ == "__main__":
  print(json.dumps(_child(json.loads(sys.argv[1]))))


@pytest.mark.parametrize("runtime_peak", [False, True])
def test_skipped_steps_move_the_learning_rate_on_with_the_step(runtime_peak):
  # Two phases of 4 steps with a warmup of 2 each: steps 0-2 are skipped
  # (NaN gradients), so step 3 is the first applied update and step 4 the
  # second phase's first step. The rate each applied update uses is the
  # schedule's at its step, so phase two's warmup starts where its data
  # does and the run ends at the end value.
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  config = optimizer_config(weight_decay=0.0, clip_norm=0.0, per_phase_warmup=True)
  schedule = opt_lib.learning_rate_schedule(config, 8, [0, 4, 8], [2, 2])
  if runtime_peak:  # Fine-tuning's optimizer: the peak as data.
    peak = config.learning_rate
    tx = opt_lib.make_optimizer_with_runtime_peak(config, lambda t: schedule(t) / peak)
  else:
    tx = opt_lib.make_optimizer(config, schedule)
  params = {"w": jnp.zeros(3, jnp.float32)}  # At 0, the updates are exact in float32.
  state = state_lib.TrainState(step=jnp.zeros([], jnp.int32), params=params,
                               opt_state=tx.init(params), apply_fn=None, tx=tx)
  if runtime_peak:
    state = state.replace(opt_state=opt_lib.set_peak_learning_rate(state.opt_state, peak))
  applied = {}
  for step in range(8):
    g = np.nan if step < 3 else 1.0
    before = np.asarray(state.params["w"])
    state, metrics = step_lib.apply_gradients(
        state, {"w": jnp.full(3, g, jnp.float32)}, {"loss": jnp.float32(g)})
    assert bool(metrics["finite"]) == (step >= 3), step
    # Adam's first update is g / |g| = 1 per element (bias-corrected).
    applied[step] = float(before[0] - np.asarray(state.params["w"])[0])
  assert applied[0] == applied[1] == applied[2] == 0.0
  for step in range(3, 8):
    np.testing.assert_allclose(applied[step], float(schedule(step)), rtol=1e-4,
                               err_msg=f"step {step}")
  assert applied[4] == 0.0  # Phase two's warmup starts at its first step.
  np.testing.assert_allclose(applied[3], config.learning_rate / 2, rtol=1e-4)


def test_clipping_reads_the_steps_gradient_norm_and_is_optax_clipping():
  rng = np.random.default_rng(3)
  grads = {"a": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32),
           "b": jnp.asarray(rng.normal(size=7), jnp.float32)}
  norm = optax.tree.norm(grads)
  for max_norm in (0.5 * float(norm), 2 * float(norm)):  # Clipped, and left alone.
    want, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    clip = opt_lib.clip_by_global_norm(max_norm)
    for extra in ({}, {"grad_norm": norm}):
      got, _ = clip.update(grads, clip.init(grads), **extra)
      jax.tree.map(np.testing.assert_array_equal, got, want)
  # Given a norm, it uses it rather than taking its own.
  got, _ = opt_lib.clip_by_global_norm(1.0).update(grads, optax.EmptyState(),
                                                   grad_norm=jnp.float32(2.0))
  jax.tree.map(lambda g, t: np.testing.assert_allclose(g, t / 2.0, rtol=1e-6), got, grads)
