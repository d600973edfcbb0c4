"""Dropout whose keep-masks are cheap to draw and cheap to differentiate.

keep_mask draws the boolean mask, apply_keep_mask applies it with a
gradient that keeps only the mask, and Dropout is the module that draws from
the 'dropout' stream. The encoder's layers and the heads use them.

Attention probabilities take their own scheme, attention_keep_mask, whose
hashes a fused attention kernel regenerates tile by tile
(attention_tile_bits) in its forward and backward passes: XLA attention and
the kernels drop the same probabilities for the same key.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp


class Dropout(nn.Module):
  """Inverted dropout whose keep-masks are one fused pass of threefry hashes.

  flax's nn.Dropout draws a uniform float per element through
  jax.random.bits, which on CPU runs the threefry2x32 hash as a loop of
  five passes over the whole array and then converts the bits to floats.
  Here the mask comes from the threefry2x32 hashes of (batch, flat index)
  counters over half the last axis: the first half of the last axis takes
  each hash's first 32-bit word, the second half its second word, and an
  element is kept when its word is at least round(rate * 2^32), a keep
  probability exact to 2^-32. The hash is written out as elementwise
  operations (threefry2x32, the same bits as jax's primitive) and each
  element picks its word by position, so XLA computes counters, hash and
  threshold in one fused pass, without materialising the words. The counters are global indices, so the mask
  does not depend on how the array is sharded. Keys of other PRNG
  implementations, odd last axes and arrays whose rows exceed 2^32
  counters fall back to jax.random.bernoulli.
  """
  rate: float  # In [0, 1), as the config checks.

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    return apply_keep_mask(x, self.mask(x.shape), self.rate)

  def mask(self, shape: tuple[int, ...]):
    """The keep-mask for an array of this shape (draws from the 'dropout' stream)."""
    return keep_mask(self.make_rng("dropout"), shape, self.rate)

  def attention_mask(self, shape: tuple[int, ...]):
    """attention_keep_mask for probabilities [B, N, Q, K] (draws from the 'dropout' stream)."""
    return attention_keep_mask(self.make_rng("dropout"), shape, self.rate)

  def key(self):
    """A key from the 'dropout' stream, for a kernel that draws the mask itself."""
    return self.make_rng("dropout")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def apply_keep_mask(x, keep, rate: float):
  """x / (1 - rate) where keep, else 0. The backward pass keeps only the mask
  (autodiff of a select also keeps a zero array the size of x)."""
  return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros_like(x))


def _apply_keep_mask_fwd(x, keep, rate):
  return apply_keep_mask(x, keep, rate), keep


def _apply_keep_mask_bwd(rate, keep, g):
  return apply_keep_mask(g, keep, rate), None


apply_keep_mask.defvjp(_apply_keep_mask_fwd, _apply_keep_mask_bwd)


def keep_mask(key, shape: tuple[int, ...], rate: float):
  """Boolean mask, True with probability 1 - rate (see Dropout)."""
  key_data = jax.random.key_data(key)
  half = tuple(shape[:-1]) + (shape[-1] // 2,) if shape else ()
  row = math.prod(half[1:])
  if key_data.shape != (2,) or not shape or shape[-1] % 2 or row >= 2**32:
    return jax.random.bernoulli(key, 1.0 - rate, shape)
  # Element (..., j) of the last axis hashes the counter of (..., j mod half).
  last = len(shape) - 1
  column = jax.lax.broadcasted_iota(jnp.uint32, shape, last)
  second_half = column >= jnp.uint32(half[-1])
  hi = jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
  lo = jnp.where(second_half, column - jnp.uint32(half[-1]), column)
  stride = half[-1]
  for axis in range(last - 1, 0, -1):
    lo = lo + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
    stride *= half[axis]
  word1, word2 = threefry2x32(key_data[0], key_data[1], hi, lo)
  threshold = min(round(rate * 2**32), 2**32 - 1)
  return jnp.where(second_half, word2, word1) >= jnp.uint32(threshold)


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(key1, key2, x1, x2):
  """The Threefry-2x32 hash (20 rounds) of the counter pairs (x1, x2).

  Bit for bit jax's threefry2x32 primitive, in plain elementwise operations:
  jax lowers that primitive on CPU to a loop over the whole arrays (five
  passes, each reading and writing both words, fused with nothing); written
  out, the rounds fuse with the counters before them and the comparison
  after them. Any 32-bit integer type gives the same bits (uint32 in XLA,
  int32 inside the attention kernels, whose compilers prefer it): the
  shifts are logical and the additions wrap.
  """
  dtype = jnp.result_type(x1, x2)
  c = lambda value: jnp.asarray(value, dtype)
  key1, key2 = jnp.asarray(key1, dtype), jnp.asarray(key2, dtype)
  keys = (key1, key2, key1 ^ key2 ^ c(0x1BD11BDA))
  x1, x2 = x1 + keys[0], x2 + keys[1]
  for i in range(5):
    for r in _THREEFRY_ROTATIONS[i % 2]:
      x1 = x1 + x2
      x2 = (jax.lax.shift_left(x2, c(r)) | jax.lax.shift_right_logical(x2, c(32 - r))) ^ x1
    x1 = x1 + keys[(i + 1) % 3]
    x2 = x2 + keys[(i + 2) % 3] + c(i + 1)
  return x1, x2


# Attention dropout: probabilities [B, N, Q, K], the query axis in tiles of
# ATTENTION_TILE rows, each tile in four parts of ATTENTION_PART rows. Row i
# of each part in a tile takes one threefry hash per key: part 0 the low 16
# bits of its first word, part 1 the high 16 bits, parts 2 and 3 the same of
# the second word. One hash decides four probabilities (against one or two
# for 32-bit thresholds), and a kernel expands a tile's hashes to its rows
# by stacking whole blocks of 32 rows, which TPUs and GPUs do without
# moving data between lanes.
ATTENTION_TILE = 128
ATTENTION_PART = 32
_ATTENTION_BITS = 16


def attention_threshold(rate: float) -> int:
  """A probability is dropped when its 16 bits are below this."""
  return min(round(rate * 2**_ATTENTION_BITS), 2**_ATTENTION_BITS - 1)


def attention_drop_rate(rate: float) -> float:
  """The exact probability that attention dropout at `rate` drops a probability:
  `rate` rounded to a multiple of 2^-16 (0.1 -> 6554 / 65536 = 0.100006...).
  The kept probabilities are scaled by 1 / (1 - this), so that their
  expectation is exact."""
  return attention_threshold(rate) / 2**_ATTENTION_BITS


def attention_counter_limit_problem(heads: int, q_len: int, k_len: int) -> str | None:
  """Why probabilities [*, heads, q_len, k_len] have too many counters per
  batch row for one 32-bit word (None if they fit)."""
  tiles = -(-q_len // ATTENTION_TILE)
  stride = -(-k_len // ATTENTION_TILE) * ATTENTION_TILE
  if heads * tiles * ATTENTION_PART * stride < 2**32:
    return None
  return (f"attention dropout: {heads} heads x {q_len} queries x {k_len} keys need more "
          "than 2^32 hash counters per batch row")


def attention_key_words(key, dtype=jnp.uint32):
  """The two 32-bit key words that attention dropout hashes with, in `dtype`.

  A threefry key's own words; from keys of other PRNG implementations, two
  words drawn from them.
  """
  data = jax.random.key_data(key)
  if data.shape != (2,):
    data = jax.random.bits(key, (2,), jnp.uint32)
  data = jax.lax.bitcast_convert_type(data.astype(jnp.uint32), dtype)
  return data[0], data[1]


def attention_tile_words(key1, key2, batch, head, tile, first_key, *, keys: int,
                         q_tiles: int, key_stride: int):
  """The two hash words [ATTENTION_PART, keys] of one tile of queries (`tile`,
  the global tile index) against keys first_key ... first_key + keys - 1 of
  (global) `batch` row and `head`.

  `q_tiles`: tiles in the query axis (ceil(Q / 128)); `key_stride`: the key
  axis rounded up to a multiple of 128. Both are the whole array's, so a
  block's draws do not depend on the block sizes, and a length padded up to
  a multiple of 128 keeps the draws of its real positions. The counters are
  (batch, ((head * q_tiles + tile) * 32 + row) * key_stride + key), in the
  32-bit integer type of key1 (a kernel's int32 or XLA's uint32: the same
  bits).
  """
  dtype = key1.dtype
  shape = (ATTENTION_PART, keys)
  base = ((head * q_tiles + tile) * ATTENTION_PART) * key_stride + first_key
  rows = jax.lax.broadcasted_iota(dtype, shape, 0)
  cols = jax.lax.broadcasted_iota(dtype, shape, 1)
  lo = rows * jnp.asarray(key_stride, dtype) + cols + jnp.asarray(base, dtype)
  hi = jnp.zeros(shape, dtype) + jnp.asarray(batch, dtype)
  return threefry2x32(key1, key2, hi, lo)


def attention_part_bits(word1, word2, part: int):
  """The 16-bit draws of rows part * 32 ... part * 32 + 31 of a tile."""
  word = word1 if part < 2 else word2
  if part % 2:
    return jax.lax.shift_right_logical(word, jnp.asarray(_ATTENTION_BITS, word.dtype))
  return word & jnp.asarray(2**_ATTENTION_BITS - 1, word.dtype)


def attention_tile_bits(key1, key2, batch, head, tile, first_key, *, keys: int,
                        q_tiles: int, key_stride: int):
  """The 16-bit draws [ATTENTION_TILE, keys] of one tile (attention_tile_words):
  its four parts stacked, whole blocks of rows. Shared by attention_keep_mask
  and the TPU kernel."""
  words = attention_tile_words(key1, key2, batch, head, tile, first_key, keys=keys,
                               q_tiles=q_tiles, key_stride=key_stride)
  return jnp.concatenate([attention_part_bits(*words, part) for part in range(4)], axis=0)


def attention_keep_mask(key, shape: tuple[int, ...], rate: float):
  """Boolean keep-mask for attention probabilities [B, N, Q, K]: True with
  probability 1 - attention_drop_rate(rate), from attention_tile_bits.

  The mask of [B, N, Q, K] is the top-left corner of the mask of the shape
  with Q and K rounded up to multiples of 128.
  """
  batch, heads, q_len, k_len = shape
  problem = attention_counter_limit_problem(heads, q_len, k_len)
  if problem:
    raise ValueError(problem)
  key1, key2 = attention_key_words(key)
  q_tiles = -(-q_len // ATTENTION_TILE)
  stride = -(-k_len // ATTENTION_TILE) * ATTENTION_TILE
  tile_bits = functools.partial(attention_tile_bits, key1, key2, first_key=jnp.uint32(0),
                                keys=stride, q_tiles=q_tiles, key_stride=stride)
  bits = jax.vmap(jax.vmap(jax.vmap(tile_bits, (None, None, 0)), (None, 0, None)),
                  (0, None, None))(jnp.arange(batch, dtype=jnp.uint32),
                                   jnp.arange(heads, dtype=jnp.uint32),
                                   jnp.arange(q_tiles, dtype=jnp.uint32))
  bits = bits.reshape(batch, heads, q_tiles * ATTENTION_TILE, stride)[:, :, :q_len, :k_len]
  return bits >= jnp.uint32(attention_threshold(rate))
