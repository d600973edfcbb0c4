"""The steps of one fine-tuning run: training, dev evaluations, checkpoints, preemption.

`FineTuner` holds what changes as the run goes on (the state, its step, the
best dev evaluation so far); `train` moves it to the last step. After each
step, in this order: the log line when due; the dev evaluation when due
(eval_every_steps), which saves the best checkpoint when it is a new best
and may stop the run early; the periodic checkpoint, whose meta carries the
best-so-far and early stopping's count; then the preemption guard, asked
after every step on every host, which saves the current step and stops.
`finish` evaluates the last step, saves it and reports.
"""

import dataclasses
import time
from typing import Any, Callable, Optional

import jax
import ml_collections
from absl import logging

from bertjax.input import device as device_lib
from bertjax.tasks import batches as batches_lib
from bertjax.tasks.best import BestDev
from bertjax.tasks.split import Split
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import optimizer as opt_lib
from bertjax.train import sharding as sharding_lib
from bertjax.train.logger import MetricLogger, window_means
from bertjax.train.preemption import PreemptionGuard
from bertjax.train.step_metrics import StepMetrics

# (state, output_dir or None) -> {dev split: metrics}; prediction files go to output_dir.
Evaluate = Callable[[Any, Optional[str]], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class FineTuningRun:
  """What stays fixed for the run."""
  config: ml_collections.ConfigDict
  num_steps: int
  learning_rate: Callable[[int], float]  # The schedule with this run's peak.
  p_train: Callable[..., Any]
  mesh: jax.sharding.Mesh
  train: Split
  dev: list[Split]
  evaluate: Evaluate
  meta: dict[str, Any]  # What every checkpoint's meta holds (task, head, model, ...).


class FineTuner:
  """The run in progress: its state, step, best dev evaluation and checkpoints."""

  def __init__(self, run: FineTuningRun, state, dropout_rng, *, checkpointer: ckpt_lib.Checkpointer,
               best_checkpointer: Optional[ckpt_lib.Checkpointer], logger: MetricLogger,
               guard: PreemptionGuard, best: BestDev, resumed: Optional[dict[str, Any]]):
    self.run, self.state, self.dropout_rng = run, state, dropout_rng
    self.checkpointer, self.best_checkpointer = checkpointer, best_checkpointer
    self.logger, self.guard, self.best = logger, guard, best
    self.step = int(jax.device_get(state.step))
    self._last_eval: tuple[int, dict[str, Any]] | None = None
    # Non-finite steps are skipped and counted (the counts go on from the
    # checkpoint resumed from); optimizer.max_nonfinite_in_a_row of them in a
    # row stop the run, and non-finite parameters are never saved.
    counts = (resumed or {}).get("nonfinite", {})
    self.metrics = StepMetrics(
        on_nonfinite="Lower --config.optimizer.learning_rate or check the data.",
        max_nonfinite_in_a_row=run.config.optimizer.max_nonfinite_in_a_row,
        skipped=counts.get("skipped_steps", 0), in_a_row=counts.get("nonfinite_in_a_row", 0))
    self._sharding = sharding_lib.batch_sharding(run.mesh)

  def train(self) -> bool:
    """Trains to the last step, or until early stopping; False when stopped (and
    saved) for a preemption."""
    config, num_steps = self.run.config, self.run.num_steps
    if self.best.should_stop():
      return True  # Stopped early before the restart.
    t0 = time.perf_counter()
    for batch in batches_lib.train_batches(self.run.train.arrays, config.global_batch_size,
                                           seed=config.seed, start_step=self.step,
                                           num_steps=num_steps,
                                           buckets=batches_lib.buckets_of(config),
                                           group_batches=config.bucketing.group_batches):
      self.state, metrics = self.run.p_train(
          self.state, device_lib.to_global(batch, self._sharding), self.dropout_rng)
      self.step += 1
      self.metrics.add(self.step, metrics)
      if self.step % config.logging.every_steps == 0 or self.step == num_steps:
        self._log(t0)
        t0 = time.perf_counter()
      if self.step == num_steps:
        break
      if config.eval_every_steps and self.step % config.eval_every_steps == 0:
        self.evaluate(output_dir=None)
        if self.best.should_stop():
          logging.info("Early stopping at step %d: no better dev %s in %d evaluations "
                       "(best %.4f at step %d).", self.step, self.best.metric,
                       self.best.patience, self.best.score or float("nan"),
                       self.best.step or 0)
          return True
        t0 = time.perf_counter()
      if self.step % config.checkpoint.every_steps == 0:
        self.save()
      if self.guard.reached(self.step):
        self.save()  # Nothing is written when this step is saved already.
        self.checkpointer.wait()
        logging.warning("Stopped for preemption at step %d of %d; rerun to resume.",
                        self.step, num_steps)
        return False
    return True

  def finish(self, output_dir: str) -> dict[str, Any]:
    """The dev metrics of the current (last) step, its prediction files in output_dir;
    saves that step with the evaluation in its meta."""
    if (self._last_eval is not None and self._last_eval[0] == self.step
        and not any(split.writes_outputs for split in self.run.dev)):
      dev = self._last_eval[1]
    else:
      dev = self.evaluate(output_dir=output_dir)
    self.save()
    self.checkpointer.wait()
    return dev

  def evaluate(self, output_dir: Optional[str]) -> dict[str, Any]:
    """Dev metrics of the current step, to TensorBoard; saves the best checkpoint when
    they are the best yet and periodic evaluation keeps one."""
    dev = self.run.evaluate(self.state, output_dir)
    self._last_eval = (self.step, dev)
    for name, m in dev.items():
      self.logger.write(self.step, {k: v for k, v in m.items() if k != "num_examples"},
                        prefix=f"dev_{name}")
    if self.best.update(self.step, dev) and self.best_checkpointer is not None:
      logging.info("New best dev %s %.4f at step %d.", self.best.metric, self.best.score,
                   self.step)
      self.best_checkpointer.save(self.state, self.meta())
    return dev

  def meta(self) -> dict[str, Any]:
    return dict(self.run.meta, nonfinite=self.metrics.counts(), best=self.best.to_meta())

  def save(self):
    """Checkpoints the current step (once its metrics are read back and its parameters
    seen to be finite) after the best checkpoint its meta may name is complete."""
    self.metrics.drain_for_save(self.step)
    if self.best_checkpointer is not None:
      self.best_checkpointer.wait()
    self.checkpointer.save(self.state, self.meta())

  def _log(self, t0: float):
    """Averages a window of host metrics, prints them and writes them to TensorBoard,
    with the counts of skipped (non-finite) steps."""
    host = self.metrics.take_window()  # Reads back and counts the skipped steps first.
    m = window_means(host)
    m["learning_rate"] = opt_lib.latest_learning_rate(self.run.learning_rate, self.step)
    m["steps_per_second"] = len(host) / max(time.perf_counter() - t0, 1e-9)
    m.update(self.metrics.counts())
    logging.info("step %d/%d %s", self.step, self.run.num_steps,
                 "  ".join(f"{k} {v:.4g}" for k, v in sorted(m.items())))
    self.logger.write(self.step, m, prefix="train")
