# Copyright 2023 The JAX Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Modified for bertjax from jax/experimental/pallas/ops/tpu/flash_attention.py
# (jax 0.10.2): dropout on the attention probabilities, drawn in the kernels
# from bertjax.model.dropout's row and column words; the attention bias, batch
# blocks and the kv sub-blocks removed; the log-sum-exp kept instead of the
# row max and sum; dq computed in the dk/dv pass when the keys are one block.

"""Flash attention with dropout on the probabilities, for TPU (Pallas, Mosaic).

`flash_attention(q, k, v, q_segment_ids, kv_segment_ids, drop_rows, drop_cols, ...)` with
q, k and v positions-minor ([B, N, H, L]): held so, the queries, keys and
values a layer keeps for the backward pass (scanned layers stack them) need
no padding of a head size below 128 lanes, which a heads-major [B, N, L, H]
layout gets on TPU (twice the bytes at H = 64). A query sees the keys of its own segment
id (and with `causal` none after it). With `dropout_rate` > 0 each
probability is dropped where dropout.attention_keep_mask drops it: the
kernels read the row words of their queries and the column words of their
keys (dropout.attention_words) and form each block's mask from their
products (dropout.product_keep, a multiplication and a comparison per
probability); the backward pass forms it again rather than storing it. The
kept probabilities are scaled by 1 / (1 - p), p =
dropout.attention_drop_rate(dropout_rate). The plain-JAX reference is
bertjax.model.attention.xla_attention. On CPU, `interpret=True` runs the
kernels in Pallas interpret mode (tests).

The forward pass keeps the output and each query's log-sum-exp of its
logits; the backward recomputes the probabilities from them. Grids run over
(batch, heads, blocks, blocks), the last one the reduction.
"""

import dataclasses
import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp

from bertjax.model import dropout

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
NUM_LANES = 128
NUM_SUBLANES = 8
TRANS_A = (((0,), (0,)), ((), ()))  # x.T @ y
TRANS_B = (((1,), (1,)), ((), ()))  # x @ y.T


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Rows of queries and of keys per grid step, per pass (multiples of 128).
  `block_k_dkv` equal to the key length puts dq in the dk/dv pass (one
  pass over the probabilities instead of two)."""
  block_q: int = 128
  block_k: int = 128
  block_q_dkv: int = 128
  block_k_dkv: int = 128
  block_q_dq: int = 128
  block_k_dq: int = 128

  @classmethod
  def for_length(cls, length: int, longest: int = 512) -> "BlockSizes":
    """128 query rows; keys in one block up to `longest` (so dq joins the dk/dv pass)."""
    k = min(length, longest)
    while length % k:
      k -= NUM_LANES
    return cls(block_q=NUM_LANES, block_k=k, block_q_dkv=NUM_LANES, block_k_dkv=k,
               block_q_dq=NUM_LANES, block_k_dq=k)


@dataclasses.dataclass(frozen=True)
class _Static:
  dropout_rate: float
  causal: bool
  sm_scale: float
  blocks: BlockSizes
  interpret: bool


def flash_attention(q, k, v, q_segment_ids, kv_segment_ids, drop_rows=None, drop_cols=None,
                    *, dropout_rate: float = 0.0, causal: bool = False, sm_scale: float = 1.0,
                    block_sizes: BlockSizes | None = None, interpret: bool = False):
  """softmax(q^T k * sm_scale, masked) dropped out, times v^T: [B, N, Q, H].

  q [B, N, H, Q], k and v [B, N, H, K]; segment ids [B, Q] and [B, K]
  (int32); with dropout_rate > 0, drop_rows [B, Q] and drop_cols [B, N, K]:
  dropout.attention_words of these rows, heads and positions (int32).
  """
  q_len, k_len = q.shape[3], k.shape[3]
  blocks = block_sizes or BlockSizes.for_length(k_len)
  _check(blocks, q_len, k_len)
  words = ()
  if dropout_rate:
    if drop_rows is None or drop_cols is None:
      raise ValueError("flash attention with dropout needs drop_rows and drop_cols "
                       "(dropout.attention_words)")
    words = (drop_rows.astype(jnp.int32), drop_cols.astype(jnp.int32))
  static = _Static(float(dropout_rate), causal, float(sm_scale), blocks, interpret)
  return _flash(q, k, v, q_segment_ids.astype(jnp.int32), kv_segment_ids.astype(jnp.int32),
                words, static)


def _check(blocks: BlockSizes, q_len: int, k_len: int):
  for name, size in dataclasses.asdict(blocks).items():
    length = q_len if name.startswith("block_q") else k_len
    if size % NUM_LANES or length % size:
      raise ValueError(f"flash attention: {name}={size} must be a multiple of {NUM_LANES} "
                       f"that divides the length {length}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q, k, v, q_ids, kv_ids, words, static):
  return _forward(q, k, v, q_ids, kv_ids, words, static)[0]


def _flash_fwd(q, k, v, q_ids, kv_ids, words, static):
  out, lse = _forward(q, k, v, q_ids, kv_ids, words, static)
  return out, (q, k, v, q_ids, kv_ids, words, out, lse)


def _flash_bwd(static, residuals, d_out):
  q, k, v, q_ids, kv_ids, words, out, lse = residuals
  di = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)
  if static.blocks.block_k_dkv == k.shape[3]:
    dq, dk, dv = _backward(q, k, v, q_ids, kv_ids, words, lse, d_out, di, static, with_dq=True)
  else:
    dk, dv = _backward(q, k, v, q_ids, kv_ids, words, lse, d_out, di, static, with_dq=False)
    dq = _backward_dq(q, k, v, q_ids, kv_ids, words, lse, d_out, di, static)
  # dq comes heads-major ([B, N, Q, H]), like the output.
  return dq.swapaxes(2, 3), dk, dv, None, None, jax.tree.map(lambda _: None, words)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _lanes(x_Rx128, width: int):
  """A per-row value held in 128 lanes, widened or narrowed to `width` lanes."""
  if width % NUM_LANES == 0:
    return jnp.tile(x_Rx128, (1, width // NUM_LANES))
  return x_Rx128[:, :width]


def _below_or_on_diagonal(q_block, block_q, k_block, block_k):
  """Whether a block holds any key at or before one of its queries."""
  return (q_block + 1) * block_q - 1 >= k_block * block_k


def _logits(q_HxR, k_HxC, q_ids_Rx128, kv_ids_1xC, q_start, k_start, static):
  """Scaled logits [R, C] of a block with the keys a query may not see at MASK_VALUE."""
  s = lax.dot_general(q_HxR, k_HxC, TRANS_A, preferred_element_type=jnp.float32)
  s = s * static.sm_scale
  visible = _lanes(q_ids_Rx128, s.shape[1]) == kv_ids_1xC
  if static.causal:
    row = lax.broadcasted_iota(jnp.int32, s.shape, 0) + q_start
    col = lax.broadcasted_iota(jnp.int32, s.shape, 1) + k_start
    visible = visible & (col <= row)
  return jnp.where(visible, s, MASK_VALUE)


def _keep(word_refs, width: int, static):
  """The dropout keep-mask [block_q, width] of a block: the products of its
  queries' row words (held in 128 lanes) and its keys' column words."""
  rows_ref, cols_ref = word_refs
  return dropout.product_keep(_lanes(rows_ref[0], width), cols_ref[0, 0, :1],
                              static.dropout_rate)


def _split_refs(refs, static, inputs: int):
  """(the `inputs` input refs, the dropout words' refs or (), the rest)."""
  words = 2 if static.dropout_rate else 0
  return refs[:inputs], refs[inputs:inputs + words], refs[inputs + words:]


def _keep_scale(static) -> float:
  return 1.0 / (1.0 - dropout.attention_drop_rate(static.dropout_rate))


# Forward.

def _forward_kernel(*refs, static):
  (q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref), word_refs, rest = _split_refs(refs, static, 5)
  o_ref, lse_ref, m_scratch, l_scratch, acc_scratch = rest
  head_dim, block_q = q_ref.shape[2:]
  block_k = k_ref.shape[3]
  q_block, k_block = pl.program_id(2), pl.program_id(3)

  @pl.when(k_block == 0)
  def start():
    m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
    l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
    acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)

  run = (_below_or_on_diagonal(q_block, block_q, k_block, block_k) if static.causal
         else True)

  @pl.when(run)
  def accumulate():
    q_start, k_start = q_block * block_q, k_block * block_k
    s = _logits(q_ref[0, 0], k_ref[0, 0], q_ids_ref[0], kv_ids_ref[0, :1], q_start,
                k_start, static)
    m_prev, l_prev = m_scratch[...], l_scratch[...]
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])  # [block_q, 128]
    p = jnp.exp(s - _lanes(m_next, block_k))
    alpha = jnp.exp(m_prev - m_next)
    l_scratch[...] = alpha * l_prev + jnp.sum(p, axis=1)[:, None]
    m_scratch[...] = m_next
    if static.dropout_rate:
      p = jnp.where(_keep(word_refs, block_k, static), p, 0.0)
    v_HxC = v_ref[0, 0]
    acc_scratch[...] = acc_scratch[...] * _lanes(alpha, head_dim) + lax.dot_general(
        p.astype(v_HxC.dtype), v_HxC, TRANS_B, preferred_element_type=jnp.float32)

  @pl.when(k_block == pl.num_programs(3) - 1)
  def finish():
    l = l_scratch[...]
    scale = _keep_scale(static) if static.dropout_rate else 1.0
    o_ref[0, 0] = (acc_scratch[...] * _lanes(scale / l, head_dim)).astype(o_ref.dtype)
    lse_ref[0, 0] = m_scratch[...] + jnp.log(l)


def _segment_specs(block_q, block_k, q_index, k_index, static):
  """Segment ids as the kernels read them: a query's id across 128 lanes, a
  key's down 8 sublanes; with dropout the row words of the queries and the
  column words of the keys after them, held the same way."""
  specs = [pl.BlockSpec((1, block_q, NUM_LANES), lambda *g: (g[0], q_index(*g), 0)),
           pl.BlockSpec((1, NUM_SUBLANES, block_k), lambda *g: (g[0], 0, k_index(*g)))]
  if static.dropout_rate:
    specs += [pl.BlockSpec((1, block_q, NUM_LANES), lambda *g: (g[0], q_index(*g), 0)),
              pl.BlockSpec((1, 1, NUM_SUBLANES, block_k),
                           lambda *g: (g[0], g[1], 0, k_index(*g)))]
  return specs


def _segment_arrays(q_ids, kv_ids, words):
  b, q_len = q_ids.shape
  k_len = kv_ids.shape[1]
  arrays = [lax.broadcast_in_dim(q_ids, (b, q_len, NUM_LANES), (0, 1)),
            lax.broadcast_in_dim(kv_ids, (b, NUM_SUBLANES, k_len), (0, 2))]
  if words:
    rows, cols = words
    arrays += [lax.broadcast_in_dim(rows, (b, q_len, NUM_LANES), (0, 1)),
               lax.broadcast_in_dim(cols, (b, cols.shape[1], NUM_SUBLANES, k_len), (0, 1, 3))]
  return arrays


def _call(name, kernel, grid, in_specs, out_specs, out_shape, scratch, static, *args):
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=0, grid=grid, in_specs=in_specs, out_specs=out_specs,
          scratch_shapes=scratch),
      out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      interpret=static.interpret,
      name=name,
  )(*args)


def _forward(q, k, v, q_ids, kv_ids, words, static):
  batch, heads, head_dim, q_len = q.shape
  k_len = k.shape[3]
  bq, bk = static.blocks.block_q, static.blocks.block_k
  grid = (batch, heads, q_len // bq, k_len // bk)
  q_spec = pl.BlockSpec((1, 1, head_dim, bq), lambda b, n, i, j: (b, n, 0, i))
  kv_spec = pl.BlockSpec((1, 1, head_dim, bk), lambda b, n, i, j: (b, n, 0, j))
  out_spec = pl.BlockSpec((1, 1, bq, head_dim), lambda b, n, i, j: (b, n, i, 0))
  lse_spec = pl.BlockSpec((1, 1, bq, NUM_LANES), lambda b, n, i, j: (b, n, i, 0))
  segment_specs = _segment_specs(bq, bk, lambda b, n, i, j: i, lambda b, n, i, j: j, static)
  kernel = functools.partial(_forward_kernel, static=static)
  out, lse = _call(
      "flash_dropout_forward", kernel, grid, [q_spec, kv_spec, kv_spec, *segment_specs],
      [out_spec, lse_spec],
      [jax.ShapeDtypeStruct((batch, heads, q_len, head_dim), q.dtype),
       jax.ShapeDtypeStruct((batch, heads, q_len, NUM_LANES), jnp.float32)],
      [pltpu.VMEM((bq, NUM_LANES), jnp.float32), pltpu.VMEM((bq, NUM_LANES), jnp.float32),
       pltpu.VMEM((bq, head_dim), jnp.float32)],
      static, q, k, v, *_segment_arrays(q_ids, kv_ids, words))
  return out, lse[..., 0]


# Backward.

def _block_gradients(word_refs, q, k, v, d_out, lse, di, q_ids, kv_ids, q_start, k_start,
                     static):
  """(dropped probabilities, d logits) of a block, both [block_q, block_k] fp32;
  q, k and v are [H, block]."""
  s = _logits(q, k, q_ids, kv_ids, q_start, k_start, static)
  width = s.shape[1]
  p = jnp.exp(s - _lanes(lse, width))
  dp = lax.dot(d_out, v, preferred_element_type=jnp.float32)
  dropped = p
  if static.dropout_rate:
    keep = _keep(word_refs, width, static)
    scale = _keep_scale(static)
    dropped = jnp.where(keep, p * scale, 0.0)
    dp = jnp.where(keep, dp * scale, 0.0)
  ds = p * (dp - _lanes(di, width)) * static.sm_scale
  return dropped, ds


def _dkv_kernel(*refs, static, with_dq):
  (q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref), word_refs, rest = _split_refs(refs, static, 5)
  lse_ref, do_ref, di_ref, *rest = rest
  if with_dq:
    dq_ref, dk_ref, dv_ref, dk_scratch, dv_scratch = rest
  else:
    dk_ref, dv_ref, dk_scratch, dv_scratch = rest
  block_q, block_k = q_ref.shape[3], k_ref.shape[3]
  k_block, q_block = pl.program_id(2), pl.program_id(3)

  @pl.when(q_block == 0)
  def start():
    dk_scratch[...] = jnp.zeros(dk_scratch.shape, jnp.float32)
    dv_scratch[...] = jnp.zeros(dv_scratch.shape, jnp.float32)

  run = (_below_or_on_diagonal(q_block, block_q, k_block, block_k) if static.causal
         else True)

  @pl.when(run)
  def accumulate():
    q, k, d_out = q_ref[0, 0], k_ref[0, 0], do_ref[0, 0]
    dropped, ds = _block_gradients(
        word_refs, q, k, v_ref[0, 0], d_out, lse_ref[0, 0], di_ref[0, 0], q_ids_ref[0],
        kv_ids_ref[0, :1], q_block * block_q, k_block * block_k, static)
    # dk and dv positions-minor, [H, block_k], as k and v.
    dv_scratch[...] += lax.dot_general(d_out, dropped.astype(d_out.dtype), TRANS_A,
                                       preferred_element_type=jnp.float32)
    dk_scratch[...] += lax.dot(q, ds.astype(q.dtype), preferred_element_type=jnp.float32)
    if with_dq:  # The keys are one block: this block's dq is whole.
      dq_ref[0, 0] = lax.dot_general(ds.astype(k.dtype), k, TRANS_B,
                                     preferred_element_type=jnp.float32).astype(dq_ref.dtype)

  @pl.when(q_block == pl.num_programs(3) - 1)
  def finish():
    dk_ref[0, 0] = dk_scratch[...].astype(dk_ref.dtype)
    dv_ref[0, 0] = dv_scratch[...].astype(dv_ref.dtype)


def _lane_rows(x_BxNxQ):
  return jnp.broadcast_to(x_BxNxQ[..., None], (*x_BxNxQ.shape, NUM_LANES))


def _backward(q, k, v, q_ids, kv_ids, words, lse, d_out, di, static, *, with_dq):
  """dk and dv (and, with_dq, dq [B, N, Q, H]) over a grid whose last axis runs
  over the queries."""
  batch, heads, head_dim, q_len = q.shape
  k_len = k.shape[3]
  bq, bk = static.blocks.block_q_dkv, static.blocks.block_k_dkv
  grid = (batch, heads, k_len // bk, q_len // bq)
  q_spec = pl.BlockSpec((1, 1, head_dim, bq), lambda b, n, j, i: (b, n, 0, i))
  kv_spec = pl.BlockSpec((1, 1, head_dim, bk), lambda b, n, j, i: (b, n, 0, j))
  rows_spec = pl.BlockSpec((1, 1, bq, head_dim), lambda b, n, j, i: (b, n, i, 0))
  lanes_spec = pl.BlockSpec((1, 1, bq, NUM_LANES), lambda b, n, j, i: (b, n, i, 0))
  segment_specs = _segment_specs(bq, bk, lambda b, n, j, i: i, lambda b, n, j, i: j, static)
  out_specs = [kv_spec, kv_spec]
  out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
  if with_dq:
    out_specs.insert(0, rows_spec)
    out_shape.insert(0, jax.ShapeDtypeStruct((batch, heads, q_len, head_dim), q.dtype))
  kernel = functools.partial(_dkv_kernel, static=static, with_dq=with_dq)
  return _call(
      "flash_dropout_dkv", kernel, grid,
      [q_spec, kv_spec, kv_spec, *segment_specs, lanes_spec, rows_spec, lanes_spec],
      out_specs, out_shape,
      [pltpu.VMEM((head_dim, bk), jnp.float32), pltpu.VMEM((head_dim, bk), jnp.float32)],
      static, q, k, v, *_segment_arrays(q_ids, kv_ids, words), _lane_rows(lse), d_out,
      _lane_rows(di))


def _dq_kernel(*refs, static):
  (q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref), word_refs, rest = _split_refs(refs, static, 5)
  lse_ref, do_ref, di_ref, dq_ref, dq_scratch = rest
  block_q, block_k = q_ref.shape[3], k_ref.shape[3]
  q_block, k_block = pl.program_id(2), pl.program_id(3)

  @pl.when(k_block == 0)
  def start():
    dq_scratch[...] = jnp.zeros(dq_scratch.shape, jnp.float32)

  run = (_below_or_on_diagonal(q_block, block_q, k_block, block_k) if static.causal
         else True)

  @pl.when(run)
  def accumulate():
    k = k_ref[0, 0]
    _, ds = _block_gradients(
        word_refs, q_ref[0, 0], k, v_ref[0, 0], do_ref[0, 0], lse_ref[0, 0], di_ref[0, 0],
        q_ids_ref[0], kv_ids_ref[0, :1], q_block * block_q, k_block * block_k, static)
    dq_scratch[...] += lax.dot_general(ds.astype(k.dtype), k, TRANS_B,
                                       preferred_element_type=jnp.float32)

  @pl.when(k_block == pl.num_programs(3) - 1)
  def finish():
    dq_ref[0, 0] = dq_scratch[...].astype(dq_ref.dtype)


def _backward_dq(q, k, v, q_ids, kv_ids, words, lse, d_out, di, static):
  """dq [B, N, Q, H] over a grid whose last axis runs over the keys (several key blocks)."""
  batch, heads, head_dim, q_len = q.shape
  k_len = k.shape[3]
  bq, bk = static.blocks.block_q_dq, static.blocks.block_k_dq
  grid = (batch, heads, q_len // bq, k_len // bk)
  q_spec = pl.BlockSpec((1, 1, head_dim, bq), lambda b, n, i, j: (b, n, 0, i))
  kv_spec = pl.BlockSpec((1, 1, head_dim, bk), lambda b, n, i, j: (b, n, 0, j))
  rows_spec = pl.BlockSpec((1, 1, bq, head_dim), lambda b, n, i, j: (b, n, i, 0))
  lanes_spec = pl.BlockSpec((1, 1, bq, NUM_LANES), lambda b, n, i, j: (b, n, i, 0))
  segment_specs = _segment_specs(bq, bk, lambda b, n, i, j: i, lambda b, n, i, j: j, static)
  kernel = functools.partial(_dq_kernel, static=static)
  return _call(
      "flash_dropout_dq", kernel, grid,
      [q_spec, kv_spec, kv_spec, *segment_specs, lanes_spec, rows_spec, lanes_spec], rows_spec,
      jax.ShapeDtypeStruct((batch, heads, q_len, head_dim), q.dtype),
      [pltpu.VMEM((bq, head_dim), jnp.float32)],
      static, q, k, v, *_segment_arrays(q_ids, kv_ids, words), _lane_rows(lse), d_out,
      _lane_rows(di))
