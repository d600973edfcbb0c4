"""Held-out evaluation: exact MLM and NSP accuracy over a whole eval split.

Besides the model's figures, the baselines it must beat: the accuracy of
always predicting the most frequent masked token, and the majority NSP
label. Their counts are taken on the devices from the global batch, so on
any number of hosts they are those of the whole eval split.
"""

from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.input import device as device_lib
from bertjax.records.schema import DEFAULT_OBJECTIVE, EXAMPLE_WEIGHT_KEY
from bertjax.train import step as step_lib


def label_counts(batch, vocab_size: int) -> dict[str, jax.Array]:
  """Counts of the real masked-token targets (by id) and NSP labels of a batch."""
  real_mlm = (batch["masked_lm_weights"] > 0).astype(jnp.int32)
  real_nsp = (batch[EXAMPLE_WEIGHT_KEY] > 0).astype(jnp.int32)
  return {
      "target_counts": jnp.zeros([vocab_size], jnp.int32).at[
          batch["masked_lm_ids"].ravel()].add(real_mlm.ravel(), mode="drop"),
      "nsp_counts": jnp.zeros([2], jnp.int32).at[batch["next_sentence_labels"]].add(
          real_nsp, mode="drop"),
  }


class Evaluator:
  """Sums eval_step over batches (padding rows weigh 0) and divides once."""

  def __init__(self, state_shardings, batch_sharding, replicated, *, vocab_size: int,
               objective: str = DEFAULT_OBJECTIVE):
    self._sharding = batch_sharding

    def step(state, batch):
      return (step_lib.eval_step(state, batch, objective=objective),
              label_counts(batch, vocab_size))
    self._step = jax.jit(step, in_shardings=(state_shardings, batch_sharding),
                         out_shardings=replicated)

  def run(self, state, host_batches: Iterator[dict[str, np.ndarray]]) -> dict[str, float]:
    """Evaluates `state` on this host's batches; every host must call it together."""
    totals = None
    for batch in host_batches:
      out = self._step(state, device_lib.to_global(batch, self._sharding))
      totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    if totals is None:
      raise ValueError("evaluation read no batches: the eval files are empty")
    sums, counts = jax.device_get(totals)
    result = step_lib.summarise_eval(sums)
    # The accuracy of always predicting the most frequent target, or label.
    targets, nsp = counts["target_counts"], counts["nsp_counts"]
    result["mlm_baseline_accuracy"] = float(targets.max() / max(targets.sum(), 1))
    result["nsp_baseline_accuracy"] = float(nsp.max() / max(nsp.sum(), 1))
    result["num_examples"] = float(sums["examples"])
    return result
