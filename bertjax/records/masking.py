"""The masked-LM rule every masker follows: how many tokens, and what each becomes.

Part of the record contract: pre-masked records (bertjax.create, both its
reference and its batched path) and records masked while read
(bertjax.input.dynamic_masking) use these two definitions, those of the
original release's create_pretraining_data.py:

* `num_predictions`: min(max_predictions_per_seq, max(1, round(num_tokens *
  masked_lm_prob))) positions of a sequence of num_tokens tokens ([CLS] and
  [SEP] counted), never more than it has candidates. Rounding is half to
  even, as Python's round.
* the 80/10/10 draw: a chosen token becomes [MASK] if a first uniform is
  below mask_prob (0.8); otherwise a second uniform decides between keeping
  it and a random token, keeping it if below keep_share = (1 - mask_prob -
  random_prob) / (1 - mask_prob) (0.5). The original draws the second number
  only when the first is not below 0.8, and so does `draw_replacement`.

How the positions are chosen (a shuffle, Floyd's sampling, the smallest of
hashed keys) and which generator draws the numbers is each masker's own
business; all choose a uniform random subset of the candidates.
"""

from typing import Callable

import numpy as np

MASK, KEEP, RANDOM = 0, 1, 2  # What a chosen token becomes.


def num_predictions(num_tokens, masked_lm_prob: float,
                    max_predictions_per_seq: int, num_candidates=None):
  """Predictions per sequence (ints or arrays); see the module docstring."""
  n = np.round(np.asarray(num_tokens) * masked_lm_prob).astype(np.int64)
  k = np.minimum(max_predictions_per_seq, np.maximum(1, n))
  if num_candidates is not None:
    k = np.minimum(k, np.maximum(np.asarray(num_candidates), 0))
  return int(k) if k.ndim == 0 else k


def keep_share(mask_prob: float = 0.8, random_prob: float = 0.1) -> float:
  """The share of tokens not turned into [MASK] that stay themselves."""
  if not (0.0 <= mask_prob and 0.0 <= random_prob
          and mask_prob + random_prob <= 1.0):
    raise ValueError(f"mask_prob={mask_prob}, random_prob={random_prob}: "
                     "each must be >= 0 and their sum at most 1.")
  if mask_prob >= 1.0:
    return 1.0
  # Rounded so that the defaults give exactly 0.5, the original's threshold
  # (the float arithmetic gives 0.49999999999999983).
  return round((1.0 - mask_prob - random_prob) / (1.0 - mask_prob), 12)


def draw_replacement(random: Callable[[], float], mask_prob: float = 0.8,
                     random_prob: float = 0.1) -> int:
  """MASK, KEEP or RANDOM for one token, from one or two calls of `random`."""
  if random() < mask_prob:
    return MASK
  return KEEP if random() < keep_share(mask_prob, random_prob) else RANDOM


def replacements(first: np.ndarray, second: np.ndarray, mask_prob: float = 0.8,
                 random_prob: float = 0.1) -> np.ndarray:
  """MASK, KEEP or RANDOM per token from two uniforms each (arrays)."""
  keep = np.asarray(second) < keep_share(mask_prob, random_prob)
  return np.where(np.asarray(first) < mask_prob, MASK,
                  np.where(keep, KEEP, RANDOM)).astype(np.int8)
