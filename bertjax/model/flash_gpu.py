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
# Modified for bertjax from jax/experimental/pallas/ops/gpu/attention.py
# (jax 0.10.2): dropout on the attention probabilities, formed in the kernels
# from bertjax.model.dropout's row and column words; the backward split into
# a dk/dv kernel and a dq kernel with block sizes of their own; the
# backward's row sums (o . do) computed by XLA.

"""Flash attention with dropout on the probabilities, for GPU (Pallas, Triton).

`flash_attention(q, k, v, segment_ids, drop_rows, drop_cols, ...)` over
[B, L, N, H] arrays, self-attention (one length, one set of segment ids). A
query sees the keys of its own segment id (and with `causal` none after
it). With `dropout_rate` > 0 each probability is dropped where
dropout.attention_keep_mask drops it: a kernel reads the row words of its
block's queries and the column words of its block's keys
(dropout.attention_words, computed once by XLA) as vectors and keeps
element (q, k) when the product of the two words passes
dropout.product_keep, a multiplication and a comparison per probability.
The backward kernels form the mask again rather than storing it. The kept
probabilities are scaled by 1 / (1 - p), p = dropout.attention_drop_rate.
The plain-JAX reference is bertjax.model.attention.xla_attention;
`interpret=True` runs the kernels in Pallas interpret mode on any backend.

Three kernels, each a grid over (block, batch row, head):
- forward: a block of queries against all keys in a loop, one fp32
  accumulator, keeping each query's log-sum-exp for the backward;
- dk/dv: a block of keys against all queries in a loop;
- dq: a block of queries against all keys in a loop.
Softmax in base 2 as the original: logits scaled by log2(e), exp2, and a
base-2 log-sum-exp.
"""

import dataclasses
import functools
import math

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

from bertjax.model import dropout

# The custom-call target of a Triton kernel in a lowered program: jaxlib up to
# 0.10.2 names it the first way, later releases the second.
TRITON_CALL_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Rows per program and per loop step of each kernel (powers of two that
  divide the length), and Triton's warps and pipeline stages.

  Chosen for H = 64 on Hopper the way jax's reference kernel chooses, with
  every product at least 64 rows (a warpgroup's wgmma): 128 queries a
  program and 64 keys a step in the forward and dq kernels, 64 keys a
  program and 64 queries a step in dk/dv (whose two fp32 accumulators
  spill at 128 keys and 4 warps). Compiled for sm_90 by Triton on a CPU,
  each kernel then takes at most 254 registers and spills none
  (docs/attention.md). Not yet timed on a GPU.
  """
  block_q: int = 128  # Forward: queries per program.
  block_k: int = 64  # Forward: keys per step.
  block_q_dkv: int = 64  # dk/dv: queries per step.
  block_k_dkv: int = 64  # dk/dv: keys per program.
  block_q_dq: int = 128  # dq: queries per program.
  block_k_dq: int = 64  # dq: keys per step.
  num_warps: int = 4
  num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class _Static:
  dropout_rate: float
  causal: bool
  sm_scale: float
  blocks: BlockSizes
  interpret: bool


def flash_attention(q, k, v, segment_ids, drop_rows=None, drop_cols=None, *,
                    dropout_rate: float = 0.0, causal: bool = False, sm_scale: float = 1.0,
                    block_sizes: BlockSizes | None = None, interpret: bool = False):
  """softmax(q k^T * sm_scale, masked) dropped out, times v: [B, L, N, H].

  segment_ids [B, L] (int32); with dropout_rate > 0, drop_rows [B, L] and
  drop_cols [B, N, L]: dropout.attention_words of these batch rows, heads
  and positions (int32).
  """
  if k.shape != q.shape or v.shape != q.shape:
    raise ValueError(f"flash attention (GPU): q, k and v must have one shape, got "
                     f"{q.shape}, {k.shape}, {v.shape}")
  static, words = _settings(q.shape[1], drop_rows, drop_cols, dropout_rate, causal, sm_scale,
                            block_sizes, interpret)
  return _flash(q, k, v, segment_ids.astype(jnp.int32), words, static)


KERNELS = ("forward", "dkv", "dq")


def kernel(name: str, q, k, v, segment_ids, d_out, lse, di, drop_rows=None, drop_cols=None, *,
           dropout_rate: float = 0.0, causal: bool = False, sm_scale: float = 1.0,
           block_sizes: BlockSizes | None = None, interpret: bool = False):
  """One of the three kernels alone (KERNELS), for checks that compile or time
  them apart: the forward's [output, log-sum-exp], dk/dv's [dk, dv] or [dq].
  lse and di [B, N, L] fp32 are the forward's base-2 log-sum-exp and the
  row sums o . do (the forward ignores them and d_out)."""
  if name not in KERNELS:
    raise ValueError(f"flash_gpu.kernel: {name!r} is none of {KERNELS}")
  static, words = _settings(q.shape[1], drop_rows, drop_cols, dropout_rate, causal, sm_scale,
                            block_sizes, interpret)
  if name == "forward":
    return _forward(q, k, v, segment_ids, words, static)
  return _backward(name, q, k, v, segment_ids, d_out, lse, di, words, static)


def _settings(length, drop_rows, drop_cols, dropout_rate, causal, sm_scale, block_sizes,
              interpret):
  """(the kernels' static settings, the dropout words or ()), checked."""
  blocks = block_sizes or BlockSizes()
  for field in dataclasses.fields(blocks):
    size = getattr(blocks, field.name)
    if field.name.startswith("block") and (size & (size - 1) or length % size):
      raise ValueError(f"flash attention (GPU): BlockSizes.{field.name}={size} must be a "
                       f"power of two that divides the length {length}")
  words = ()
  if dropout_rate:
    if drop_rows is None or drop_cols is None:
      raise ValueError("flash attention with dropout needs drop_rows and drop_cols "
                       "(dropout.attention_words)")
    words = (drop_rows.astype(jnp.int32), drop_cols.astype(jnp.int32))
  return _Static(float(dropout_rate), causal, float(sm_scale), blocks, interpret), words


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, segment_ids, words, static):
  return _forward(q, k, v, segment_ids, words, static)[0]


def _flash_fwd(q, k, v, segment_ids, words, static):
  out, lse = _forward(q, k, v, segment_ids, words, static)
  return out, (q, k, v, segment_ids, words, out, lse)


def _flash_bwd(static, residuals, d_out):
  q, k, v, segment_ids, words, out, lse = residuals
  di = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)
  args = (q, k, v, segment_ids, d_out, lse, di.transpose(0, 2, 1), words, static)
  dk, dv = _backward("dkv", *args)
  (dq,) = _backward("dq", *args)
  return dq, dk, dv, None, jax.tree.map(lambda _: None, words)


_flash.defvjp(_flash_fwd, _flash_bwd)


# What the three kernels share: a block's logits, its dropout mask, and the
# gradients of its logits.

def _logits(q, k, q_ids, kv_ids, q_start, k_start, static):
  """Logits [queries, keys] of a block in base 2, the keys a query may not
  see at MASK_VALUE."""
  s = plgpu.dot(q, k.T) * (static.sm_scale * math.log2(math.e))
  visible = q_ids[:, None] == kv_ids[None, :]
  if static.causal:
    rows = q_start + jnp.arange(q.shape[0])
    cols = k_start + jnp.arange(k.shape[0])
    visible = visible & (cols[None, :] <= rows[:, None])
  return jnp.where(visible, s, MASK_VALUE)


def _keep(rows, cols, static):
  """The keep-mask [queries, keys] of a block from its queries' row words and
  its keys' column words."""
  return dropout.product_keep(rows[:, None], cols[None, :], static.dropout_rate)


def _keep_scale(static) -> float:
  return 1.0 / (1.0 - dropout.attention_drop_rate(static.dropout_rate))


def _block_gradients(q, k, v, d_out, lse, di, q_ids, kv_ids, keep, q_start, k_start, static):
  """(probabilities, d logits) of a block, both [queries, keys] fp32; the
  probabilities before dropout."""
  s = _logits(q, k, q_ids, kv_ids, q_start, k_start, static)
  p = jnp.exp2(s - lse[:, None])
  dp = plgpu.dot(d_out, v.T)
  if keep is not None:
    dp = jnp.where(keep, dp * _keep_scale(static), 0.0)
  return p, p * (dp - di[:, None]) * static.sm_scale


def _split_refs(refs, static, inputs: int, outputs: int):
  """(the `inputs` input refs, the row and column words' refs or (), the outputs)."""
  words = 2 if static.dropout_rate else 0
  return refs[:inputs], refs[inputs:inputs + words], refs[inputs + words:inputs + words + outputs]


def _head_mask(ref, head_dim: int):
  return (jnp.arange(ref.shape[-1]) < head_dim)[None, :]


# Forward.

def _forward_kernel(*refs, static, head_dim: int):
  (q_ref, k_ref, v_ref, seg_ref), word_refs, (o_ref, lse_ref) = _split_refs(refs, static, 4, 2)
  block_q, block_k = static.blocks.block_q, static.blocks.block_k
  length = k_ref.shape[0]
  i = pl.program_id(0)
  head_mask = _head_mask(q_ref, head_dim)
  queries = pl.ds(i * block_q, block_q)
  q = plgpu.load(q_ref, mask=head_mask, other=0.0)
  q_ids = seg_ref[queries]
  rows = word_refs[0][queries] if word_refs else None

  def body(j, carry):
    o, m, l = carry
    keys = pl.ds(j * block_k, block_k)
    k = plgpu.load(k_ref.at[keys, :], mask=head_mask, other=0.0)
    s = _logits(q, k, q_ids, seg_ref[keys], i * block_q, j * block_k, static)
    m_next = jnp.maximum(m, jnp.max(s, axis=-1))
    correction = jnp.exp2(m - m_next)
    p = jnp.exp2(s - m_next[:, None])
    l = correction * l + jnp.sum(p, axis=-1)
    if word_refs:
      p = jnp.where(_keep(rows, word_refs[1][keys], static), p, 0.0)
    v = plgpu.load(v_ref.at[keys, :], mask=head_mask, other=0.0)
    o = correction[:, None] * o + plgpu.dot(p.astype(v.dtype), v)
    return o, m_next, l

  start = (jnp.zeros((block_q, q_ref.shape[-1]), jnp.float32),
           jnp.full((block_q,), -jnp.inf, jnp.float32), jnp.zeros((block_q,), jnp.float32))
  upper = (lax.div(block_q * (i + 1) + block_k - 1, block_k) if static.causal
           else length // block_k)
  o, m, l = lax.fori_loop(0, upper, body, start)
  scale = _keep_scale(static) if word_refs else 1.0
  o = o * (scale / l)[:, None]
  lse_ref[...] = m + jnp.log2(l)
  plgpu.store(o_ref.at[:, : o.shape[-1]], o.astype(o_ref.dtype), mask=head_mask)


def _specs(length: int, padded: int):
  """BlockSpecs over a grid (block, b, n): (a block of rows of [B, L, N, H],
  all its rows, a whole row of [B, L] and a whole row of [B, N, L])."""
  block = lambda rows: pl.BlockSpec((None, rows, None, padded), lambda i, b, n: (b, i, n, 0))
  whole = pl.BlockSpec((None, length, None, padded), lambda i, b, n: (b, 0, n, 0))
  row = pl.BlockSpec((None, length), lambda i, b, n: (b, 0))
  head_row = pl.BlockSpec((None, None, length), lambda i, b, n: (b, n, 0))
  return block, whole, row, head_row


def _word_specs(words, row, head_row):
  return [row, head_row] if words else []


def _call(name, kernel, grid, in_specs, out_specs, out_shape, static, *args):
  return pl.pallas_call(
      kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      compiler_params=plgpu.CompilerParams(num_warps=static.blocks.num_warps,
                                           num_stages=static.blocks.num_stages),
      interpret=static.interpret, name=name)(*args)


def _forward(q, k, v, segment_ids, words, static):
  batch, length, heads, head_dim = q.shape
  block, whole, row, head_row = _specs(length, pl.next_power_of_2(head_dim))
  block_q = static.blocks.block_q
  return _call(
      "flash_dropout_forward",
      functools.partial(_forward_kernel, static=static, head_dim=head_dim),
      (length // block_q, batch, heads),
      [block(block_q), whole, whole, row, *_word_specs(words, row, head_row)],
      [block(block_q), pl.BlockSpec((None, None, block_q), lambda i, b, n: (b, n, i))],
      [jax.ShapeDtypeStruct(q.shape, q.dtype),
       jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
      static, q, k, v, segment_ids, *words)


# Backward: dk and dv in one kernel, dq in another.

def _dkv_kernel(*refs, static, head_dim: int):
  (q_ref, k_ref, v_ref, seg_ref, do_ref, lse_ref, di_ref), word_refs, (dk_ref, dv_ref) = (
      _split_refs(refs, static, 7, 2))
  block_q, block_k = static.blocks.block_q_dkv, static.blocks.block_k_dkv
  length = q_ref.shape[0]
  j = pl.program_id(0)
  head_mask = _head_mask(q_ref, head_dim)
  keys = pl.ds(j * block_k, block_k)
  k = plgpu.load(k_ref, mask=head_mask, other=0.0)
  v = plgpu.load(v_ref, mask=head_mask, other=0.0)
  kv_ids = seg_ref[keys]
  cols = word_refs[1][keys] if word_refs else None

  def body(t, carry):
    dk, dv = carry
    queries = pl.ds(t * block_q, block_q)
    q = plgpu.load(q_ref.at[queries, :], mask=head_mask, other=0.0)
    d_out = plgpu.load(do_ref.at[queries, :], mask=head_mask, other=0.0)
    keep = _keep(word_refs[0][queries], cols, static) if word_refs else None
    p, ds = _block_gradients(q, k, v, d_out, lse_ref[queries], di_ref[queries],
                             seg_ref[queries], kv_ids, keep, t * block_q, j * block_k, static)
    if keep is not None:
      p = jnp.where(keep, p, 0.0)  # Scaled once, at the end.
    dv = dv + plgpu.dot(p.astype(d_out.dtype).T, d_out)
    dk = dk + plgpu.dot(ds.astype(q.dtype).T, q)
    return dk, dv

  zeros = jnp.zeros((block_k, q_ref.shape[-1]), jnp.float32)
  lower = lax.div(j * block_k, block_q) if static.causal else 0
  dk, dv = lax.fori_loop(lower, length // block_q, body, (zeros, zeros))
  if word_refs:
    dv = dv * _keep_scale(static)
  plgpu.store(dk_ref.at[:, : dk.shape[-1]], dk.astype(dk_ref.dtype), mask=head_mask)
  plgpu.store(dv_ref.at[:, : dv.shape[-1]], dv.astype(dv_ref.dtype), mask=head_mask)


def _dq_kernel(*refs, static, head_dim: int):
  (q_ref, k_ref, v_ref, seg_ref, do_ref, lse_ref, di_ref), word_refs, (dq_ref,) = (
      _split_refs(refs, static, 7, 1))
  block_q, block_k = static.blocks.block_q_dq, static.blocks.block_k_dq
  length = k_ref.shape[0]
  i = pl.program_id(0)
  head_mask = _head_mask(q_ref, head_dim)
  queries = pl.ds(i * block_q, block_q)
  q = plgpu.load(q_ref, mask=head_mask, other=0.0)
  d_out = plgpu.load(do_ref, mask=head_mask, other=0.0)
  lse, di, q_ids = lse_ref[queries], di_ref[queries], seg_ref[queries]
  rows = word_refs[0][queries] if word_refs else None

  def body(j, dq):
    keys = pl.ds(j * block_k, block_k)
    k = plgpu.load(k_ref.at[keys, :], mask=head_mask, other=0.0)
    v = plgpu.load(v_ref.at[keys, :], mask=head_mask, other=0.0)
    keep = _keep(rows, word_refs[1][keys], static) if word_refs else None
    _, ds = _block_gradients(q, k, v, d_out, lse, di, q_ids, seg_ref[keys], keep,
                             i * block_q, j * block_k, static)
    return dq + plgpu.dot(ds.astype(k.dtype), k)

  upper = (lax.div(block_q * (i + 1) + block_k - 1, block_k) if static.causal
           else length // block_k)
  dq = lax.fori_loop(0, upper, body, jnp.zeros((block_q, q_ref.shape[-1]), jnp.float32))
  plgpu.store(dq_ref.at[:, : dq.shape[-1]], dq.astype(dq_ref.dtype), mask=head_mask)


def _backward(which: str, q, k, v, segment_ids, d_out, lse, di, words, static):
  """[dk, dv] ("dkv") or [dq] ("dq")."""
  batch, length, heads, head_dim = q.shape
  block, whole, row, head_row = _specs(length, pl.next_power_of_2(head_dim))
  if which == "dkv":  # A block of keys a program, all queries.
    rows, kernel_fn, outputs = static.blocks.block_k_dkv, _dkv_kernel, (k, v)
    q_spec, kv_spec = whole, block(rows)
  else:  # A block of queries a program, all keys.
    rows, kernel_fn, outputs = static.blocks.block_q_dq, _dq_kernel, (q,)
    q_spec, kv_spec = block(rows), whole
  return _call(
      f"flash_dropout_{which}",
      functools.partial(kernel_fn, static=static, head_dim=head_dim),
      (length // rows, batch, heads),
      [q_spec, kv_spec, kv_spec, row, q_spec, head_row, head_row,
       *_word_specs(words, row, head_row)],
      [block(rows)] * len(outputs), [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in outputs],
      static, q, k, v, segment_ids, d_out, lse, di, *words)
