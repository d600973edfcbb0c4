"""model.layer_loop: the stacked layers in a loop or unrolled compute the same thing.

The unrolled stack (auto's choice on the CPU) and the loop (auto's choice on
TPU and GPU) run the same layers on the same stacked parameters with the
same dropout draws; training outputs and gradients agree for every path of
the encoder (all positions, the last layer at a few positions, every
layer's output), with and without recomputation.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cheap_compiles
from bertjax.fit import aot
from bertjax.model import heads
from bertjax.model import layers
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.train import flops
from bertjax.train import profiling

BATCH, LENGTH = 3, 16


def _config(**fields):
  return BertConfig(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4,
                    intermediate_size=64, max_position_embeddings=32, **fields)


def _inputs():
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 97, (BATCH, LENGTH)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 10:] = 0  # A padded row.
  segments = (np.arange(LENGTH) >= 8).astype(np.int32)[None].repeat(BATCH, 0)
  return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments)


def _loss_and_grads(make_model, config, apply_fn):
  """(outputs, loss, gradient) of a training forward pass (dropout on)."""
  model = make_model(config)
  ids, mask, segments = _inputs()
  init = lambda rng: apply_fn(model, None, ids, mask, segments, rng, init=True)
  params = nn.unbox(init(jax.random.key(0))["params"])

  def loss(p):
    out = apply_fn(model, p, ids, mask, segments, jax.random.key(1))
    return sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(out)), out
  (value, out), grads = cheap_compiles.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return out, value, grads


def _assert_close(a, b):
  """Equal up to fp32 rounding in another order of operations, at the tree's scale
  (a gradient that is zero but for rounding is compared at its tree's scale)."""
  scale = max(float(np.abs(np.asarray(y)).max()) for y in jax.tree.leaves(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5 * scale)


def _run(model, p, rng, init, *args, **kwargs):
  """model.init(rng, ...) with `init`, else a training apply with dropout from rng."""
  if init:
    return model.init(rng, *args, **kwargs)
  return model.apply({"params": p}, *args, deterministic=False, rngs={"dropout": rng},
                     **kwargs)


def _pretraining(model, p, ids, mask, segments, rng, init=False):
  positions = jnp.asarray([[1, 3, 5]] * BATCH, jnp.int32)
  return _run(model, p, rng, init, ids, mask, segments, positions, sequence_output=False)


def _classification(model, p, ids, mask, segments, rng, init=False):
  return _run(model, p, rng, init, ids, mask, segments)


def _every_layer(model, p, ids, mask, segments, rng, init=False):
  return _run(model, p, rng, init, ids, mask, segments,
              method=heads.BertModel.hidden_states)


PATHS = {
    # The last layer at [CLS] and the masked positions.
    "pretraining": (lambda c: BertForPreTraining(c), _pretraining),
    # The last layer at [CLS] alone.
    "classification": (lambda c: heads.BertForSequenceClassification(c, num_labels=3),
                       _classification),
    # Every layer at every position, every layer's output.
    "every_layer": (lambda c: heads.BertModel(c), _every_layer),
}


@pytest.mark.parametrize(("path", "remat_policy"), [
    ("classification", "none"),
    pytest.param("classification", "dots_no_batch", marks=pytest.mark.slow),
    pytest.param("pretraining", "none", marks=pytest.mark.slow),
    pytest.param("pretraining", "dots_no_batch", marks=pytest.mark.slow),
    pytest.param("every_layer", "none", marks=pytest.mark.slow),
    pytest.param("every_layer", "full", marks=pytest.mark.slow),
])
def test_unrolled_stack_matches_the_loop(path, remat_policy):
  make_model, apply_fn = PATHS[path]
  results = {loop: _loss_and_grads(make_model, _config(layer_loop=loop,
                                                       remat_policy=remat_policy), apply_fn)
             for loop in ("scan", "unroll")}
  (out_s, loss_s, grads_s), (out_u, loss_u, grads_u) = results["scan"], results["unroll"]
  # Dropout is on and the outputs are not degenerate.
  assert all(float(jnp.std(x)) > 1e-3 for x in jax.tree.leaves(out_s))
  np.testing.assert_allclose(float(loss_u), float(loss_s), rtol=2e-5)
  _assert_close(out_u, out_s)
  assert jax.tree.structure(grads_u) == jax.tree.structure(grads_s)
  _assert_close(grads_u, grads_s)
  # Every layer's slice of the stack gets a gradient of its own.
  encoder = grads_u.get("bert", grads_u)["encoder"]
  kernel = encoder["layers"]["mlp"]["intermediate"]["kernel"]
  assert all(float(jnp.abs(kernel[i]).sum()) > 0 for i in range(kernel.shape[0]))


def _compiled_train_step(config):
  model = BertForPreTraining(config)
  ids, mask, segments = _inputs()
  positions = jnp.asarray([[1, 3, 5]] * BATCH, jnp.int32)
  params = nn.unbox(model.init(jax.random.key(0), ids, mask, segments, positions)["params"])

  def loss(p):
    out = model.apply({"params": p}, ids, mask, segments, positions, deterministic=False,
                      sequence_output=False, rngs={"dropout": jax.random.key(1)})
    return sum(jnp.sum(x) for x in jax.tree.leaves(out))
  return cheap_compiles.jit(jax.grad(loss), which=cheap_compiles.CODEGEN).lower(
      params).compile()


def test_unrolled_step_has_no_layer_loop_and_xla_counts_every_layer():
  scanned = _config(layer_loop="scan")
  unrolled = _config(layer_loop="unroll")
  counted = {(c.layer_loop, c.num_layers): profiling.compiled_flops(_compiled_train_step(c))
             for c in (scanned, unrolled, unrolled.replace(num_layers=2),
                       unrolled.replace(num_layers=4))}
  # The loop runs the first two layers (the last runs apart, at [CLS] and the
  # masked positions) and XLA counts its body once: one layer goes missing
  # there, none unrolled, where each layer adds its own count. What XLA
  # counts for one more layer moves with the fusions around it (by almost a fifth
  # between the third and the fourth here): a layer is the mean of two.
  one_layer = (counted["unroll", 4] - counted["unroll", 2]) / 2
  missing = counted["unroll", 3] - counted["scan", 3]
  assert one_layer > 0 and abs(missing - one_layer) < 0.1 * one_layer, (missing, one_layer)
  assert profiling.complete_count(unrolled, 1)
  assert not profiling.complete_count(scanned, 1)
  assert not profiling.complete_count(unrolled, 2)
  # The fit check's view of what XLA counts follows the platform's choice.
  auto = _config(layer_loop="auto").replace(hidden_size=256)
  whole = flops.train_flops_per_sequence(auto, 128, 20) * 8
  assert aot.flops_as_xla_counts(auto, 128, 20, 8, "xla", platform="cpu") == pytest.approx(
      whole)
  assert aot.flops_as_xla_counts(auto, 128, 20, 8, "xla", platform="tpu") < whole


def test_auto_unrolls_on_the_cpu_from_hidden_size_256():
  auto = _config(layer_loop="auto").replace(hidden_size=256)
  assert layers.unrolls(auto, "cpu")
  assert not layers.unrolls(auto, "tpu") and not layers.unrolls(auto, "gpu")
  assert layers.unrolls(auto) == (jax.default_backend() == "cpu")
  assert not layers.unrolls(auto.replace(hidden_size=128), "cpu")
  assert layers.unrolls(_config(layer_loop="unroll"), "tpu")
  assert not layers.unrolls(auto.replace(layer_loop="scan"), "cpu")


def test_unknown_layer_loop_names_the_field():
  with pytest.raises(ValueError, match=r"model\.layer_loop: 'while' is not one of"):
    _config(layer_loop="while")
