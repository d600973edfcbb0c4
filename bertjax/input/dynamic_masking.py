"""On-the-fly MLM masking with a fresh mask every epoch (RoBERTa style).

The pipeline can mask records as it reads them instead of using the masks
written into them:

* records written without masks (masked_lm_weights all 0) are masked as read;
* pre-masked records first get their original ids back
  (input_ids[masked_lm_positions] = masked_lm_ids where the weight is > 0)
  and are then masked afresh.

The rule is the one used when creating the data (records/masking.py): every
token of the sequence counts, [CLS] and [SEP] included, in the number of
predictions (masking.num_predictions), chosen uniformly among the maskable
positions (not [CLS], [SEP], [PAD], [MASK] or padding), and a chosen token
becomes [MASK], stays itself or becomes a random non-special token by the
same 80/10/10 draw (masking.replacements; the shares are options).
Positions are ascending. Whole-word masking is not done here.

Every random number is a hash of (seed, epoch, example key, position), so an
example's mask depends only on those, not on the batch it is in, the number
of hosts or threads; all work is vectorised numpy over the batch.
"""

import dataclasses
import functools
from typing import Any, Mapping

import numpy as np

from bertjax.records import masking

# Special tokens that are never chosen for prediction.
_NEVER_MASKED = ("pad", "cls", "sep", "mask")
# Keys of the options dict that the pipeline accepts (`dynamic_masking=`).
OPTION_KEYS = ("masked_lm_prob", "mask_token_prob", "random_token_prob", "seed",
               "vocab_size", "special_ids")


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """How to mask; special ids and vocab size normally come from metadata."""
  vocab_size: int
  special_ids: Mapping[str, int]  # needs pad, cls, sep, mask
  max_predictions_per_seq: int
  masked_lm_prob: float = 0.15
  mask_token_prob: float = 0.8  # chosen token -> [MASK]
  random_token_prob: float = 0.1  # chosen token -> random token
  seed: int = 0

  def __post_init__(self):
    missing = [k for k in _NEVER_MASKED if k not in self.special_ids]
    if missing:
      raise ValueError(f"dynamic_masking.special_ids lacks {missing}; give ids "
                       "for pad, cls, sep and mask (metadata.json has them).")
    if not 0.0 < self.masked_lm_prob < 1.0:
      raise ValueError(f"dynamic_masking.masked_lm_prob must be in (0, 1), got "
                       f"{self.masked_lm_prob}")
    if self.mask_token_prob + self.random_token_prob > 1.0:
      raise ValueError("dynamic_masking: mask_token_prob + random_token_prob "
                       "must not exceed 1")
    if self.max_predictions_per_seq <= 0:
      raise ValueError("max_predictions_per_seq must be positive")


def from_options(options: Mapping[str, Any], *, max_predictions_per_seq: int,
                 seed: int, metadata=None) -> MaskingConfig:
  """A MaskingConfig from the pipeline's `dynamic_masking` dict.

  vocab_size and special_ids default to those in `metadata`
  (schema.DatasetMetadata); seed defaults to the pipeline's seed.
  """
  unknown = sorted(set(options) - set(OPTION_KEYS))
  if unknown:
    raise ValueError(f"dynamic_masking: unknown options {unknown}; known: "
                     f"{list(OPTION_KEYS)}")
  kw = dict(options)
  for key in ("vocab_size", "special_ids"):
    if key not in kw:
      if metadata is None:
        raise ValueError(f"dynamic_masking needs '{key}': the data has no "
                         "metadata.json, so pass it in the dynamic_masking options.")
      kw[key] = getattr(metadata, key)
  kw.setdefault("seed", seed)
  return MaskingConfig(max_predictions_per_seq=max_predictions_per_seq, **kw)


def restore_original_ids(input_ids_BxL: np.ndarray, positions_BxP: np.ndarray,
                         ids_BxP: np.ndarray, weights_BxP: np.ndarray) -> np.ndarray:
  """Undoes the masks written into pre-masked records (a copy)."""
  out = np.array(input_ids_BxL, copy=True)
  rows, cols = np.nonzero(weights_BxP > 0)
  out[rows, positions_BxP[rows, cols]] = ids_BxP[rows, cols]
  return out


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser: a bijective, well-mixing uint64 hash."""
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def _uniform(seed: int, epochs_B, keys_B, cols: np.ndarray) -> np.ndarray:
  """Uniform [0, 1) floats of shape cols.shape ([B, ...]), each a pure function
  of (seed, epoch, example key, column code)."""
  with np.errstate(over="ignore"):
    h = _mix(np.uint64(seed % 2**64) + _GOLDEN)
    h = _mix(h ^ (np.asarray(epochs_B, np.uint64) + _GOLDEN))
    h = _mix(h ^ np.asarray(keys_B, np.uint64))
    h = h.reshape((-1,) + (1,) * (cols.ndim - 1))
    h = _mix(h + (cols.astype(np.uint64) + np.uint64(1)) * _GOLDEN)
  return (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


@functools.lru_cache(maxsize=8)
def _regular_ids(vocab_size: int, special_ids: tuple[int, ...]) -> np.ndarray:
  """The ids a random replacement is drawn from: all but the special ones."""
  return np.setdiff1d(np.arange(vocab_size), np.asarray(special_ids, np.int64))


def _smallest(u_BxL: np.ndarray, cand_BxL: np.ndarray, num_B: np.ndarray,
              k: int) -> np.ndarray:
  """Per row, the num_B candidates of smallest u (a uniform random subset),
  ascending, in k columns; unused columns hold L (after the used ones)."""
  length = u_BxL.shape[1]
  u_BxL = np.where(cand_BxL, u_BxL, 2.0)
  smallest_BxK = np.argpartition(u_BxL, k - 1, axis=1)[:, :k] if k < length else (
      np.broadcast_to(np.arange(length), u_BxL.shape))
  by_value_BxK = np.argsort(np.take_along_axis(u_BxL, smallest_BxK, axis=1), axis=1)
  chosen_BxK = np.take_along_axis(smallest_BxK, by_value_BxK, axis=1)
  chosen_BxK = np.where(np.arange(k)[None, :] < num_B[:, None], chosen_BxK, length)
  return np.sort(chosen_BxK, axis=1)


def mask_batch(batch: Mapping[str, np.ndarray], keys_B: np.ndarray,
               epochs_B: np.ndarray, cfg: MaskingConfig) -> dict[str, np.ndarray]:
  """Masks a parsed batch afresh; returns the four MLM fields.

  Args:
    batch: input_ids, input_mask, masked_lm_positions, masked_lm_ids,
      masked_lm_weights as parsed ([B, L] and [B, P]).
    keys_B: a unique key per example (the pipeline uses file number * 2**40 +
      record number), so the mask does not depend on the batch.
    epochs_B: the epoch each example is read in.
    cfg: the masking settings.

  Returns:
    input_ids [B, L] int32, masked_lm_positions / masked_lm_ids [B, P] int32
    and masked_lm_weights [B, P] float32.
  """
  ids_BxL = restore_original_ids(batch["input_ids"], batch["masked_lm_positions"],
                                 batch["masked_lm_ids"], batch["masked_lm_weights"])
  mask_BxL = np.asarray(batch["input_mask"]) > 0
  bsz, length = ids_BxL.shape
  max_pred = cfg.max_predictions_per_seq
  never = np.array([cfg.special_ids[k] for k in _NEVER_MASKED], ids_BxL.dtype)
  cand_BxL = mask_BxL & ~np.isin(ids_BxL, never)
  num_B = masking.num_predictions(mask_BxL.sum(1), cfg.masked_lm_prob, max_pred,
                                 cand_BxL.sum(1))

  # Column code 4 * position + stream: stream 0 picks positions, 1 and 3 make
  # the 80/10/10 draw and 2 picks the random token at a position.
  u_BxL = _uniform(cfg.seed, epochs_B, keys_B, 4 * np.arange(length)[None, :])
  chosen_BxK = _smallest(u_BxL, cand_BxL, num_B, min(max_pred, length))
  k = chosen_BxK.shape[1]
  valid_BxK = chosen_BxK < length
  pos_BxK = np.where(valid_BxK, chosen_BxK, 0)
  rows_BxK = np.broadcast_to(np.arange(bsz)[:, None], pos_BxK.shape)

  # 80% [MASK], 10% unchanged, 10% a random non-special token.
  kind_BxK = masking.replacements(
      _uniform(cfg.seed, epochs_B, keys_B, 4 * pos_BxK + 1),
      _uniform(cfg.seed, epochs_B, keys_B, 4 * pos_BxK + 3),
      cfg.mask_token_prob, cfg.random_token_prob)
  pick_BxK = _uniform(cfg.seed, epochs_B, keys_B, 4 * pos_BxK + 2)
  regular = _regular_ids(cfg.vocab_size, tuple(sorted(cfg.special_ids.values())))
  random_BxK = regular[np.minimum((pick_BxK * len(regular)).astype(np.int64),
                                  len(regular) - 1)]
  original_BxK = ids_BxL[rows_BxK, pos_BxK]
  new_BxK = np.where(kind_BxK == masking.MASK, cfg.special_ids["mask"],
                     np.where(kind_BxK == masking.RANDOM, random_BxK, original_BxK))
  masked_BxL = ids_BxL.copy()
  masked_BxL[rows_BxK[valid_BxK], pos_BxK[valid_BxK]] = new_BxK[valid_BxK]

  out_pos = np.zeros((bsz, max_pred), np.int32)
  out_ids = np.zeros((bsz, max_pred), np.int32)
  out_w = np.zeros((bsz, max_pred), np.float32)
  out_pos[:, :k] = pos_BxK
  out_ids[:, :k] = np.where(valid_BxK, original_BxK, 0)
  out_w[:, :k] = valid_BxK
  return {"input_ids": masked_BxL.astype(np.int32), "masked_lm_positions": out_pos,
          "masked_lm_ids": out_ids, "masked_lm_weights": out_w}

