"""Dropout whose keep-masks are cheap to draw and cheap to differentiate.

keep_mask draws the boolean mask, apply_keep_mask applies it with a
gradient that keeps only the mask, and Dropout is the module that draws from
the 'dropout' stream. The encoder's layers and the heads use them.

Both masks here are products of row and column words. A mask over a [rows,
cols] grid (hidden activations: [tokens, features]; attention
probabilities: [queries, keys] of each batch row and head) takes one odd
32-bit word per row and one per column, each from threefry2x32 of its own
counter under the key, and keeps element (i, j) unless the 32-bit product
row_i * col_j falls in a fixed range of measure `rate` (product_keep). The
threefry hashes cost one per row and one per column instead of one per
element; what each element costs is one multiplication and one comparison.
For a given column word the product is a bijection of the odd row words,
so an element is dropped with probability exactly drop_rate(rate) (`rate`
to 2^-31) and, across rows or across columns, elements are independent;
tests/test_dropout.py checks what a product could add beyond that (pairs of
rows and columns, 2x2 minors, row and column counts, singular values)
against independent draws.

Attention probabilities take attention_keep_mask, whose words a fused
attention kernel reads (attention_words) and whose products it forms block
by block in its forward and backward passes: XLA attention and the kernels
drop the same probabilities for the same key.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp


class Dropout(nn.Module):
  """Inverted dropout whose keep-masks are products of row and column words.

  flax's nn.Dropout draws a uniform float per element through
  jax.random.bits, which on CPU runs the threefry2x32 hash as a loop of
  five passes over the whole array and then converts the bits to floats.
  Here keep_mask hashes one word per row (all axes but the last) and one
  per column (the last axis) and forms each element's product in the pass
  that applies the mask. The counters are global indices, so the mask does
  not depend on how the array is sharded. Keys of other PRNG
  implementations, 1-D arrays and arrays too large for the counters
  (keep_words) fall back to jax.random.bernoulli.
  """
  rate: float  # In [0, 1), as the config checks.

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    key = self.make_rng("dropout")
    words = keep_words(key, x.shape)
    if words is None:
      return apply_keep_mask(x, keep_mask(key, x.shape, self.rate), drop_rate(self.rate))
    return apply_product_mask(x, *words, self.rate)

  def key(self):
    """A key from the 'dropout' stream (attention draws its words from it)."""
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def apply_product_mask(x, row_words, col_words, rate: float):
  """Dropout of x at `rate` by the product mask of its row and column words
  (keep_words): kept elements scaled by 1 / (1 - drop_rate(rate)). The
  backward pass keeps only the words and forms the mask again, in the pass
  that applies it, rather than keeping a boolean array the size of x."""
  keep = product_keep(row_words, col_words, rate)
  return apply_keep_mask(x, keep, drop_rate(rate))


def _apply_product_mask_fwd(x, row_words, col_words, rate):
  return apply_product_mask(x, row_words, col_words, rate), (row_words, col_words)


def _apply_product_mask_bwd(rate, words, g):
  return apply_product_mask(g, *words, rate), None, None


apply_product_mask.defvjp(_apply_product_mask_fwd, _apply_product_mask_bwd)


_INT32_MIN = -2**31


def product_threshold(rate: float) -> int:
  """Products (as int32) below this are dropped: the range [-2^31, -2^31 + T)
  holds T / 2 odd values of the 2^31, T = 2 round(rate 2^31)."""
  return _INT32_MIN + 2 * min(round(rate * 2**31), 2**31 - 1)


def drop_rate(rate: float) -> float:
  """The exact probability that a product mask at `rate` drops an element:
  `rate` rounded to a multiple of 2^-31. Kept elements are scaled by
  1 / (1 - this), so that their expectation is exact."""
  return (product_threshold(rate) - _INT32_MIN) / 2**32


def product_keep(rows, cols, rate: float):
  """Whether each element of the broadcast of `rows` against `cols` (odd words,
  int32 or uint32: the same bits) is kept: its wrapped 32-bit product, read as
  int32, is at least product_threshold(rate). Shared by XLA and the kernels."""
  product = rows * cols
  if product.dtype != jnp.int32:
    product = jax.lax.bitcast_convert_type(product.astype(jnp.uint32), jnp.int32)
  return product >= jnp.int32(product_threshold(rate))


def _odd_words(key_data, hi, lo, word: int):
  """Word `word` (0 or 1) of threefry2x32 of the counters (hi, lo), made odd."""
  return threefry2x32(key_data[0], key_data[1], hi, lo)[word] | jnp.uint32(1)


_COLUMN_HI = 2**32 - 1  # The column words' first counter word: no batch row's.


def keep_words(key, shape: tuple[int, ...]):
  """(row words [*shape[:-1], 1], column words [1, ..., shape[-1]]) of the
  product mask of an array of `shape`, uint32; None where keep_mask falls
  back to jax.random.bernoulli (keys of other PRNG implementations, a
  first axis of 2^32 - 1 or more, or 2^32 or more rows per entry of it).

  Row (b, i) (b the first axis, i the flat index over the axes between it
  and the last) takes the first word of threefry2x32(key, (b, i)), column j
  the first of threefry2x32(key, (2^32 - 1, j)), both made odd. The words of
  a prefix of the middle axes are the whole array's: the last layer, run at
  a sequence's first positions only, draws the masks of those positions.
  The words are materialised: fused into the pass that multiplies them, XLA
  would hash again per element.
  """
  key_data = jax.random.key_data(key)
  if key_data.shape != (2,) or len(shape) < 2:
    return None
  middle = math.prod(shape[1:-1])
  if shape[0] >= _COLUMN_HI or middle >= 2**32 or shape[-1] >= 2**32:
    return None
  key_data = key_data.astype(jnp.uint32)
  row_shape = tuple(shape[:-1]) + (1,)
  flat = jnp.zeros(row_shape, jnp.uint32)
  stride = 1
  for axis in range(len(shape) - 2, 0, -1):
    flat = flat + jax.lax.broadcasted_iota(jnp.uint32, row_shape, axis) * jnp.uint32(stride)
    stride *= shape[axis]
  batch = jax.lax.broadcasted_iota(jnp.uint32, row_shape, 0)
  col = jax.lax.broadcasted_iota(jnp.uint32, (1,) * (len(shape) - 1) + (shape[-1],),
                                 len(shape) - 1)
  return jax.lax.optimization_barrier(
      (_odd_words(key_data, batch, flat, 0),
       _odd_words(key_data, jnp.full_like(col, _COLUMN_HI), col, 0)))


def keep_mask(key, shape: tuple[int, ...], rate: float):
  """Boolean mask, True with probability 1 - drop_rate(rate): product_keep of
  keep_words (see Dropout), or jax.random.bernoulli where those are None."""
  words = keep_words(key, shape)
  if words is None:
    return jax.random.bernoulli(key, 1.0 - drop_rate(rate), shape)
  return product_keep(*words, rate)


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


# Attention dropout: probabilities [B, N, Q, K]. Query q of batch row b takes
# the row word of threefry2x32(key, (b, q))'s first word; key k of batch row
# b and head n the column word of threefry2x32(key, (b, n * 2^16 + k))'s
# second word (both odd). The row words are shared by the heads, whose column
# words differ. Lengths and heads are thus limited to 2^16 each.
_ATTENTION_LIMIT = 2**16


def attention_drop_rate(rate: float) -> float:
  """The exact probability that attention dropout at `rate` drops a probability
  (drop_rate: `rate` rounded to a multiple of 2^-31)."""
  return drop_rate(rate)


def attention_counter_limit_problem(heads: int, q_len: int, k_len: int) -> str | None:
  """Why probabilities [*, heads, q_len, k_len] have too many counters for
  attention_words (None if they fit)."""
  if max(heads, q_len, k_len) <= _ATTENTION_LIMIT:
    return None
  return (f"attention dropout: {heads} heads, {q_len} queries and {k_len} keys: each "
          f"must be at most {_ATTENTION_LIMIT}")


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


def attention_words(key, batch: int, heads: int, length: int, dtype=jnp.uint32):
  """(row words [B, L], column words [B, N, L]) of attention dropout for
  probabilities [B, N, L, L] (see above), as global indices: a shard's words
  are the slice of the whole array's, and a length padded further keeps the
  words of its real positions. In `dtype` (int32 for the kernels)."""
  problem = attention_counter_limit_problem(heads, length, length)
  if problem:
    raise ValueError(problem)
  key_data = jnp.stack(attention_key_words(key))
  b = jax.lax.broadcasted_iota(jnp.uint32, (batch, length), 0)
  q = jax.lax.broadcasted_iota(jnp.uint32, (batch, length), 1)
  rows = _odd_words(key_data, b, q, 0)
  shape = (batch, heads, length)
  b = jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
  counter = (jax.lax.broadcasted_iota(jnp.uint32, shape, 1) * jnp.uint32(_ATTENTION_LIMIT)
             + jax.lax.broadcasted_iota(jnp.uint32, shape, 2))
  cols = _odd_words(key_data, b, counter, 1)
  if dtype != jnp.uint32:
    rows, cols = (jax.lax.bitcast_convert_type(w, dtype) for w in (rows, cols))
  return rows, cols


def attention_keep_mask(key, shape: tuple[int, ...], rate: float):
  """Boolean keep-mask for attention probabilities [B, N, Q, K]: True with
  probability 1 - attention_drop_rate(rate), product_keep of the row words
  of the queries and the column words of the keys (attention_words).

  The mask of [B, N, Q, K] is the top-left corner of the mask of any longer
  shape.
  """
  batch, heads, q_len, k_len = shape
  rows, cols = jax.lax.optimization_barrier(
      attention_words(key, batch, heads, max(q_len, k_len)))
  return product_keep(rows[:, None, :q_len, None], cols[:, :, None, :k_len], rate)
