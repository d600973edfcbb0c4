"""The paper's instances in numpy batches: the creation driver's fast path.

instances.instance_spans gives each instance as token ranges of its
documents; `assemble_pairs` builds the [CLS] A [SEP] B [SEP] rows of a batch
of them and `mask_arrays` masks the rows (the 80/10/10 replacement of the
original, drawn per batch). records.ExampleEncoder.encode_batch serialises
the resulting `MaskedBatch`. Whole-word masking takes the scalar path
(instances.create_instances_from_document) instead.
"""

import dataclasses

import numpy as np

from bertjax.data import instances


def assemble_pairs(spans_Nx7: np.ndarray, tokens: np.ndarray, doc_starts: np.ndarray,
                   max_seq_length: int, vocab: instances.VocabInfo):
  """[CLS] A [SEP] B [SEP] rows of `instance_spans` tuples, in numpy.

  `tokens` holds every document's tokens back to back and doc_starts[d] is
  where document d begins. Returns (ids_BxL zero-padded, lengths_B, num_a_B,
  is_random_next_B).
  """
  s = spans_Nx7
  a_start = doc_starts[s[:, 0]] + s[:, 1]
  b_start = doc_starts[s[:, 3]] + s[:, 4]
  num_a, num_b = s[:, 2] - s[:, 1], s[:, 5] - s[:, 4]
  lengths = num_a + num_b + 3
  col = np.arange(max_seq_length)[None, :]
  na, nb = num_a[:, None], num_b[:, None]
  in_a = (col >= 1) & (col <= na)
  in_b = (col >= na + 2) & (col < na + 2 + nb)
  index = np.where(in_a, a_start[:, None] + col - 1,
                   np.where(in_b, b_start[:, None] + col - na - 2, 0))
  ids = np.where(in_a | in_b, tokens[index], 0)
  ids[:, 0] = vocab.cls_id
  rows = np.arange(len(s))
  ids[rows, num_a + 1] = vocab.sep_id
  ids[rows, lengths - 1] = vocab.sep_id
  return ids, lengths, num_a, s[:, 6].astype(bool)


@dataclasses.dataclass
class MaskedBatch:
  """Instances as padded arrays (B instances, L = max_seq_length, P = max pred).

  Rows are the records' features before padding is counted: `input_ids_BxL`
  is masked and zero-padded, the first `num_a_B + 2` tokens are segment 0,
  positions are ascending in each row, and `num_predictions_B` of the P
  prediction slots are used.
  """
  input_ids_BxL: np.ndarray
  lengths_B: np.ndarray
  num_a_B: np.ndarray
  masked_lm_positions_BxP: np.ndarray
  masked_lm_ids_BxP: np.ndarray
  num_predictions_B: np.ndarray
  is_random_next_B: np.ndarray

  def __len__(self):
    return len(self.lengths_B)

  def instance(self, i: int) -> instances.Instance:
    n, k = int(self.lengths_B[i]), int(self.num_predictions_B[i])
    return instances.Instance(self.input_ids_BxL[i, :n].tolist(), int(self.num_a_B[i]),
                    self.masked_lm_positions_BxP[i, :k].tolist(),
                    self.masked_lm_ids_BxP[i, :k].tolist(),
                    bool(self.is_random_next_B[i]))


def mask_arrays(ids: np.ndarray, lengths: np.ndarray, num_a: np.ndarray,
                is_random_next: np.ndarray, masked_lm_prob: float,
                max_predictions_per_seq: int, vocab: instances.VocabInfo,
                gen: np.random.Generator) -> MaskedBatch:
  """`mask_tokens` for a batch of zero-padded [CLS] A [SEP] B [SEP] rows.

  The same masking as the original, drawn differently: each row's
  num_predictions = min(P, max(1, round(length * masked_lm_prob))) positions
  are the candidates with the smallest uniform keys (a uniformly random
  subset, as a shuffle's prefix is), and one uniform per chosen position
  picks [MASK] (< 0.8), the original token (< 0.9) or a random non-special
  id. Not for whole-word masking (use `mask_tokens`).
  """
  (B, L), P = ids.shape, max_predictions_per_seq
  col = np.arange(L)
  valid = col < lengths[:, None]
  cand = (valid & (col > 0) & (col != (num_a + 1)[:, None])
          & (col != (lengths - 1)[:, None]))
  # np.round, like Python's round, rounds halves to even.
  k = np.minimum(P, np.maximum(1, np.round(lengths * masked_lm_prob))).astype(
      np.int64)
  # The k smallest of uniform keys over the candidates: the P smallest by
  # partition, sorted, then the first k of them that are candidates.
  keys = gen.random((B, L))
  keys[~cand] = 2.0
  part = np.argpartition(keys, P - 1, axis=1)[:, :P] if P < L else (
      np.broadcast_to(col, (B, L)).copy())
  part_keys = np.take_along_axis(keys, part, axis=1)
  by_key = np.argsort(part_keys, axis=1)
  cols_by_key = np.take_along_axis(part, by_key, axis=1)
  used = ((np.arange(P) < k[:, None])
          & (np.take_along_axis(part_keys, by_key, axis=1) < 2.0))
  positions = np.sort(np.where(used, cols_by_key, L), axis=1)
  used = positions < L
  positions[~used] = 0
  counts = used.sum(axis=1)
  labels = np.where(used, np.take_along_axis(ids, positions, axis=1), 0)
  # One uniform per prediction: [MASK] below 0.8, unchanged below 0.9, else
  # a random non-special id.
  u = gen.random((B, P))
  rows = np.broadcast_to(np.arange(B)[:, None], (B, P))
  to_mask = used & (u < 0.8)
  to_random = used & (u >= 0.9)
  masked = ids.copy()
  masked[rows[to_mask], positions[to_mask]] = vocab.mask_id
  replacement = vocab.replacement_array
  masked[rows[to_random], positions[to_random]] = replacement[
      gen.integers(0, len(replacement), int(to_random.sum()))]
  return MaskedBatch(masked, lengths, num_a, positions, labels, counts,
                     is_random_next)
