"""The written-out gradients (GELU, LayerNorm, dropout, softmax x values, the
Dense's two-dimensional product) against autodiff.

Each agrees with autodiff of the plain formula, in fp32 and in bf16, and
keeps fewer arrays for the backward pass: with scanned layers every kept
array is a stacked residual of every layer, so the count is what the
custom gradients are for.
"""

import contextlib
import io
import re

import flax.linen as nn
import jax
from jax import ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import attention
from bertjax.model import dropout
from bertjax.model import layers
from bertjax.model import products
from bertjax.model.config import BertConfig

TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


DTYPES = {"f32": jnp.dtype(jnp.float32), "bf16": jnp.dtype(jnp.bfloat16),
          "bool": jnp.dtype(bool), "i32": jnp.dtype(jnp.int32), "u32": jnp.dtype(jnp.uint32)}


def kept(fn, *args):
  """The arrays autodiff keeps for the backward pass (not the arguments themselves),
  as (shape, dtype), read from jax.ad_checkpoint.print_saved_residuals."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    ad_checkpoint.print_saved_residuals(fn, *args)
  found = []
  for line in out.getvalue().splitlines():
    m = re.match(r"(\w+)\[([\d,]*)\] (.*)", line)
    assert m, line
    shape = tuple(int(d) for d in m.group(2).split(",") if d)
    if m.group(3).startswith("output of") and int(np.prod(shape)) > 1:
      found.append((shape, DTYPES[m.group(1)]))
  return found


def assert_close(a, b, dtype, name=""):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  tol = TOLERANCE[dtype]
  np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, np.abs(b).max()), err_msg=name)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gelu_matches_autodiff_of_the_exact_formula(dtype):
  x = jnp.asarray(np.linspace(-6, 6, 301), dtype)
  weights = jnp.asarray(np.random.default_rng(0).normal(size=301), dtype)
  plain = lambda t: jnp.sum(nn.gelu(t, approximate=False) * weights)
  ours = lambda t: jnp.sum(layers.gelu(t) * weights)
  assert_close(layers.gelu(x), nn.gelu(x, approximate=False), dtype)
  grad = jax.grad(ours)(x)
  assert grad.dtype == dtype
  assert_close(grad, jax.grad(plain)(x), dtype)


def test_feed_forward_keeps_two_wide_arrays():
  w1, w2 = jnp.ones((16, 64)) * 0.1, jnp.ones((64, 16)) * 0.1
  x = jnp.ones((2, 8, 16))
  wide = lambda fn: [s for s, _ in kept(lambda a, b, t: jnp.sum(fn(t @ a) @ b), w1, w2, x)
                     if s[-1] == 64]
  assert len(wide(lambda h: nn.gelu(h, approximate=False))) == 4  # What autodiff keeps.
  assert len(wide(layers.gelu)) == 2  # The GELU's input and output.


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("x_shape, kernel_shape, contract", [
    ((2, 8, 16), (16, 24), 1),  # A feed-forward projection.
    ((2, 8, 16), (16, 4, 6), 1),  # Queries: [D] -> [N, H].
    ((2, 8, 4, 6), (4, 6, 16), 2),  # The attention output: [N, H] -> [D].
    ((3, 16), (16, 5), 1)])  # A pooled [B, D] input.
def test_dense_product_matches_tensordot_and_keeps_its_inputs(dtype, x_shape, kernel_shape,
                                                              contract):
  """The CPU's two-dimensional product (products.contract_trailing) against
  autodiff of jnp.tensordot: value, both gradients in their own dtype, and
  the same arrays kept for the backward pass (x and the kernel as given)."""
  rng = np.random.default_rng(7)
  x = jnp.asarray(rng.normal(size=x_shape), dtype)
  kernel = jnp.asarray(rng.normal(size=kernel_shape) / 4, dtype)
  out_shape = x_shape[:len(x_shape) - contract] + kernel_shape[contract:]
  w = jnp.asarray(rng.normal(size=out_shape), jnp.float32)
  ours = lambda a, b: products.contract_trailing(a, b, contract)
  plain = lambda a, b: jnp.tensordot(a, b, axes=contract)
  assert ours(x, kernel).shape == out_shape and ours(x, kernel).dtype == dtype
  assert_close(ours(x, kernel), plain(x, kernel), dtype)
  loss = lambda fn: lambda a, b: jnp.sum(fn(a, b).astype(jnp.float32) * w)
  got = jax.grad(loss(ours), argnums=(0, 1))(x, kernel)
  want = jax.grad(loss(plain), argnums=(0, 1))(x, kernel)
  for name, a, b in zip(("dx", "dkernel"), got, want):
    assert a.dtype == dtype and a.shape == b.shape, name
    assert_close(a, b, dtype, name)
  wrapped = lambda fn: lambda a, b: loss(fn)(jnp.sin(a), jnp.cos(b))  # Kept arrays, not inputs.
  assert sorted(kept(wrapped(ours), x, kernel), key=str) == sorted(
      kept(wrapped(plain), x, kernel), key=str)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_matches_flax(dtype):
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(3, 5, 32)) * 3 + 1, dtype)
  weights = jnp.asarray(rng.normal(size=(3, 5, 32)), jnp.float32)
  ours = layers.LayerNorm(1e-12)
  flax_ln = nn.LayerNorm(epsilon=1e-12, dtype=jnp.float32, use_fast_variance=False)
  params = ours.init(jax.random.key(0), x)
  assert jax.tree.map(jnp.shape, nn.unbox(params)) == jax.tree.map(
      jnp.shape, flax_ln.init(jax.random.key(0), x))
  assert params["params"]["scale"].names == ("norm",)
  # Parameters that are not the initial ones, so that their gradients matter.
  params = jax.tree.map(lambda p: p + jnp.asarray(rng.normal(size=p.shape), p.dtype),
                        nn.unbox(params))
  y = ours.apply(params, x)
  assert y.dtype == jnp.float32
  assert_close(y, flax_ln.apply(params, x), jnp.float32)
  loss = lambda module: lambda p, t: jnp.sum(module.apply(p, t) * weights)
  (gp, gx), (fp, fx) = (jax.grad(loss(m), argnums=(0, 1))(params, x) for m in (ours, flax_ln))
  assert gx.dtype == dtype
  assert_close(gx, fx, jnp.float32 if dtype == jnp.float32 else dtype, "x")
  for name in ("scale", "bias"):
    assert_close(gp["params"][name], fp["params"][name], jnp.float32, name)
  full = [s for s, _ in kept(loss(ours), params, x) if s == x.shape]
  assert len(full) == 1  # The normalised x.
  assert len([s for s, _ in kept(loss(flax_ln), params, x) if s == x.shape]) == 3


def test_dropout_gradient_is_the_mask_and_keeps_only_the_mask():
  x = jnp.asarray(np.random.default_rng(2).normal(size=(4, 64)), jnp.float32)
  keep = dropout.keep_mask(jax.random.key(3), x.shape, 0.25)
  y, pullback = jax.vjp(lambda t: dropout.apply_keep_mask(t, keep, 0.25), x)
  np.testing.assert_array_equal(y, jnp.where(keep, x / 0.75, 0.0))
  (g,) = pullback(jnp.ones_like(x))
  np.testing.assert_array_equal(g, jnp.where(keep, 1 / 0.75, 0.0))
  def loss(apply):
    return lambda t: jnp.sum(apply(t, dropout.keep_mask(jax.random.key(3), x.shape, 0.25)) ** 2)
  ours = kept(loss(lambda t, k: dropout.apply_keep_mask(t, k, 0.25)), x)
  assert sorted(str(dt) for _, dt in ours) == ["bool", "float32"]  # The mask; y for the square.
  # A select differentiated by autodiff also keeps an array of zeros.
  assert len(kept(loss(lambda t, k: jax.lax.select(k, t / 0.75, jnp.zeros_like(t))), x)) == 3


def test_product_mask_dropout_keeps_its_words_not_a_mask():
  """Dropout's own path: the same values and gradient as the boolean mask's,
  and for the backward pass only the row and column words."""
  x = jnp.asarray(np.random.default_rng(2).normal(size=(4, 8, 64)), jnp.float32)
  key, rate = jax.random.key(3), 0.25
  keep = dropout.keep_mask(key, x.shape, rate)
  scale = 1 / (1 - dropout.drop_rate(rate))
  words = dropout.keep_words(key, x.shape)
  y, pullback = jax.vjp(lambda t: dropout.apply_product_mask(t, *words, rate), x)
  np.testing.assert_array_equal(y, jnp.where(keep, x * jnp.float32(scale), 0.0))
  np.testing.assert_allclose(pullback(jnp.ones_like(x))[0], jnp.where(keep, scale, 0.0),
                             rtol=1e-7)
  module = dropout.Dropout(rate)
  loss = lambda t: jnp.sum(module.apply({}, t, False, rngs={"dropout": key}) ** 2)
  shapes = [(s, str(dt)) for s, dt in kept(loss, x)]
  assert ((4, 8, 64), "bool") not in shapes, shapes
  assert sorted(shapes) == sorted([((4, 8, 64), "float32"), ((4, 8, 1), "uint32"),
                                   ((1, 1, 64), "uint32")]), shapes


def plain_probabilities_times_values(logits, v, mask, words, rate):
  logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if words is not None:
    keep = dropout.product_keep(words[0][:, None, :, None], words[1][:, :, None, :], rate)
    probs = jnp.where(keep, probs / (1 - dropout.attention_drop_rate(rate)), 0.0)
  return jnp.einsum("bnls,bsnh->blnh", probs.astype(v.dtype), v)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_probabilities_times_values_matches_autodiff(dtype, rate):
  rng = np.random.default_rng(4)
  b, n, length, h = 3, 2, 16, 8
  logits = jnp.asarray(rng.normal(size=(b, n, length, length)) * 2, jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, length, n, h)), dtype)
  mask = jnp.asarray(np.arange(length)[None, :] < np.array([16, 9, 0])[:, None])  # Row 2: all padding.
  keep = dropout.attention_words(jax.random.key(5), b, n, length) if rate else None
  weights = jnp.asarray(rng.normal(size=(b, length, n, h)), jnp.float32)
  loss = lambda fn: lambda lg, vv: jnp.sum(fn(lg, vv, mask, keep, rate).astype(jnp.float32)
                                           * weights)
  ours, plain = attention.probabilities_times_values, plain_probabilities_times_values
  assert_close(ours(logits, v, mask, keep, rate), plain(logits, v, mask, keep, rate), dtype)
  (g_logits, g_v), (p_logits, p_v) = (jax.grad(loss(f), argnums=(0, 1))(logits, v)
                                      for f in (ours, plain))
  assert g_v.dtype == dtype
  assert_close(g_logits, p_logits, dtype, "logits")
  assert_close(g_v, p_v, dtype, "v")
  square = lambda fn: [str(dt) for s, dt in kept(loss(fn), logits, v) if s == logits.shape]
  # The probabilities in the compute dtype (and the boolean keep-mask);
  # autodiff keeps more, the probabilities in fp32.
  assert [dt for dt in square(ours) if dt != "bool"] == [str(jnp.dtype(dtype))]
  assert len([dt for dt in square(plain) if dt != "bool"]) == (4 if rate else 3)
  assert "float32" in square(plain)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_scaled_logits_match_autodiff_and_run_dq_and_dk_in_the_compute_dtype(dtype):
  rng = np.random.default_rng(6)
  q, k = (jnp.asarray(rng.normal(size=(2, 16, 2, 8)), dtype) for _ in range(2))
  w = jnp.asarray(rng.normal(size=(2, 2, 16, 16)), jnp.float32)
  plain = lambda q, k: jnp.einsum("blnh,bsnh->bnls", q, k, preferred_element_type=jnp.float32
                                  ) / jnp.sqrt(jnp.float32(8))
  np.testing.assert_array_equal(attention.scaled_logits(q, k), plain(q, k))
  loss = lambda fn: lambda q, k: jnp.sum(fn(q, k) * w)
  ours = jax.grad(loss(attention.scaled_logits), argnums=(0, 1))(q, k)
  theirs = jax.grad(loss(plain), argnums=(0, 1))(q, k)
  for name, a, b in zip("qk", ours, theirs):
    assert a.dtype == dtype
    assert_close(a, b, dtype, f"d{name}")
  # The backward's two products take operands in the compute dtype only.
  hlo = jax.jit(jax.grad(loss(attention.scaled_logits), argnums=(0, 1))).lower(q, k).as_text()
  operands = re.findall(r"stablehlo.dot_general .*: \((tensor<[^>]*>), (tensor<[^>]*>)\)", hlo)
  assert len(operands) == 2, hlo  # dq's and dk's (the loss is linear in the logits).
  short = {jnp.float32: "f32", jnp.bfloat16: "bf16"}[dtype]
  assert all(a.endswith(f"x{short}>") and b.endswith(f"x{short}>") for a, b in operands)


@pytest.mark.slow
def test_a_layer_keeps_one_square_and_two_wide_arrays():
  """What a training layer keeps for its backward pass, by shape."""
  c = BertConfig(vocab_size=128, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=128,
                 hidden_dropout_rate=0.1, attention_dropout_rate=0.1, dtype="float32",
                 attention_impl="xla")
  layer = layers.TransformerLayer(c, deterministic=False)
  x, mask = jnp.ones((2, 16, 32)), jnp.ones((2, 16), bool)
  params = layer.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x, mask)
  loss = lambda p, t: jnp.sum(layer.apply(p, t, mask, rngs={"dropout": jax.random.key(2)})[0])
  shapes = kept(loss, params, x)
  floats = lambda shape: sum(s == shape and dt == jnp.float32 for s, dt in shapes)
  # On one CPU device attention runs in slices of the batch, each keeping
  # its own rows.
  slices = attention.batch_slices(2)
  rows = 2 // slices
  assert floats((rows, 2, 16, 16)) == slices  # Attention probabilities.
  assert floats((2, 16, 128)) == 2  # GELU input and output.
  # q, k and v, and the attention output ([B, L, N, H]); per LayerNorm its
  # x_hat, and the first one's output, which the feed-forward reads.
  if slices == 1:
    assert floats((2, 16, 2, 16)) == 4
  else:
    assert floats((rows, 16, 2, 16)) == 3 * slices and floats((2, 16, 2, 16)) == 1
  assert floats((2, 16, 32)) == 3
