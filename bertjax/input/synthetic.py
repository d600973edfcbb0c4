"""Synthetic batches in the model layout, for benchmarks and tests (no TensorFlow).

Each batch is a pure function of (seed, step, process_index): random tokens,
a ragged padding tail, two segments, sorted masked positions and NSP labels,
so the step sees the same shapes and sparsity as real data.
"""

from typing import Iterator

import numpy as np

from bertjax.records import masking
from bertjax.records import schema

FIRST_REGULAR_ID = 5  # Ids below are [PAD] [UNK] [CLS] [SEP] [MASK] in bertjax vocabs.


class SyntheticSource:
  """Same interface as the TFRecord TrainSource: iterate(start_step) -> host batches."""

  def __init__(self, global_batch_size: int, *, max_seq_length: int,
               max_predictions_per_seq: int, vocab_size: int, seed: int,
               process_index: int = 0, process_count: int = 1):
    if global_batch_size % process_count:
      raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                       f"the {process_count} hosts")
    self.batch_size = global_batch_size // process_count
    self.max_seq_length = max_seq_length
    self.max_predictions = max_predictions_per_seq
    self.vocab_size = vocab_size
    self.seed = seed
    self.process_index = process_index

  def batch(self, step: int) -> dict[str, np.ndarray]:
    b, l, p = self.batch_size, self.max_seq_length, self.max_predictions
    rng = np.random.default_rng([self.seed, step, self.process_index])
    lengths = rng.integers(l // 2, l + 1, size=b)
    pos_L = np.arange(l)[None, :]
    input_mask = (pos_L < lengths[:, None]).astype(np.int32)
    ids = rng.integers(FIRST_REGULAR_ID, self.vocab_size, size=(b, l)).astype(np.int32)
    ids[:, 0] = 2
    ids = ids * input_mask
    split = lengths // 2
    segment_ids = ((pos_L >= split[:, None]) & (input_mask > 0)).astype(np.int32)
    # Distinct sorted positions in [1, length - 1) per row.
    scores = rng.random((b, l))
    scores[:, 0] = np.inf
    scores[pos_L >= (lengths[:, None] - 1)] = np.inf
    positions = np.sort(np.argsort(scores, axis=1)[:, :p], axis=1).astype(np.int32)
    num_pred = masking.num_predictions(lengths, 0.15, p)
    weights = (np.arange(p)[None, :] < num_pred[:, None]).astype(np.float32)
    positions = (positions * weights).astype(np.int32)
    masked_ids = np.take_along_axis(ids, positions, axis=1) * weights.astype(np.int32)
    shapes = schema.batch_shapes(b, l, p)
    out = {
        "input_ids": ids, "input_mask": input_mask, "segment_ids": segment_ids,
        "masked_lm_positions": positions, "masked_lm_ids": masked_ids,
        "masked_lm_weights": weights,
        "next_sentence_labels": rng.integers(0, 2, size=b).astype(np.int32),
        schema.EXAMPLE_WEIGHT_KEY: np.ones(b, np.float32),
    }
    return {k: out[k].astype(shapes[k][1]) for k in shapes}

  def stats(self) -> dict[str, int]:
    """As TrainSource.stats(); synthetic batches skip and retry nothing."""
    return {"skipped_records": 0, "read_retries": 0}

  def iterate(self, start_step: int) -> Iterator[dict[str, np.ndarray]]:
    step = start_step
    while True:
      yield self.batch(step)
      step += 1
