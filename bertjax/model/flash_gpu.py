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
# (jax 0.10.2): dropout on the attention probabilities, drawn in the kernels
# from bertjax.model.dropout's attention hash; each program takes a 128-row
# tile of queries as four parts of 32 rows that share the hashes; the
# backward's row sums (o . do) computed by XLA.

"""Flash attention with dropout on the probabilities, for GPU (Pallas, Triton).

`flash_attention(q, k, v, segment_ids, seed, ...)` over [B, L, N, H]
arrays, self-attention (one length, one set of segment ids). A query sees
the keys of its own segment id (and with `causal` none after it). With
`dropout_rate` > 0 each probability is dropped where
dropout.attention_keep_mask would drop it for the array [B, N, L, L] at the
global batch row seed[2] + b and head seed[3] + n: a program hashes the
counters of one 32-row part of its 128-row query tile
(dropout.attention_tile_words) and reads the draws of all four parts from
the two words (dropout.attention_part_bits), so the parts run as four
32-row sub-blocks. The backward pass draws the mask again rather than
storing it. The plain-JAX reference is bertjax.model.attention.xla_attention;
`interpret=True` runs the kernels in Pallas interpret mode on any backend.

Softmax in base 2 as the original: logits scaled by log2(e), exp2, and a
base-2 log-sum-exp kept for the backward pass.
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

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
TILE, PART = dropout.ATTENTION_TILE, dropout.ATTENTION_PART
PARTS = TILE // PART


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Keys per step of the forward pass and of dq; queries always come in
  128-row tiles (dk and dv take 128 keys a program, so that the backward's
  grid covers dq's tiles too). Untuned: no GPU has timed them."""
  block_k: int = 64
  block_k_dq: int = 64
  num_warps: int = 4
  num_warps_backward: int = 8
  num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class _Static:
  dropout_rate: float
  causal: bool
  sm_scale: float
  blocks: BlockSizes
  interpret: bool


def flash_attention(q, k, v, segment_ids, seed, *, dropout_rate: float = 0.0,
                    causal: bool = False, sm_scale: float = 1.0,
                    block_sizes: BlockSizes | None = None, interpret: bool = False):
  """softmax(q k^T * sm_scale, masked) dropped out, times v: [B, L, N, H].

  segment_ids [B, L] (int32); seed int32 [4]: the dropout key's two words
  (dropout.attention_key_words), the global index of batch row 0 and of
  head 0 (shards of a larger array). L must be a multiple of 128.
  """
  blocks = block_sizes or BlockSizes()
  length, heads = q.shape[1], q.shape[2]
  if k.shape != q.shape or v.shape != q.shape:
    raise ValueError(f"flash attention (GPU): q, k and v must have one shape, got "
                     f"{q.shape}, {k.shape}, {v.shape}")
  for name, size in (("the query tile", TILE), ("block_k", blocks.block_k),
                     ("block_k_dq", blocks.block_k_dq)):
    if length % size:
      raise ValueError(f"flash attention (GPU): the length {length} is not a multiple of "
                       f"{name} ({size})")
  problem = dropout.attention_counter_limit_problem(heads, length, length)
  if dropout_rate and problem:
    raise ValueError(problem)
  static = _Static(float(dropout_rate), causal, float(sm_scale), blocks, interpret)
  return _flash(q, k, v, segment_ids.astype(jnp.int32), seed.astype(jnp.int32), static)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, segment_ids, seed, static):
  return _forward(q, k, v, segment_ids, seed, static)[0]


def _flash_fwd(q, k, v, segment_ids, seed, static):
  out, lse = _forward(q, k, v, segment_ids, seed, static)
  return out, (q, k, v, segment_ids, seed, out, lse)


def _flash_bwd(static, residuals, d_out):
  q, k, v, segment_ids, seed, out, lse = residuals
  di = jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)
  dq, dk, dv = _backward(q, k, v, segment_ids, seed, d_out, lse, di.transpose(0, 2, 1), static)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _logits(q, k, q_ids, kv_ids, first_query, first_key, static):
  """Logits of a block in base 2, the keys a query may not see at MASK_VALUE."""
  s = plgpu.dot(q, k.T) * (static.sm_scale * math.log2(math.e))
  visible = q_ids[:, None] == kv_ids[None, :]
  if static.causal:
    rows = first_query + jnp.arange(q.shape[0])
    cols = first_key + jnp.arange(k.shape[0])
    visible = visible & (cols[None, :] <= rows[:, None])
  return jnp.where(visible, s, MASK_VALUE)


def _global_row_and_head(seed_ref):
  """This program's global batch row and head (grid axes 1 and 2, offset by
  the seed's); read at the kernel's top level, where interpret mode
  substitutes the program ids."""
  return seed_ref[2] + pl.program_id(1), seed_ref[3] + pl.program_id(2)


def _words(seed_ref, where, tile, first_key, keys: int, length: int, static):
  """The hash words of a query tile against `keys` keys of the (batch row,
  head) `where` (None without dropout)."""
  if not static.dropout_rate:
    return None
  return dropout.attention_tile_words(seed_ref[0], seed_ref[1], *where, tile, first_key,
                                      keys=keys, q_tiles=length // TILE, key_stride=length)


def _keep(words, part: int, static):
  return dropout.attention_part_bits(*words, part) >= dropout.attention_threshold(
      static.dropout_rate)


def _keep_scale(static) -> float:
  return 1.0 / (1.0 - dropout.attention_drop_rate(static.dropout_rate))


def _forward_kernel(q_ref, k_ref, v_ref, seg_ref, seed_ref, o_ref, lse_ref, *, static,
                    head_dim: int):
  tile = pl.program_id(0)
  where = _global_row_and_head(seed_ref)
  length = k_ref.shape[0]
  block_k = static.blocks.block_k
  head_mask = (jnp.arange(q_ref.shape[-1]) < head_dim)[None, :]
  rows = [pl.ds(p * PART, PART) for p in range(PARTS)]
  qs = [plgpu.load(q_ref.at[r, :], mask=head_mask, other=0.0) for r in rows]
  q_ids = [seg_ref[pl.ds(tile * TILE + p * PART, PART)] for p in range(PARTS)]

  def body(j, carry):
    keys = pl.ds(j * block_k, block_k)
    k = plgpu.load(k_ref.at[keys, :], mask=head_mask, other=0.0)
    v = plgpu.load(v_ref.at[keys, :], mask=head_mask, other=0.0)
    kv_ids = seg_ref[keys]
    words = _words(seed_ref, where, tile, j * block_k, block_k, length, static)
    out = []
    for p, (o, m, l) in enumerate(carry):
      s = _logits(qs[p], k, q_ids[p], kv_ids, tile * TILE + p * PART, j * block_k, static)
      m_next = jnp.maximum(m, jnp.max(s, axis=-1))
      correction = jnp.exp2(m - m_next)
      probs = jnp.exp2(s - m_next[:, None])
      l = correction * l + jnp.sum(probs, axis=-1)
      if words is not None:
        probs = jnp.where(_keep(words, p, static), probs, 0.0)
      o = correction[:, None] * o + plgpu.dot(probs.astype(v.dtype), v)
      out.append((o, m_next, l))
    return tuple(out)

  start = (jnp.zeros((PART, q_ref.shape[-1]), jnp.float32),
           jnp.full((PART,), -jnp.inf, jnp.float32), jnp.zeros((PART,), jnp.float32))
  upper = (lax.div(TILE * (tile + 1) + block_k - 1, block_k) if static.causal
           else length // block_k)
  carry = lax.fori_loop(0, upper, body, (start,) * PARTS)
  scale = _keep_scale(static) if static.dropout_rate else 1.0
  for r, (o, m, l) in zip(rows, carry):
    o = o * (scale / l)[:, None]
    plgpu.store(o_ref.at[r, : o.shape[-1]], o.astype(o_ref.dtype), mask=head_mask)
    lse_ref[r] = m + jnp.log2(l)


def _forward(q, k, v, segment_ids, seed, static):
  batch, length, heads, head_dim = q.shape
  padded = pl.next_power_of_2(head_dim)
  tile_spec = pl.BlockSpec((None, TILE, None, padded), lambda i, b, n: (b, i, n, 0))
  whole = pl.BlockSpec((None, length, None, padded), lambda i, b, n: (b, 0, n, 0))
  out, lse = pl.pallas_call(
      functools.partial(_forward_kernel, static=static, head_dim=head_dim),
      grid=(length // TILE, batch, heads),
      in_specs=[tile_spec, whole, whole, pl.BlockSpec((None, length), lambda i, b, n: (b, 0)),
                pl.BlockSpec((4,), lambda *_: (0,))],
      out_specs=[tile_spec, pl.BlockSpec((None, None, TILE), lambda i, b, n: (b, n, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
      compiler_params=plgpu.CompilerParams(num_warps=static.blocks.num_warps,
                                           num_stages=static.blocks.num_stages),
      interpret=static.interpret,
      name="flash_dropout_forward",
  )(q, k, v, segment_ids, seed)
  return out, lse


def _backward_kernel(q_ref, k_ref, v_ref, seg_ref, seed_ref, do_ref, lse_ref, di_ref,
                     dq_ref, dk_ref, dv_ref, *, static, head_dim: int):
  """dk and dv of key block j (128 keys) over the query tiles, then dq of
  query tile j over the key blocks."""
  j = pl.program_id(0)
  where = _global_row_and_head(seed_ref)
  length = k_ref.shape[0]
  padded = q_ref.shape[-1]
  head_mask = (jnp.arange(padded) < head_dim)[None, :]
  load = lambda ref, r: plgpu.load(ref.at[r, :], mask=head_mask, other=0.0)
  scale = _keep_scale(static) if static.dropout_rate else 1.0

  def grads(q, k, v, d_out, lse, di, q_ids, kv_ids, first_query, first_key, words, part):
    s = _logits(q, k, q_ids, kv_ids, first_query, first_key, static)
    probs = jnp.exp2(s - lse[:, None])
    dp = plgpu.dot(d_out, v.T)
    dropped = probs
    if words is not None:
      keep = _keep(words, part, static)
      dropped = jnp.where(keep, probs * scale, 0.0)
      dp = jnp.where(keep, dp * scale, 0.0)
    return dropped, probs * (dp - di[:, None]) * static.sm_scale

  keys = pl.ds(j * TILE, TILE)
  k, v, kv_ids = load(k_ref, keys), load(v_ref, keys), seg_ref[keys]

  def dkv_body(t, carry):
    dk, dv = carry
    words = _words(seed_ref, where, t, j * TILE, TILE, length, static)
    for p in range(PARTS):
      r = pl.ds(t * TILE + p * PART, PART)
      q, d_out = load(q_ref, r), load(do_ref, r)
      dropped, ds = grads(q, k, v, d_out, lse_ref[r], di_ref[r], seg_ref[r], kv_ids,
                          t * TILE + p * PART, j * TILE, words, p)
      dv = dv + plgpu.dot(dropped.astype(d_out.dtype).T, d_out)
      dk = dk + plgpu.dot(ds.astype(q.dtype).T, q)
    return dk, dv

  zeros = jnp.zeros((TILE, padded), jnp.float32)
  dk, dv = lax.fori_loop(j if static.causal else 0, length // TILE, dkv_body, (zeros, zeros))
  plgpu.store(dk_ref.at[:, :padded], dk.astype(dk_ref.dtype), mask=head_mask)
  plgpu.store(dv_ref.at[:, :padded], dv.astype(dv_ref.dtype), mask=head_mask)

  block_k = static.blocks.block_k_dq
  rows = [pl.ds(j * TILE + p * PART, PART) for p in range(PARTS)]
  qs, dos = [load(q_ref, r) for r in rows], [load(do_ref, r) for r in rows]
  lses, dis, q_ids = [lse_ref[r] for r in rows], [di_ref[r] for r in rows], [
      seg_ref[r] for r in rows]

  def dq_body(i, dqs):
    keys = pl.ds(i * block_k, block_k)
    k, v, kv_ids = load(k_ref, keys), load(v_ref, keys), seg_ref[keys]
    words = _words(seed_ref, where, j, i * block_k, block_k, length, static)
    out = []
    for p, dq in enumerate(dqs):
      _, ds = grads(qs[p], k, v, dos[p], lses[p], dis[p], q_ids[p], kv_ids,
                    j * TILE + p * PART, i * block_k, words, p)
      out.append(dq + plgpu.dot(ds.astype(k.dtype), k))
    return tuple(out)

  upper = (lax.div(TILE * (j + 1) + block_k - 1, block_k) if static.causal
           else length // block_k)
  dqs = lax.fori_loop(0, upper, dq_body, (jnp.zeros((PART, padded), jnp.float32),) * PARTS)
  for p, dq in enumerate(dqs):
    plgpu.store(dq_ref.at[pl.ds(p * PART, PART), :padded], dq.astype(dq_ref.dtype),
                mask=head_mask)


def _backward(q, k, v, segment_ids, seed, d_out, lse, di, static):
  batch, length, heads, head_dim = q.shape
  padded = pl.next_power_of_2(head_dim)
  whole = pl.BlockSpec((None, length, None, padded), lambda j, b, n: (b, 0, n, 0))
  rows = pl.BlockSpec((None, None, length), lambda j, b, n: (b, n, 0))
  tile_spec = pl.BlockSpec((None, TILE, None, padded), lambda j, b, n: (b, j, n, 0))
  return pl.pallas_call(
      functools.partial(_backward_kernel, static=static, head_dim=head_dim),
      grid=(length // TILE, batch, heads),
      in_specs=[whole, whole, whole, pl.BlockSpec((None, length), lambda j, b, n: (b, 0)),
                pl.BlockSpec((4,), lambda *_: (0,)), whole, rows, rows],
      out_specs=[tile_spec, tile_spec, tile_spec],
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
      compiler_params=plgpu.CompilerParams(num_warps=static.blocks.num_warps_backward,
                                           num_stages=static.blocks.num_stages),
      interpret=static.interpret,
      name="flash_dropout_backward",
  )(q, k, v, segment_ids, seed, d_out, lse, di)
