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
from jax.extend import random as jax_random
import jax.numpy as jnp


class Dropout(nn.Module):
  """Inverted dropout whose keep-masks take one threefry hash per two elements.

  flax's nn.Dropout draws a uniform float per element, one threefry2x32
  hash each (jax folds the hash's two 32-bit words into one). Here both
  words of each hash are used: hashes of the (batch, flat index) counters over
  half the last axis fill the whole mask, and an element is kept when its
  word is at least round(rate * 2^32), a keep probability exact to 2^-32.
  The counters are global indices, so the mask does not depend on how the
  array is sharded. Keys of other PRNG implementations, odd last axes and
  arrays whose rows exceed 2^32 counters fall back to jax.random.bernoulli.
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
  hi = jax.lax.broadcasted_iota(jnp.uint32, half, 0)
  lo, stride = jnp.zeros(half, jnp.uint32), 1
  for axis in range(len(half) - 1, 0, -1):
    lo = lo + jax.lax.broadcasted_iota(jnp.uint32, half, axis) * jnp.uint32(stride)
    stride *= half[axis]
  word1, word2 = jax_random.threefry2x32_p.bind(key_data[0], key_data[1], hi, lo)
  threshold = min(round(rate * 2**32), 2**32 - 1)
  return jnp.concatenate([word1, word2], axis=-1) >= jnp.uint32(threshold)
