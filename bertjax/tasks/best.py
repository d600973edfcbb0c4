"""The best dev evaluation of a fine-tuning run so far, and early stopping's patience.

The score is the task's primary metric on its first dev split (higher is
better for every task); a NaN score (a diverged run) is never the best. The
state goes into every checkpoint's meta (to_meta) so that a resumed run goes
on with the same best and the same count of evaluations since it.
"""

import math
from typing import Any, Optional


class BestDev:
  """Best-so-far dev figures and the evaluations since them.

  Args:
    metric, split: the task's primary metric and the dev split it is read from.
    patience: evaluations without a better score after which should_stop()
      says stop; 0 never stops.
    saved: the state of a resumed checkpoint's meta (to_meta()), if any.
  """

  def __init__(self, metric: str, split: str, patience: int = 0,
               saved: Optional[dict[str, Any]] = None):
    saved = saved or {}
    self.metric, self.split, self.patience = metric, split, patience
    self.step: Optional[int] = saved.get("step")  # Of the best evaluation; None: none yet.
    self.score: Optional[float] = saved.get("score")
    self.dev: Optional[dict[str, Any]] = saved.get("dev")
    self.evaluated_step: Optional[int] = saved.get("evaluated_step")  # Latest evaluation.
    self.evals_since_best: int = saved.get("evals_since_best", 0)

  def score_of(self, dev: dict[str, Any]) -> float:
    return float(dev[self.split][self.metric])

  def update(self, step: int, dev: dict[str, Any]) -> bool:
    """Counts the evaluation of `step`; True when it is the new best. The evaluation of
    a step already counted (e.g. redone after a resume) changes nothing."""
    if step == self.evaluated_step:
      return False
    self.evaluated_step = step
    score = self.score_of(dev)
    if not math.isnan(score) and (self.score is None or score > self.score):
      self.step, self.score, self.dev = step, score, dev
      self.evals_since_best = 0
      return True
    self.evals_since_best += 1
    return False

  def should_stop(self) -> bool:
    """Whether early stopping ends the run: `patience` evaluations without a better score."""
    return 0 < self.patience <= self.evals_since_best

  def to_meta(self) -> dict[str, Any]:
    return {"step": self.step, "score": self.score, "dev": self.dev,
            "evaluated_step": self.evaluated_step, "evals_since_best": self.evals_since_best}
