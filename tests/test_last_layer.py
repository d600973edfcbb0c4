"""The last encoder layer at [CLS] and the masked positions only (the train step's path).

Against the full computation: outputs and gradients in fp32 and bf16, with
dropout where the masks coincide, and the compiled gradient's temporary
memory (no copy of the stacked parameters).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cheap_compiles
from bertjax.model.bert import BertForPreTraining
from test_model import BATCH, LENGTH, PREDICTIONS, _abstract_params, init_params, make_batch, tiny

pytestmark = pytest.mark.slow


# Scanned, three layers make a loop of two before the last; unrolled, the
# layers before the last are a Python loop, which runs one as it runs two.
@pytest.mark.parametrize("scan_layers,num_layers,remat,dtype", [
    (True, 3, "none", "float32"), (True, 3, "dots_no_batch", "float32"),
    (True, 1, "none", "float32"), (False, 2, "none", "float32"),
    (False, 1, "dots_no_batch", "float32"), (True, 3, "none", "bfloat16"),
    (False, 2, "dots_no_batch", "bfloat16")])
def test_last_layer_at_read_positions_only_gives_the_same_heads_and_gradients(
    scan_layers, num_layers, remat, dtype):
  config = tiny(scan_layers=scan_layers, num_layers=num_layers, remat_policy=remat, dtype=dtype)
  params, batch = init_params(config), make_batch()
  model = BertForPreTraining(config)
  # bf16 matmuls round differently when the last layer sees fewer rows.
  tol = dict(atol=1e-5, rtol=1e-5) if dtype == "float32" else dict(atol=3e-2, rtol=3e-2)

  def loss(p, sequence_output):
    out = model.apply(p, **batch, sequence_output=sequence_output)
    return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"] * 3.0), out

  grad = cheap_compiles.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (full, full_out), full_grads = grad(params, True)
  (part, part_out), part_grads = grad(params, False)
  assert "sequence_output" in full_out and "sequence_output" not in part_out
  for k in ("mlm_logits", "nsp_logits", "pooled_output"):
    np.testing.assert_allclose(np.asarray(part_out[k], np.float32),
                               np.asarray(full_out[k], np.float32), **tol, err_msg=k)
  np.testing.assert_allclose(part, full, rtol=tol["rtol"])
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(part_grads),
                          jax.tree.leaves(full_grads)):
    scale = float(np.abs(np.asarray(b, np.float32)).max())
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               atol=tol["atol"] * max(1.0, scale), rtol=10 * tol["rtol"],
                               err_msg=jax.tree_util.keystr(path))
  # The last layer's weights do get gradients (through [CLS] and the masked positions).
  last = (part_grads["params"]["bert"]["encoder"]["layers"]["mlp"]["output"]["kernel"][-1]
          if scan_layers else
          part_grads["params"]["bert"]["encoder"][f"layer_{num_layers - 1}"]["mlp"]["output"][
              "kernel"])
  assert np.abs(np.asarray(last, np.float32)).max() > 0


@pytest.mark.parametrize("scan_layers", [True, False])
def test_last_layer_at_read_positions_with_dropout(scan_layers):
  """In training the last layer draws its dropout masks for the positions it
  computes. Dropout's counters are (row, flat index), so when those positions
  are the sequence's first rows and there is one head, the masks are the
  full computation's: the outputs and gradients are then the same. (Layers
  as in the test above: a loop of two scanned, one before the last unrolled.)"""
  config = tiny(scan_layers=scan_layers, num_layers=3 if scan_layers else 2, num_heads=1,
                hidden_dropout_rate=0.2, attention_dropout_rate=0.2)
  params, batch = init_params(config), make_batch()
  model = BertForPreTraining(config)

  def loss(p, positions, sequence_output):
    out = model.apply(p, **dict(batch, masked_lm_positions=positions), deterministic=False,
                      sequence_output=sequence_output, rngs={"dropout": jax.random.key(3)})
    return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"] * 3.0), out

  first_rows = np.tile(np.arange(1, PREDICTIONS + 1, dtype=np.int32), (BATCH, 1))
  grad = cheap_compiles.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=2)
  (full, full_out), full_grads = grad(params, first_rows, True)
  (part, part_out), part_grads = grad(params, first_rows, False)
  deterministic = cheap_compiles.jit(
      lambda p: model.apply(p, **dict(batch, masked_lm_positions=first_rows)))(params)
  assert not np.allclose(full_out["mlm_logits"], deterministic["mlm_logits"], atol=1e-3)
  for k in ("mlm_logits", "nsp_logits", "pooled_output"):
    np.testing.assert_allclose(part_out[k], full_out[k], atol=1e-5, rtol=1e-5, err_msg=k)
  np.testing.assert_allclose(part, full, rtol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(part_grads),
                          jax.tree.leaves(full_grads)):
    # Float rounding scales with the array's largest entries (up to ~50 here).
    scale = max(1.0, float(np.abs(np.asarray(b)).max()))
    np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=1e-4,
                               err_msg=jax.tree_util.keystr(path))
  # Elsewhere the masks differ, so the losses differ by dropout's noise.
  spread = np.stack([np.sort(np.random.default_rng(9).choice(np.arange(1, n), PREDICTIONS,
                                                             replace=False))
                     for n in (LENGTH, 11, 6)]).astype(np.int32)
  # (The losses of the programs above, which take these positions as they are.)
  assert float(grad(params, spread, True)[0][0]) != float(grad(params, spread, False)[0][0])


def test_last_layer_at_read_positions_keeps_no_copy_of_the_stack():
  """The gradient of the training path (last layer at the read positions)
  needs no more temporary memory than the full path's, give or take one
  layer's parameters: slicing the stacked parameters [:L-1] copies them."""
  config = tiny(vocab_size=512, hidden_size=256, num_heads=4, intermediate_size=1024,
                num_layers=6, max_position_embeddings=64)
  params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                        nn.unbox(_abstract_params(config)))
  model = BertForPreTraining(config)
  ids = jnp.ones((2, 64), jnp.int32)
  positions = jnp.tile(jnp.arange(1, 11, dtype=jnp.int32), (2, 1))

  def temp_bytes(sequence_output):
    def loss(p):
      out = model.apply(p, ids, ids, ids * 0, positions, sequence_output=sequence_output)
      return jnp.sum(out["mlm_logits"][..., :4]) + jnp.sum(out["nsp_logits"])
    # Code generation's options leave XLA's buffers as the default compile has them.
    compiled = cheap_compiles.jit(jax.grad(loss), which=cheap_compiles.CODEGEN).lower(
        params).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  layer_bytes = sum(x.nbytes for x in jax.tree.leaves(params["params"]["bert"]["encoder"]))
  layer_bytes //= config.num_layers
  full, part = temp_bytes(True), temp_bytes(False)
  assert part <= full + layer_bytes, (part / 2**20, full / 2**20, layer_bytes / 2**20)
