"""train_and_evaluate: the pretraining run through all phases, with resume.

One call runs the whole schedule: each phase (e.g. 128 then 512) with its
own batch size and files, one learning-rate schedule across them, periodic
async checkpoints, held-out evaluation at phase ends, and a clean save on
preemption (one step on every host). Restarting with the same workdir
resumes from the latest complete checkpoint, in the right phase at the right
data position, once the config is found to be the run's own (run_record).
"""

import json
import os
from typing import Any, Optional

import jax
import ml_collections
from absl import logging

from bertjax.input import pipeline
from bertjax.input.synthetic import SyntheticSource
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.records import schema
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import optimizer as opt_lib
from bertjax.train import profiling
from bertjax.train import run_config
from bertjax.train import run_record
from bertjax.train import sharding as sharding_lib
from bertjax.train import starting_state
from bertjax.train.cli import quiet_library_logs
from bertjax.train.logger import MetricLogger, RunClock
from bertjax.train.preemption import PreemptionGuard
from bertjax.train.starting_state import WeightsLoader
from bertjax.train.trainer import PretrainingRun, Trainer


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
      vocab_hash=config.data.vocab_hash or None,
      packing=run_config.packing_options(config, phase))


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       weights_loader: Optional[WeightsLoader] = None) -> dict[str, Any]:
  """Runs (or resumes) pretraining in `workdir`; returns the final summary.

  `weights_loader` reads `config.init_from` (start.WeightsLoader), e.g.
  bertjax.convert.weights.load_weights, which reads bertjax checkpoints,
  Hugging Face model directories and the original release's TF1 checkpoints.
  """
  quiet_library_logs()
  clock = RunClock()  # Wall time from here: goodput counts startup and restore too.
  run, model, tx, recorded = _setup(config)
  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                       keep=config.checkpoint.keep,
                                       async_save=config.checkpoint.async_save)
  try:
    latest = checkpointer.latest_step()
    if latest is not None:
      run_record.check_resume(workdir, recorded, config)
    summary_path = os.path.join(workdir, "summary.json")
    if latest is not None and latest >= config.total_steps and fileio.exists(summary_path):
      logging.info("The run in %s is complete (step %d of %d); nothing to do.",
                   workdir, latest, config.total_steps)
      return json.loads(fileio.read_text(summary_path))
    start = starting_state.initial_state(
        model, tx, run.mesh, sharding_lib.rules(config.mesh), seed=config.seed,
        sources=starting_state.Sources(checkpointer, latest, config.init_from, weights_loader))
    run_record.check_position(run.plan, latest or 0, start.meta)
    if jax.process_index() == 0:
      run_record.write(workdir, recorded)
    with MetricLogger(workdir, run.model_config, config.total_steps,
                      config.logging.peak_tflops, clock,
                      config.optimizer.grad_accum_steps) as logger, PreemptionGuard() as guard:
      trainer = Trainer(run, start.state, start.shardings, start.dropout_rng,
                        checkpointer=checkpointer, logger=logger, guard=guard,
                        finished_phases=(start.meta or {}).get("phases", {}),
                        nonfinite=(start.meta or {}).get("nonfinite"),
                        profile=profiling.ProfileWindow(*config.logging.profile_steps,
                                                        logdir=f"{workdir}/tensorboard"))
      with sharding_lib.mesh_context(run.mesh, sharding_lib.rules(config.mesh)):
        for phase in run.plan:
          if trainer.step < phase.end and not trainer.run_phase(phase):
            return {"preempted_at_step": trainer.step}
      trainer.wait_for_saves()
      summary = _summary(trainer, logger)
  finally:
    checkpointer.close()
  _log_summary(summary)
  if jax.process_index() == 0:
    fileio.write_text(summary_path, json.dumps(summary, indent=2, sort_keys=True))
  return summary


def _setup(config) -> tuple[PretrainingRun, BertForPreTraining, Any, dict[str, Any]]:
  """Checks the config (before anything compiles) and builds the run's fixed pieces."""
  vocab_size = config.model.vocab_size or _data_vocab_size(config)
  if not vocab_size:
    raise run_config.ConfigError("--config.model.vocab_size: 0 means 'from the data', "
                                 "but the first phase's data has no metadata.json")
  model_config = run_config.validate(config, num_devices=jax.device_count(),
                                     process_count=jax.process_count(),
                                     vocab_size=vocab_size, platform=jax.default_backend(),
                                     num_slices=len(sharding_lib.device_slices(
                                         jax.devices(), config.mesh)[0]))
  plan = run_config.phases(config)
  if config.data.source == "tfrecord":
    # The records must be made for the objective (their metadata.json), and the
    # held-out records for one it can be scored on (schema.EVAL_OBJECTIVES).
    for p in plan:
      for field, files, predictions in (("train_files", p.train_files,
                                         p.max_predictions_per_seq),
                                        ("eval_files", p.eval_files, None)):
        if not files:
          continue
        try:
          pipeline.check_metadata(files, max_seq_length=p.max_seq_length,
                                  max_predictions_per_seq=predictions,
                                  objective=config.objective,
                                  evaluation=field == "eval_files")
        except ValueError as e:
          raise run_config.ConfigError(f"--config.phases.{p.name}.{field}: {e}") from None
  schedule = opt_lib.learning_rate_schedule(
      config.optimizer, config.total_steps, [p.start for p in plan] + [plan[-1].end],
      [p.warmup_steps for p in plan])
  run = PretrainingRun(config, model_config, plan, schedule, sharding_lib.make_mesh(config.mesh),
            _train_source)
  recorded = run_record.record(config, model_config, jax.process_count())
  return (run, BertForPreTraining(model_config),
          opt_lib.make_optimizer(config.optimizer, schedule), recorded)


def _summary(trainer: Trainer, logger: MetricLogger) -> dict[str, Any]:
  summary = {"phases": trainer.phases, "step": trainer.step,
             "total_steps": trainer.run.config.total_steps,
             "num_parameters": trainer.num_parameters(), "time": logger.clock.summary(),
             # Steps whose update was skipped as non-finite, over the whole run
             # (checkpoints carry the counts), and how many of them end it in a row.
             **trainer.metrics.counts()}
  data = {}
  for p in trainer.phases.values():
    for k, v in p.get("data", {}).items():
      data[k] = data.get(k, 0) + v
  if data:
    # Summed over hosts and phases; each phase's as counted by the processes
    # that finished it (a phase resumed midway counts from the resume).
    summary["data"] = data
  return summary


def _log_summary(summary):
  t = summary["time"]
  logging.info("Finished at step %d of %d. This process: %.0f s, of which training "
               "steps %.0f s (goodput %.1f%%), checkpoints %.0f s, evaluation %.0f s.",
               summary["step"], summary["total_steps"], t["wall_seconds"],
               t["step_seconds"], 100 * t["goodput"], t["checkpoint_seconds"],
               t["eval_seconds"])
  if summary["skipped_steps"]:
    logging.info("  %d steps were skipped for a non-finite loss or gradient.",
                 summary["skipped_steps"])
  if summary.get("data"):
    logging.info("  input (all hosts): %s", "  ".join(
        f"{k} {v}" for k, v in sorted(summary["data"].items())))
  for name, p in summary["phases"].items():
    if "eval" in p:
      e = p["eval"]
      logging.info("  %s: held-out MLM accuracy %.4f (most-frequent-token baseline %.4f), "
                   "NSP accuracy %.4f (majority-label baseline %.4f), loss %.4f", name,
                   e["mlm_accuracy"], e["mlm_baseline_accuracy"], e["nsp_accuracy"],
                   e["nsp_baseline_accuracy"], e["loss"])
