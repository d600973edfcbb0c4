"""One phase of training at a time: steps, log windows, checkpoints, evaluation.

`Trainer` holds what changes as the run goes on (the state, its step, the
results of finished phases); `run_phase` moves it through one phase of the
plan. Around each step, in this order: the log line when due; at the
phase's end its evaluation and then its checkpoint (whose metadata carries
that evaluation, so a stop right after it loses nothing); otherwise a
periodic checkpoint and evaluation when due; then the preemption guard,
asked after every step on every host.
"""

import dataclasses
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.experimental import multihost_utils

from bertjax.input import device as device_lib
from bertjax.input import evaluation
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import evaluate as eval_lib
from bertjax.train import optimizer as opt_lib
from bertjax.train import profiling
from bertjax.train import run_config
from bertjax.train import sharding as sharding_lib
from bertjax.train import step as step_lib
from bertjax.train.logger import MetricLogger
from bertjax.train.preemption import PreemptionGuard
from bertjax.train.step_metrics import StepMetrics


@dataclasses.dataclass(frozen=True)
class PretrainingRun:
  """What stays fixed for the whole run."""
  config: ml_collections.ConfigDict
  model_config: BertConfig
  plan: list[run_config.Phase]
  schedule: optax.Schedule
  mesh: jax.sharding.Mesh
  # (config, phase, model_config) -> a source with iterate(data_step) and,
  # optionally, stats() -> dict[str, int].
  make_source: Callable[..., Any]


def source_stats(source) -> dict[str, int]:
  """The source's counters (skipped records, read retries, ...), if it keeps any."""
  stats = getattr(source, "stats", None)
  return {k: int(v) for k, v in stats().items()} if callable(stats) else {}


def sum_over_hosts(counts: dict[str, int]) -> dict[str, int]:
  """`counts` added up over all processes (a collective: every host calls it)."""
  if jax.process_count() == 1 or not counts:
    return dict(counts)
  keys = sorted(counts)
  gathered = multihost_utils.process_allgather(
      np.asarray([counts[k] for k in keys], np.int64))
  return dict(zip(keys, (int(x) for x in np.asarray(gathered).sum(axis=0))))


class Trainer:
  """The run in progress: its state, step and finished phases' results."""

  def __init__(self, run: PretrainingRun, state, shardings, dropout_rng, *,
               checkpointer: ckpt_lib.Checkpointer, logger: MetricLogger,
               guard: PreemptionGuard, finished_phases: dict[str, Any],
               profile: profiling.ProfileWindow | None = None,
               nonfinite: dict[str, int] | None = None):
    self.run, self.state, self.dropout_rng = run, state, dropout_rng
    self.checkpointer, self.logger, self.guard = checkpointer, logger, guard
    self.profile = profile or profiling.ProfileWindow(0, 0, "")
    self._step_flops: dict[str, float | None] = {}  # Per phase, from XLA (None: analytic).
    self.phases: dict[str, Any] = dict(finished_phases)
    self.step = int(jax.device_get(state.step))
    # `nonfinite`: StepMetrics.counts() of the checkpoint resumed from, so that
    # the counts of skipped steps go on across restarts.
    nonfinite = nonfinite or {}
    self.metrics = StepMetrics(
        on_nonfinite=("Lower optimizer.learning_rate, check the data, or resume from the "
                      f"last checkpoint in {checkpointer.directory}."),
        max_nonfinite_in_a_row=run.config.optimizer.max_nonfinite_in_a_row,
        skipped=nonfinite.get("skipped_steps", 0),
        in_a_row=nonfinite.get("nonfinite_in_a_row", 0))
    self._batch_sharding = sharding_lib.batch_sharding(run.mesh)
    self._jit_steps(shardings)

  def _jit_steps(self, shardings):
    """The jitted train and eval steps for the state's model (`shardings` carries it)."""
    run = self.run
    self._shardings = shardings
    self._p_train = step_lib.jit_train_step(
        shardings, run.mesh, objective=run.config.objective,
        grad_accum_steps=run.config.optimizer.grad_accum_steps)
    self._evaluator = eval_lib.Evaluator(shardings, self._batch_sharding,
                                         sharding_lib.replicated(run.mesh),
                                         vocab_size=run.model_config.vocab_size,
                                         objective=run.config.objective)

  def _use_model_of(self, phase: run_config.Phase):
    """The phase's model (its own remat policy, if any; the same parameters)."""
    apply_fn = BertForPreTraining(phase.model_config(self.run.model_config)).apply
    if apply_fn != self.state.apply_fn:
      self.state = self.state.replace(apply_fn=apply_fn)
      self._jit_steps(self._shardings.replace(apply_fn=apply_fn))

  def run_phase(self, phase: run_config.Phase) -> bool:
    """Trains to the phase's end; False when stopped (and saved) for a preemption."""
    config = self.run.config
    logging.info("Phase %s: steps %d-%d, length %d, %d predictions, batch %d.",
                 phase.name, phase.start, phase.end, phase.max_seq_length,
                 phase.max_predictions_per_seq, phase.global_batch_size)
    source = self.run.make_source(config, phase, self.run.model_config)
    self._use_model_of(phase)
    batches = device_lib.prefetch_to_device(source.iterate(self.step - phase.start),
                                            self._batch_sharding, config.data.prefetch)
    self.logger.start_window(self.step)
    try:
      while self.step < phase.end:
        batch = next(batches)
        if phase.name not in self._step_flops:
          self._step_flops[phase.name] = self._compiled_flops(batch)
        self.profile.before_step(self.step)
        self.state, metrics = self._p_train(self.state, batch, self.dropout_rng)
        self.profile.after_step(self.step, metrics)
        self.step += 1
        self.metrics.add(self.step, metrics)
        if self.step % config.logging.every_steps == 0 or self.step == phase.end:
          self._log(phase, source)
        if self.step == phase.end:
          self._finish_phase(phase, source)
        else:
          self._periodic(phase)
        # After the last step the run is complete: nothing to stop.
        if self.guard.reached(self.step) and self.step < self.run.plan[-1].end:
          return self._stop_for_preemption(phase)
    finally:
      self.profile.stop()
      batches.close()
    return True

  def _compiled_flops(self, batch) -> float | None:
    """XLA's FLOPs of one step per device where it counts the whole step and
    the chip's peak is known, else None (utilisation then uses the analytic
    count, or has none); one extra compile a phase."""
    if not self.logger.peak or not profiling.complete_count(
        self.run.model_config, self.run.config.optimizer.grad_accum_steps):
      return None
    compiled = self._p_train.lower(self.state, batch, self.dropout_rng).compile()
    return profiling.whole_step_flops(compiled)

  def _log(self, phase, source):
    window = self.metrics.take_window()  # Reads back and counts the skipped steps first.
    self.logger.log_train(self.step, phase, window,
                          opt_lib.latest_learning_rate(self.run.schedule, self.step),
                          data_stats=sum_over_hosts(source_stats(source)),
                          compiled_step_flops=self._step_flops.get(phase.name),
                          nonfinite=self.metrics.counts(),
                          row_slots=run_config.row_slots(self.run.config, phase))

  def _periodic(self, phase):
    config = self.run.config
    if self.step % config.checkpoint.every_steps == 0:
      self.save()
    if (config.logging.eval_every_steps and phase.eval_files
        and self.step % config.logging.eval_every_steps == 0):
      self.logger.write(self.step, self.evaluate(phase), prefix="eval")

  def _finish_phase(self, phase, source):
    result: dict[str, Any] = {"steps": phase.num_steps}
    data = sum_over_hosts(source_stats(source))
    if data:
      result["data"] = data
    if phase.eval_files:
      result["eval"] = self.evaluate(phase)
      self.logger.write(self.step, result["eval"], prefix=f"eval_{phase.name}")
    self.phases[phase.name] = result
    self.save()

  def _stop_for_preemption(self, phase) -> bool:
    self.save()  # Nothing is written when this step is saved already.
    self.wait_for_saves()
    logging.warning("Stopped for preemption at step %d (phase %s); rerun to resume.",
                    self.step, phase.name)
    return False

  def meta(self) -> dict[str, Any]:
    """The checkpoint's metadata: where the data stands and what is done."""
    config, step = self.run.config, self.step
    phase = run_config.phase_at(self.run.plan, step)
    return {"phase": phase.name, "phase_index": phase.index,
            "data_step": step - phase.start, "seed": config.seed,
            "rng": ckpt_lib.rng_to_json(self.dropout_rng),
            "total_steps": config.total_steps,
            "model": dataclasses.asdict(self.run.model_config), "phases": self.phases,
            "nonfinite": self.metrics.counts()}

  def save(self):
    """Checkpoints the current step once its metrics are read back and its parameters
    seen to be finite (skipped steps counted, StepMetrics.drain_for_save)."""
    self.metrics.drain_for_save(self.step)
    with self.logger.clock.measure("checkpoint"):
      self.checkpointer.save(self.state, self.meta())

  def wait_for_saves(self):
    with self.logger.clock.measure("checkpoint"):
      self.checkpointer.wait()

  def evaluate(self, phase) -> dict[str, float]:
    config = self.run.config
    with self.logger.clock.measure("eval"):
      batches = evaluation.eval_batches(
          phase.eval_files, phase.global_batch_size, max_seq_length=phase.max_seq_length,
          max_predictions_per_seq=phase.max_predictions_per_seq,
          process_index=jax.process_index(), process_count=jax.process_count(),
          max_batches=config.logging.eval_batches or None,
          skip_corrupt=config.data.skip_corrupt, vocab_size=self.run.model_config.vocab_size,
          packing=run_config.packing_options(config, phase))
      result = self._evaluator.run(self.state, batches)
      # The eval input's counters (e.g. skipped_records), over all hosts.
      result.update(sum_over_hosts(source_stats(batches)))
    logging.info("eval [%s] %s", phase.name,
                 "  ".join(f"{k} {v:.4f}" for k, v in sorted(result.items())))
    return result

  def num_parameters(self) -> int:
    return int(sum(x.size for x in jax.tree.leaves(self.state.params)))
