"""The tied masked-LM decoder: logits of rows against the word table.

`tied_logits` is the one way onto the word table (layers.Embeddings.attend):
it checks the table's sharding, pads the vocab columns, and calls
`tied_decoder`, whose gradient is written out; `sum_rows` is its bias
gradient's sum over rows.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import attention
from bertjax.model.config import BertConfig

# Rows projected onto the table: split over the batch, whole along the hidden axis.
BATCH_PREDICTIONS_EMBED = ("activation_batch", None, "activation_embed")
PADDED_LOGIT = float(jnp.finfo(jnp.float32).min)


def tied_logits(x_BxPxD, table_VxD, bias_V, config: BertConfig):
  """The one way onto the word table: x . table^T + bias in fp32, [B, P, padded vocab].

  Every head that projects onto the word table goes through here. XLA
  (jax 0.10.2, CPU) computes wrong gradients, about 100% off, for the
  weights before such a projection when the table is laid out [tensor,
  fsdp] and the batch is split over (data, fsdp); tests/test_sharding.py
  keeps a plain-JAX reproduction. So the table's embed axis has its own
  logical name, 'vocab_embed', this function refuses rules that map it onto
  any mesh axis that splits the batch (a wider fence than the layout seen
  to fail), and it fixes x's layout before the product.

  Columns past config.vocab_size (the table's padding to vocab_multiple)
  are set to the most negative float instead of being cut off, so a
  tensor-split vocab axis keeps its shards; softmax, cross entropy and
  argmax over the padded row equal those over the first vocab_size
  columns.
  """
  _check_table_layout()
  x_BxPxD = nn.with_logical_constraint(x_BxPxD, BATCH_PREDICTIONS_EMBED)
  if table_VxD.shape[0] != config.vocab_size:
    # The padding rides on the bias, whose add XLA's CPU backend fuses with
    # the product, instead of a select over every logit: PADDED_LOGIT plus a
    # product below 2**100 in size rounds to PADDED_LOGIT. The padded
    # columns' softmax weight is 0, so they add nothing to the other
    # gradients, and the where passes none to the bias parameter's padded
    # entries.
    column_V = jnp.arange(bias_V.shape[0])
    bias_V = jnp.where(column_V < config.vocab_size, bias_V.astype(jnp.float32), PADDED_LOGIT)
  return tied_decoder(x_BxPxD, table_VxD, bias_V, config.compute_dtype)


def _check_table_layout():
  table_axes = _mesh_axes(nn.logical_to_mesh_axes(("vocab_embed",))[0])
  batch_axes = _mesh_axes(nn.logical_to_mesh_axes(("activation_batch",))[0])
  shared = sorted(table_axes & batch_axes)
  if shared:
    raise ValueError(
        f"config.mesh.rules: 'vocab_embed' (the word table's embed axis) maps to mesh "
        f"axes {shared} that also split the batch ('activation_batch'); XLA computes "
        "wrong gradients of the layers before the tied decoder with that layout. "
        "Map 'vocab_embed' to None (or to mesh axes the batch does not use).")


def _mesh_axes(spec) -> set:
  if spec is None:
    return set()
  return {spec} if isinstance(spec, str) else set(spec)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def tied_decoder(x_BxPxD, table_VxD, bias_V, compute_dtype):
  """x . table^T + bias in fp32: the masked-LM decoder on the word table.

  The gradient is written out (custom_vjp): two plain matmuls, with the
  table's gradient formed as [D, V] and transposed, and the bias's a sum
  over the rows in fp32. The values are autodiff's (up to float summation
  order); XLA's CPU backend ran this form faster than the transposes autodiff
  emits, and the other backends see the same matmuls.
  """
  return _decode(x_BxPxD, table_VxD, bias_V, compute_dtype)


def _decode(x_BxPxD, table_VxD, bias_V, compute_dtype):
  logits_BxPxV = jnp.einsum("bpd,vd->bpv", x_BxPxD.astype(compute_dtype),
                            table_VxD.astype(compute_dtype),
                            preferred_element_type=jnp.float32)
  return logits_BxPxV + bias_V.astype(jnp.float32)


def _decode_fwd(x_BxPxD, table_VxD, bias_V, compute_dtype):
  return _decode(x_BxPxD, table_VxD, bias_V, compute_dtype), (x_BxPxD, table_VxD, bias_V)


def _decode_bwd(compute_dtype, residuals, g_BxPxV):
  x_BxPxD, table_VxD, bias_V = residuals
  g_NxV = g_BxPxV.reshape(-1, g_BxPxV.shape[-1])
  x_NxD = x_BxPxD.reshape(-1, x_BxPxD.shape[-1])
  g_c = g_NxV.astype(compute_dtype)
  dx_NxD = jnp.matmul(g_c, table_VxD.astype(compute_dtype), preferred_element_type=jnp.float32)
  dtable_DxV = jnp.matmul(x_NxD.astype(compute_dtype).T, g_c,
                          preferred_element_type=jnp.float32)
  # A sum, not a ones-vector matmul: matmuls of fp32 run at bf16 (TPU) or
  # TF32 (GPU) by default, sums stay fp32.
  dbias_V = sum_rows(g_NxV.astype(jnp.float32))
  return (dx_NxD.reshape(x_BxPxD.shape).astype(x_BxPxD.dtype),
          dtable_DxV.T.astype(table_VxD.dtype), dbias_V.astype(bias_V.dtype))


tied_decoder.defvjp(_decode_fwd, _decode_bwd)


def sum_rows(x_NxV, rows: int = 8):
  """x summed over its rows, [N, V] -> [V].

  For the CPU backend, adjacent rows are added pairwise while there are more
  than `rows` of them (and an even number), then one reduction finishes:
  XLA's CPU reduction over the rows of a wide array (640 x 30,592 in the
  masked-LM decoder's bias gradient) runs about ten times slower than the
  same number of contiguous adds. Other backends take one jnp.sum.
  """
  if attention.target_platform() == "cpu":
    while x_NxV.shape[0] > rows and x_NxV.shape[0] % 2 == 0:
      pairs = x_NxV.reshape((x_NxV.shape[0] // 2, 2) + x_NxV.shape[1:])
      x_NxV = pairs[:, 0] + pairs[:, 1]
  return jnp.sum(x_NxV, axis=0)
