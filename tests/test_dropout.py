"""Dropout's keep-masks: their definition against jax's own threefry, and what
a product of row and column words could add beyond independent draws.

The statistics compare each mask with independent Bernoulli draws of the same
keep probability (numpy), under the same tests and bounds: keep rates, pairs
of rows and of columns, 2x2 minors (four elements in two rows and two
columns, the pattern a product could tie together), the spread of row and
column counts, and the largest singular values of the centred mask (a
product structure would show as a large one).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import dropout

RATE = 0.1


def _threefry(key, hi, lo, word):
  k1, k2 = jax.random.key_data(key)
  out = jax.extend.random.threefry2x32_p.bind(k1, k2, jnp.asarray(hi, jnp.uint32),
                                              jnp.asarray(lo, jnp.uint32))
  return np.asarray(out[word]) | np.uint32(1)


def test_threefry_written_out_is_jax_primitive_bit_for_bit():
  key = jax.random.key(7)
  k1, k2 = jax.random.key_data(key)
  rng = np.random.default_rng(0)
  hi, lo = (jnp.asarray(rng.integers(0, 2**32, 1000, dtype=np.uint64), jnp.uint32)
            for _ in range(2))
  ours = dropout.threefry2x32(k1, k2, hi, lo)
  theirs = jax.extend.random.threefry2x32_p.bind(k1, k2, hi, lo)
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_keep_mask_is_the_documented_product():
  """Row (b, i) (b the first axis, i the flat index over the middle axes) takes
  threefry2x32(key, (b, i))'s first word, column j threefry2x32(key,
  (2^32 - 1, j))'s, both odd; element (b, i, j) is kept unless their wrapped
  product, as int32, is below -2^31 + 2 round(rate 2^31)."""
  key = jax.random.key(3)
  shape, rate = (3, 5, 6, 10), 0.3
  b = np.repeat(np.arange(3), 30)
  rows = _threefry(key, b, np.tile(np.arange(30), 3), 0).reshape(3, 5, 6, 1)
  cols = _threefry(key, np.full(10, 2**32 - 1), np.arange(10), 0)
  product = (rows * cols).view(np.int32)
  want = product >= -2**31 + 2 * round(rate * 2**31)
  np.testing.assert_array_equal(np.asarray(dropout.keep_mask(key, shape, rate)), want)
  # A prefix of the middle axes draws the whole array's mask there.
  np.testing.assert_array_equal(np.asarray(dropout.keep_mask(key, (3, 2, 6, 10), rate)),
                                want[:, :2])
  assert dropout.drop_rate(rate) == 2 * round(rate * 2**31) / 2**32
  # One hash per row and per column: no loop, and the words are not
  # recomputed per element (XLA's count stays a few operations per element).
  compiled = jax.jit(lambda k: dropout.keep_mask(k, (64, 128, 256), RATE)).lower(key).compile()
  assert " while(" not in compiled.as_text()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  assert cost["flops"] / (64 * 128 * 256) < 8, cost["flops"]


def test_keep_mask_rate_keys_rows_and_fallback():
  key = jax.random.key(0)
  mask = np.asarray(dropout.keep_mask(key, (64, 128, 256), RATE))
  assert abs(mask.mean() - (1 - RATE)) < 0.002, mask.mean()
  assert (mask[0] != mask[1]).mean() > 0.15  # Rows differ.
  assert (mask[..., :128] != mask[..., 128:]).mean() > 0.15  # Columns too.
  assert np.array_equal(mask, np.asarray(dropout.keep_mask(key, (64, 128, 256), RATE)))
  other = np.asarray(dropout.keep_mask(jax.random.key(1), (64, 128, 256), RATE))
  assert (mask != other).mean() > 0.15
  odd = np.asarray(dropout.keep_mask(key, (64, 129), 0.25))  # Any last axis.
  assert odd.shape == (64, 129) and abs(odd.mean() - 0.75) < 0.03
  flat = np.asarray(dropout.keep_mask(key, (4096,), 0.25))  # 1-D: bernoulli.
  assert abs(flat.mean() - 0.75) < 0.03
  rbg = np.asarray(dropout.keep_mask(jax.random.key(0, impl="rbg"), (64, 128), 0.5))
  assert abs(rbg.mean() - 0.5) < 0.03  # Falls back to bernoulli.
  assert not dropout.keep_mask(key, (8, 16), 0.0).size - dropout.keep_mask(
      key, (8, 16), 0.0).sum()  # Rate 0 keeps everything.
  x = jnp.ones((8, 64))
  out = dropout.Dropout(0.5).apply({}, x, False, rngs={"dropout": key})
  assert set(np.unique(np.asarray(out))) <= {0.0, 2.0}
  assert dropout.Dropout(0.5).apply({}, x, True) is x


def _statistics(masks: np.ndarray) -> dict[str, float]:
  """Statistics of keep-masks [S, R, C] (S independent draws of an R x C grid)."""
  s, r, c = masks.shape
  x = masks.astype(np.float64)
  p = x.mean()
  rng = np.random.default_rng(0)
  # Four elements in two rows and two columns: the 16 patterns' frequencies
  # against independent draws at rate p, as a chi-square (15 degrees of freedom).
  n = 40_000
  i = rng.integers(0, s, n)
  qa, qb = rng.integers(0, r, n), rng.integers(0, r, n)
  ka, kb = rng.integers(0, c, n), rng.integers(0, c, n)
  ok = (qa != qb) & (ka != kb)
  pattern = (masks[i, qa, ka] * 8 + masks[i, qa, kb] * 4 + masks[i, qb, ka] * 2
             + masks[i, qb, kb])[ok].astype(int)
  observed = np.bincount(pattern, minlength=16)
  expected = np.array([np.prod([p if (v >> bit) & 1 else 1 - p for bit in range(4)])
                       for v in range(16)]) * observed.sum()
  centred = x - p
  corr = lambda m: np.corrcoef(m)[np.triu_indices(m.shape[0], 1)]
  return {
      "keep": p,
      "minor_chi2": float(((observed - expected) ** 2 / expected).sum()),
      "row_corr": float(np.mean([np.abs(corr(m)).max() for m in x])),
      "col_corr": float(np.mean([np.abs(corr(m.T)).max() for m in x])),
      "row_count_var": float(x.sum(2).var(1).mean() / (c * p * (1 - p))),
      "col_count_var": float(x.sum(1).var(1).mean() / (r * p * (1 - p))),
      "top_singular": float(np.mean([np.linalg.svd(m, compute_uv=False)[0] for m in centred])),
  }


def _assert_like_independent_draws(masks, rate):
  s, r, c = masks.shape
  ours = _statistics(masks)
  rng = np.random.default_rng(1)
  independent = _statistics(rng.random(masks.shape) >= rate)
  assert abs(ours["keep"] - (1 - rate)) < 4 * np.sqrt(rate * (1 - rate) / masks.size)
  assert ours["minor_chi2"] < 37.7, ours  # The 99.9% point of chi-square(15).
  for name in ("row_corr", "col_corr", "top_singular"):
    assert ours[name] < 1.1 * independent[name], (name, ours, independent)
  for name in ("row_count_var", "col_count_var"):  # 1 for binomial counts.
    assert abs(ours[name] - 1) < 0.15, (name, ours)


@pytest.mark.slow
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_attention_masks_behave_like_independent_draws(rate):
  """Probabilities of one batch row and head, over many keys."""
  draws = [np.asarray(dropout.attention_keep_mask(jax.random.key(seed), (1, 2, 256, 256),
                                                  rate))
           for seed in range(20)]
  masks = np.concatenate([d[0] for d in draws])  # [40, 256, 256]
  _assert_like_independent_draws(masks, rate)
  # Heads share the row words but not the column words: the two heads' masks
  # agree no more than independent draws do.
  agree = np.mean([(d[0, 0] == d[0, 1]).mean() for d in draws])
  assert abs(agree - ((1 - rate) ** 2 + rate ** 2)) < 0.005, agree


@pytest.mark.slow
def test_hidden_masks_behave_like_independent_draws():
  """Tokens x features, as the encoder's hidden dropout draws them."""
  masks = np.stack([np.asarray(dropout.keep_mask(jax.random.key(seed), (2, 128, 384), RATE))
                    .reshape(256, 384) for seed in range(30)])
  _assert_like_independent_draws(masks, RATE)
