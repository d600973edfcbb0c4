"""The tied masked-LM decoder (bertjax/model/decoder.py): its written-out
gradient against autodiff's, the bias gradient's fp32 sum, sum_rows."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import decoder


def _equations(jaxpr):
  """Every equation of a jaxpr, nested ones included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _equations(sub)


def test_tied_decoder_bias_gradient_is_an_fp32_sum():
  """Not a ones-vector matmul, which runs at bf16 (TPU) or TF32 (GPU) by default."""
  x, table, bias = jnp.ones((3, 5, 16)), jnp.ones((256, 16)), jnp.ones((256,))
  grad_bias = lambda b: jax.grad(
      lambda b: jnp.sum(decoder.tied_decoder(x, table, b, jnp.dtype(jnp.bfloat16))))(b)
  eqns = list(_equations(jax.make_jaxpr(grad_bias)(bias).jaxpr))
  dots = [e for e in eqns if e.primitive.name == "dot_general"]
  # The forward product; the gradients of x and of the table. None for the bias.
  assert len(dots) == 3, [e.outvars[0].aval for e in dots]
  assert not any(e.outvars[0].aval.shape in ((256,), (1, 256)) for e in dots)
  sums = [e for e in eqns if e.primitive.name == "reduce_sum"
          and e.outvars[0].aval.shape == (256,)]
  assert sums and all(e.outvars[0].aval.dtype == jnp.float32 for e in sums)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_tied_decoder_gradient_matches_autodiff(dtype, tol):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, 16)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(256, 16)) * 0.1, jnp.float32)
  bias = jnp.asarray(rng.normal(size=(256,)), jnp.float32)
  weights = jnp.asarray(rng.normal(size=(3, 5, 256)), jnp.float32)

  def loss(decode, *args):
    return jnp.sum(decode(*args, jnp.dtype(dtype)) * weights)

  fast = jax.grad(functools.partial(loss, decoder.tied_decoder), argnums=(0, 1, 2))(
      x, table, bias)
  plain = jax.grad(functools.partial(loss, decoder._decode), argnums=(0, 1, 2))(  # pylint: disable=protected-access
      x, table, bias)
  for a, b, name in zip(fast, plain, ("x", "table", "bias")):
    assert a.dtype == b.dtype, name
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max(), err_msg=name)


@pytest.mark.parametrize("rows", [1, 7, 8, 15, 640])
def test_sum_rows_is_the_column_sum(rows):
  x = np.random.default_rng(rows).normal(size=(rows, 96)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(decoder.sum_rows(jnp.asarray(x))),
                             x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
