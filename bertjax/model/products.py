"""The Dense layers' matrix products: x's trailing axes against a kernel.

On the CPU, two-dimensional products with a written-out gradient
(`contract_trailing`); on TPU and GPU, jnp.tensordot.
"""

import functools
import math

import jax
import jax.numpy as jnp

from bertjax.model import attention


def contract_trailing(x, kernel, contract: int):
  """x's trailing `contract` axes against kernel's leading ones (a tensordot).

  On the CPU every product is two-dimensional: [rows, K] . [K, F], with the
  other axes of x as rows and the kernel's trailing axes as F, reshaped
  back, and the gradient's two products likewise (`_flat_product`, a
  `custom_vjp` that keeps x and the kernel in their own shapes, as autodiff
  of the tensordot does). XLA:CPU then runs the backward pass without the
  transposed copies and broadcast fusions it emits for the higher-rank
  contraction (docs/performance.md has the step times). Elsewhere the
  tensordot: the two-dimensional form has been timed on the CPU only.
  """
  if attention.target_platform() != "cpu":
    return jnp.tensordot(x, kernel, axes=contract)
  return _flat_product(x, kernel, contract)


def _as_matrices(x, kernel, contract: int):
  inner = math.prod(kernel.shape[:contract])
  return x.reshape(-1, inner), kernel.reshape(inner, -1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _flat_product(x, kernel, contract: int):
  x_RxK, kernel_KxF = _as_matrices(x, kernel, contract)
  return (x_RxK @ kernel_KxF).reshape(x.shape[:x.ndim - contract] + kernel.shape[contract:])


def _flat_product_fwd(x, kernel, contract: int):
  return _flat_product(x, kernel, contract), (x, kernel)


def _flat_product_bwd(contract: int, residuals, g):
  x, kernel = residuals
  x_RxK, kernel_KxF = _as_matrices(x, kernel, contract)
  g_RxF = g.reshape(x_RxK.shape[0], kernel_KxF.shape[1])
  if kernel_KxF.shape[0] > kernel_KxF.shape[1]:
    # A tall kernel's gradient as [F, K], then transposed: XLA:CPU's product
    # over the rows ran faster with the wider operand on the right, and the
    # barrier keeps XLA from folding the transpose back into it.
    dkernel_KxF = jax.lax.optimization_barrier(g_RxF.T @ x_RxK).T
  else:
    dkernel_KxF = x_RxK.T @ g_RxF
  return (g_RxF @ kernel_KxF.T).reshape(x.shape), dkernel_KxF.reshape(kernel.shape)


_flat_product.defvjp(_flat_product_fwd, _flat_product_bwd)
