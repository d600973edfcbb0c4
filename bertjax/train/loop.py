"""train_and_evaluate: the pretraining run through all phases, with resume.

One call runs the whole schedule: each phase (e.g. 128 then 512) with its
own batch size and files, one learning-rate schedule across them, periodic
async checkpoints, held-out evaluation at phase ends, and a clean save on
preemption. Restarting with the same workdir resumes from the latest
complete checkpoint, in the right phase at the right data position.
"""

import dataclasses
import json
import os
import signal
import threading
from typing import Any, Callable, Optional

import jax
import ml_collections
from absl import logging

from bertjax.input import pipeline
from bertjax.input.synthetic import SyntheticSource
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.records import schema
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import evaluate as eval_lib
from bertjax.train import optimizer as opt_lib
from bertjax.train import run_config
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib
from bertjax.train.logger import MetricLogger, first_nonfinite, quiet_library_logs

# (path, abstract params, model config) -> params, for config.init_from, e.g.
# bertjax.convert.weights.load_weights (bertjax checkpoints and Hugging Face
# model directories; the train layer does not import the convert layer).
WeightsLoader = Callable[[str, Any, BertConfig], Any]


# Steps dispatched but not finished; enough to keep the devices busy.
_MAX_STEPS_IN_FLIGHT = 2


class NonFiniteError(FloatingPointError):
  pass


def _data_vocab_size(config) -> Optional[int]:
  """The vocab size in the first phase's metadata.json, if there is one."""
  if config.data.source != "tfrecord":
    return None
  first = next(iter(config.phases.values()))
  meta = schema.read_metadata(os.path.dirname(first.train_files))
  return meta.vocab_size if meta else None


def _train_source(config, phase, model_config: BertConfig):
  if config.data.source == "synthetic":
    return SyntheticSource(
        phase.global_batch_size, max_seq_length=phase.max_seq_length,
        max_predictions_per_seq=phase.max_predictions_per_seq,
        vocab_size=model_config.vocab_size, seed=config.seed + phase.index,
        process_index=jax.process_index(), process_count=jax.process_count())
  masking = ({"masked_lm_prob": config.data.masked_lm_prob}
             if config.data.dynamic_masking else None)
  return pipeline.TrainSource(
      phase.train_files, phase.global_batch_size, max_seq_length=phase.max_seq_length,
      max_predictions_per_seq=phase.max_predictions_per_seq,
      seed=config.seed + phase.index, process_index=jax.process_index(),
      process_count=jax.process_count(), skip_corrupt=config.data.skip_corrupt,
      dynamic_masking=masking, order=config.data.order,
      shuffle_block=config.data.shuffle_block, vocab_size=model_config.vocab_size,
      vocab_hash=config.data.vocab_hash or None)


class _Preemption:
  """SIGTERM sets a flag that the loop reads between steps."""

  def __init__(self):
    self.requested = threading.Event()
    self._previous = None
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM: saving a checkpoint and stopping after this step.")
    self.requested.set()

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       weights_loader: Optional[WeightsLoader] = None) -> dict[str, Any]:
  """Runs (or resumes) pretraining in `workdir`; returns the final summary."""
  quiet_library_logs()
  vocab_size = config.model.vocab_size or _data_vocab_size(config)
  if not vocab_size:
    raise run_config.ConfigError("--config.model.vocab_size: 0 means 'from the data', "
                                 "but the first phase's data has no metadata.json")
  model_config = run_config.validate(config, num_devices=jax.device_count(),
                                     process_count=jax.process_count(),
                                     vocab_size=vocab_size)
  plan = run_config.phases(config)
  mesh = sharding_lib.make_mesh(config.mesh)
  rules = sharding_lib.rules(config.mesh)
  model = BertForPreTraining(model_config)
  schedule = opt_lib.learning_rate_schedule(
      config.optimizer, config.total_steps, [p.start for p in plan] + [plan[-1].end],
      [p.warmup_steps for p in plan])
  tx = opt_lib.make_optimizer(config.optimizer, schedule)
  rng = jax.random.key(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)

  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                       keep=config.checkpoint.keep,
                                       async_save=config.checkpoint.async_save)
  summary_path = os.path.join(workdir, "summary.json")
  latest = checkpointer.latest_step()
  if latest is not None and latest >= config.total_steps and _exists(summary_path):
    logging.info("The run in %s is complete (step %d of %d); nothing to do.",
                 workdir, latest, config.total_steps)
    checkpointer.close()
    return _read_json(summary_path)

  try:
    state, shardings, dropout_rng, resumed_meta = _initial_state(
        config, model, tx, mesh, rules, checkpointer, latest, init_rng, dropout_rng,
        model_config, weights_loader)
  except BaseException:
    checkpointer.close()
    raise

  logger = MetricLogger(workdir, model_config, config.total_steps,
                        config.logging.peak_tflops)
  preemption = _Preemption()
  batch_sharding = sharding_lib.batch_sharding(mesh)
  replicated = sharding_lib.replicated(mesh)
  p_train = step_lib.jit_train_step(
      shardings, mesh, grad_accum_steps=config.optimizer.grad_accum_steps)
  evaluator = eval_lib.Evaluator(shardings, batch_sharding, replicated)
  # Phases finished before a resume keep their results in the checkpoint.
  summary: dict[str, Any] = {"phases": dict((resumed_meta or {}).get("phases", {}))}

  def meta_for(step):
    phase = run_config.phase_at(plan, step)
    return {"phase": phase.name, "phase_index": phase.index,
            "data_step": step - phase.start, "seed": config.seed,
            "rng": ckpt_lib.rng_to_json(dropout_rng), "total_steps": config.total_steps,
            "model": dataclasses.asdict(model_config), "phases": summary["phases"]}

  step = int(jax.device_get(state.step))
  pending: list[tuple[int, dict]] = []

  def drain(window: list):
    host = jax.device_get([m for _, m in pending])
    bad = first_nonfinite(list(zip([s for s, _ in pending], host)))
    if bad is not None:
      raise NonFiniteError(
          f"non-finite loss or gradient at step {bad}; the state of step {bad - 1} is "
          f"kept and nothing later is checkpointed. Lower optimizer.learning_rate, check "
          f"the data, or resume from the last checkpoint in {checkpointer.directory}.")
    window.extend(host)
    pending.clear()

  def save(step):
    window: list = []
    drain(window)
    checkpointer.save(state, meta_for(step))
    return window

  def preempted(step) -> bool:
    """Saves and says so when a preemption was announced (a sync point on every host)."""
    if not (preemption.requested.is_set() or checkpointer.reached_preemption(step)):
      return False
    save(step)
    checkpointer.wait()
    logging.warning("Stopped for preemption at step %d; rerun to resume.", step)
    return True

  try:
    with sharding_lib.mesh_context(mesh, rules):
      for phase in plan:
        if step >= phase.end:
          continue
        logging.info("Phase %s: steps %d-%d, length %d, %d predictions, batch %d.",
                     phase.name, phase.start, phase.end, phase.max_seq_length,
                     phase.max_predictions_per_seq, phase.global_batch_size)
        source = _train_source(config, phase, model_config)
        batches = pipeline.prefetch_to_device(
            source.iterate(step - phase.start), batch_sharding, config.data.prefetch)
        window: list[dict] = []
        logger.start_window(step)
        try:
          while step < phase.end:
            state, metrics = p_train(state, next(batches), dropout_rng)
            pending.append((step + 1, metrics))
            if len(pending) > _MAX_STEPS_IN_FLIGHT:
              # Dispatch is asynchronous: without this wait the loop would run
              # up to a logging interval ahead of the devices, and a
              # preemption would be acted on only when they caught up.
              jax.block_until_ready(pending[-1 - _MAX_STEPS_IN_FLIGHT][1]["loss"])
            step += 1
            if step % config.logging.every_steps == 0 or step == phase.end:
              drain(window)
              logger.log_train(step, phase, window, float(schedule(step - 1)))
              window = []
            if step == phase.end:
              break  # The phase's own save and evaluation follow.
            if step % config.checkpoint.every_steps == 0:
              window.extend(save(step))
            if (config.logging.eval_every_steps and phase.eval_files
                and step % config.logging.eval_every_steps == 0):
              logger.write(step, _evaluate(evaluator, config, phase, state), prefix="eval")
            if preempted(step):
              return {"preempted_at_step": step}
        finally:
          batches.close()
        save(step)
        phase_summary = {"steps": phase.num_steps}
        if phase.eval_files:
          phase_summary["eval"] = _evaluate(evaluator, config, phase, state)
          logger.write(step, phase_summary["eval"], prefix=f"eval_{phase.name}")
        summary["phases"][phase.name] = phase_summary
        if step < plan[-1].end and preempted(step):
          return {"preempted_at_step": step}
  finally:
    checkpointer.close()
    logger.close()
    preemption.restore()

  summary.update(step=step, total_steps=config.total_steps,
                 num_parameters=int(sum(x.size for x in jax.tree.leaves(state.params))))
  _log_summary(summary)
  if jax.process_index() == 0:
    _write_json(summary_path, summary)
  return summary


def _initial_state(config, model, tx, mesh, rules, checkpointer, latest, init_rng,
                   dropout_rng, model_config, weights_loader):
  """The state to start from: the latest checkpoint, init_from's weights or a fresh init.

  A resumed run reads its state straight into the abstract (sharded) state,
  and init_from reads its weights before anything is initialised. Returns
  (state, its shardings, the run's dropout key, the resumed checkpoint's meta
  or None).
  """
  abstract, shardings = state_lib.abstract_train_state(model, tx, mesh, rules)
  if latest is not None:
    state, meta = checkpointer.restore(abstract, shardings, latest)
    logging.info("Resumed from the checkpoint at step %d (phase %s, data step %d).",
                 latest, meta["phase"], meta["data_step"])
    return state, shardings, ckpt_lib.rng_from_json(meta["rng"]), meta
  if config.init_from:
    if weights_loader is None:
      raise ValueError("--config.init_from: pass train_and_evaluate a weights_loader, e.g. "
                       "bertjax.convert.weights.load_weights as bertjax.main does")
    params = weights_loader(config.init_from, abstract.params, model_config)
    state, shardings = state_lib.create_train_state(model, tx, mesh, rules, init_rng,
                                                    params=params)
    logging.info("Started from the weights in %s at step 0.", config.init_from)
    return state, shardings, dropout_rng, None
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, init_rng)
  logging.info("Started from a fresh initialisation (seed %d).", config.seed)
  return state, shardings, dropout_rng, None


def _evaluate(evaluator, config, phase, state) -> dict[str, float]:
  batches = pipeline.eval_batches(
      phase.eval_files, phase.global_batch_size, max_seq_length=phase.max_seq_length,
      max_predictions_per_seq=phase.max_predictions_per_seq,
      process_index=jax.process_index(), process_count=jax.process_count(),
      max_batches=config.logging.eval_batches or None,
      skip_corrupt=config.data.skip_corrupt)
  result = evaluator.run(state, batches)
  logging.info("eval [%s] %s", phase.name,
               "  ".join(f"{k} {v:.4f}" for k, v in sorted(result.items())))
  return result


def _log_summary(summary):
  logging.info("Finished at step %d of %d.", summary["step"], summary["total_steps"])
  for name, p in summary["phases"].items():
    if "eval" in p:
      e = p["eval"]
      logging.info("  %s: held-out MLM accuracy %.4f (most-frequent-token baseline %.4f), "
                   "NSP accuracy %.4f (majority-label baseline %.4f), loss %.4f", name,
                   e["mlm_accuracy"], e["mlm_baseline_accuracy"], e["nsp_accuracy"],
                   e["nsp_baseline_accuracy"], e["loss"])


def _exists(path):
  if "://" in path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.exists(path)
  return os.path.exists(path)


def _read_json(path):
  with schema._open(path, "r") as f:  # pylint: disable=protected-access
    return json.load(f)


def _write_json(path, obj):
  with schema._open(path, "w") as f:  # pylint: disable=protected-access
    f.write(json.dumps(obj, indent=2, sort_keys=True))
