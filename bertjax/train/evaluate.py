"""Held-out evaluation: exact MLM and NSP accuracy over a whole eval split."""

from typing import Iterator

import jax
import numpy as np

from bertjax.records.schema import EXAMPLE_WEIGHT_KEY
from bertjax.train import step as step_lib


class Evaluator:
  """Sums eval_step over batches (padding rows weigh 0) and divides once."""

  def __init__(self, state_shardings, batch_sharding, replicated):
    self._sharding = batch_sharding
    self._step = jax.jit(step_lib.eval_step, in_shardings=(state_shardings, batch_sharding),
                         out_shardings=replicated)

  def run(self, state, host_batches: Iterator[dict[str, np.ndarray]]) -> dict[str, float]:
    totals = None
    target_counts = None
    nsp_counts = np.zeros(2, np.int64)  # Real examples labelled 0 (actual next), 1 (random).
    for batch in host_batches:
      device_batch = {k: jax.make_array_from_process_local_data(self._sharding, v)
                      for k, v in batch.items()}
      sums = self._step(state, device_batch)
      totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
      # Counts of target ids and of NSP labels: the most frequent one's share
      # is the accuracy of always predicting it, the baseline a model must beat.
      real = batch[EXAMPLE_WEIGHT_KEY] > 0
      nsp_counts += np.bincount(batch["next_sentence_labels"][real], minlength=2)[:2]
      ids = batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]
      counts = np.bincount(ids.ravel(), minlength=1)
      if target_counts is None:
        target_counts = counts
      else:
        n = max(len(counts), len(target_counts))
        target_counts = np.pad(target_counts, (0, n - len(target_counts))) + np.pad(
            counts, (0, n - len(counts)))
    if totals is None:
      raise ValueError("evaluation read no batches: the eval files are empty")
    totals = jax.device_get(totals)
    result = step_lib.summarise_eval(totals)
    result["mlm_baseline_accuracy"] = float(target_counts.max() / max(target_counts.sum(), 1))
    result["nsp_baseline_accuracy"] = float(nsp_counts.max() / max(nsp_counts.sum(), 1))
    result["num_examples"] = float(totals["nsp_weight"])
    return result
