"""Dropout whose keep-masks are cheap to draw and cheap to differentiate.

keep_mask draws the boolean mask, apply_keep_mask applies it with a
gradient that keeps only the mask, and Dropout is the module that draws from
the 'dropout' stream. The encoder's layers, the heads and XLA attention's
softmax-dropout-values product all use them.
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
  """The Threefry-2x32 hash (20 rounds) of the counter pairs (x1, x2), uint32.

  Bit for bit jax's threefry2x32 primitive, in plain elementwise operations:
  jax lowers that primitive on CPU to a loop over the whole arrays (five
  passes, each reading and writing both words, fused with nothing); written
  out, the rounds fuse with the counters before them and the comparison
  after them.
  """
  keys = (key1, key2, key1 ^ key2 ^ jnp.uint32(0x1BD11BDA))
  x1, x2 = x1 + keys[0], x2 + keys[1]
  for i in range(5):
    for r in _THREEFRY_ROTATIONS[i % 2]:
      x1 = x1 + x2
      x2 = ((x2 << jnp.uint32(r)) | (x2 >> jnp.uint32(32 - r))) ^ x1
    x1 = x1 + keys[(i + 1) % 3]
    x2 = x2 + keys[(i + 2) % 3] + jnp.uint32(i + 1)
  return x1, x2
