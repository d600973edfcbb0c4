"""finetune_and_evaluate: one fine-tuning run, and sweep: the paper's grid of them.

A run reads the task's data once, trains num_epochs over the training split
(steps as the original release counts them) with linear warmup over
warmup_proportion of the steps and linear decay to 0, saves orbax
checkpoints (a rerun resumes from the latest; a SIGTERM saves the current
step and stops), evaluates on dev every eval_every_steps keeping the best
checkpoint (and stopping early after early_stopping_patience evaluations
without a better one, if set), logs to TensorBoard and writes the final and
the best dev metrics to WORKDIR/results.json (tasks/trainer.py runs the
steps). The runs of a sweep share one compiled train step and predict step
(sweep_steps.SweepSteps): the peak learning rate is a value in the optimizer state. Starting
weights come
from config.init_from through the injected weights loader
(bertjax.convert.weights.load_weights: a bertjax pretraining checkpoint of any
phase, a Hugging Face BERT directory or the original release's TF1
checkpoint): only the encoder is read, pretraining heads are left out and the
task head is freshly initialised.
"""

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Optional

import jax
import ml_collections
import numpy as np
from absl import logging

from bertjax.input import device as device_lib
from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.tasks import bag_of_words
from bertjax.tasks import batches as batches_lib
from bertjax.tasks import features
from bertjax.tasks import registry
from bertjax.tasks import sweep_steps
from bertjax.tasks import trainer as trainer_lib
from bertjax.tasks.best import BestDev
from bertjax.tasks.split import Split
from bertjax.text import tokenization
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import run_record
from bertjax.train import sharding as sharding_lib
from bertjax.train.cli import quiet_library_logs
from bertjax.train.logger import MetricLogger
from bertjax.train.preemption import PreemptionGuard

# (path, abstract encoder params, model config) -> BertModel's params, e.g.
# bertjax.convert.weights.load_weights; the tasks layer does not import convert.
WeightsLoader = Callable[[str, Any, BertConfig], Any]
RESULTS = "results.json"
CHECKPOINTS = "checkpoints"  # The latest checkpoints, in the run's workdir.
BEST_CHECKPOINT = "best"  # The best dev evaluation's checkpoint, with eval_every_steps.


@dataclasses.dataclass
class Prepared:
  """What every run of a sweep shares: the task, tokenizer, model config and data."""
  task: registry.Task
  tokenizer: tokenization.Tokenizer
  model_config: BertConfig
  train: Split
  dev: list[Split]


def vocab_file(config) -> str:
  """config.vocab_file, else init_from's vocab.txt (Hugging Face and TF1 directories)."""
  if config.vocab_file:
    return config.vocab_file
  candidate = os.path.join(config.init_from, "vocab.txt") if config.init_from else ""
  if candidate and fileio.exists(candidate):
    return candidate
  raise ValueError("--config.vocab_file: give the vocab.txt the model was pretrained "
                   f"with (init_from={config.init_from!r} has no vocab.txt)")


def prepare(config: ml_collections.ConfigDict) -> Prepared:
  """Reads the task's data once. Fills the task's own defaults into `config` first
  (e.g. SQuAD's epochs and batch size per version)."""
  task = registry.get_task(config.task)
  if task.configure is not None:
    task.configure(config)
  tokenizer = tokenization.load_tokenizer(config.tokenizer, vocab_file(config),
                                          config.do_lower_case)
  model_fields = dict(config.model)
  if not model_fields.get("vocab_size"):
    model_fields["vocab_size"] = tokenizer.vocab_size
  model_config = BertConfig.from_mapping(model_fields)
  features.check_vocab(tokenizer, model_config.vocab_size, "--config.model.vocab_size")
  if config.max_seq_length > model_config.max_position_embeddings:
    raise ValueError(f"--config.max_seq_length={config.max_seq_length} exceeds "
                     f"model.max_position_embeddings={model_config.max_position_embeddings}")
  t0 = time.perf_counter()
  train = task.load("train", tokenizer, config)
  dev = [task.load(name, tokenizer, config) for name in task.dev_splits]
  logging.info("Task %s: %d training and %s dev examples, features in %.1fs.", task.name,
               len(train), "/".join(str(len(d)) for d in dev), time.perf_counter() - t0)
  return Prepared(task, tokenizer, model_config, train, dev)


# Per-position outputs past a bucketed batch's length (no token there).
NO_TOKEN_LOGIT = -1e9


def predict(predict_fn, state, split: Split, batch_size: int, sharding,
            buckets: tuple[int, ...] = ()):
  """The model's outputs for every example of `split`, in order (padding dropped).

  Batches are dispatched without waiting; their outputs stay on the devices
  and are read back once at the end, each row put with its example by the
  example id that came back with it (batches.in_example_order), wherever
  the mesh placed it. With `buckets` (batches.bucket_lengths)
  the examples go through sorted by length, each batch cut to its bucket, and
  come back in the split's order; a split with per_position_outputs gets its
  positions past the batch's length filled with NO_TOKEN_LOGIT.
  """
  on_device = [predict_fn(state, device_lib.to_global(batch, sharding))
               for batch in batches_lib.eval_batches(split.arrays, batch_size,
                                                     buckets=buckets)]
  if not on_device:
    raise ValueError(f"split {split.name} has no examples to predict")
  outs, ids = zip(*jax.device_get(on_device))
  if buckets and split.per_position_outputs:
    full = split.arrays["input_ids"].shape[-1]
    outs = [jax.tree.map(lambda x: np.pad(
        x, [(0, 0), (0, full - x.shape[1])] + [(0, 0)] * (x.ndim - 2),
        constant_values=NO_TOKEN_LOGIT), out) for out in outs]
  return batches_lib.in_example_order(list(outs), list(ids), len(split))


def evaluate(predict_fn, state, dev: list[Split], batch_size: int, sharding,
             output_dir: str, buckets: tuple[int, ...] = ()) -> dict:
  """Metrics of every dev split; tasks that write prediction files do so in output_dir."""
  result = {}
  for split in dev:
    outputs = predict(predict_fn, state, split, batch_size, sharding, buckets)
    if split.writes_outputs:
      scores = split.score(outputs, output_dir=output_dir if jax.process_index() == 0 else None)
    else:
      scores = split.score(outputs)
    result[split.name] = dict(scores, num_examples=len(split))
    logging.info("dev [%s] %s", split.name, "  ".join(
        f"{k} {v:.4f}" for k, v in sorted(result[split.name].items())))
  return result


def finetune_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                          weights_loader: Optional[WeightsLoader] = None,
                          prepared: Optional[Prepared] = None,
                          steps: Optional[sweep_steps.SweepSteps] = None) -> dict[str, Any]:
  """Runs (or resumes) one fine-tuning run in `workdir`; returns its results, or
  {"preempted_at_step": step} when a SIGTERM stopped it (saved: rerun to resume)."""
  quiet_library_logs()
  results_path = os.path.join(workdir, RESULTS)
  if fileio.exists(results_path):
    logging.info("%s exists: the run in %s is complete.", results_path, workdir)
    return json.loads(fileio.read_text(results_path))
  prepared = prepared or prepare(config)
  steps = steps or sweep_steps.build_sweep_steps(config, prepared)
  task, num_steps = prepared.task, steps.num_steps
  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, CHECKPOINTS),
                                       keep=config.checkpoint.keep,
                                       async_save=config.checkpoint.async_save)
  best_checkpointer = (ckpt_lib.Checkpointer(
      os.path.join(workdir, BEST_CHECKPOINT), keep=1, async_save=config.checkpoint.async_save)
                       if config.eval_every_steps else None)
  try:
    state, resumed = sweep_steps.initial_state(config, prepared.model_config, steps,
                                              checkpointer, weights_loader)
    sharding = sharding_lib.batch_sharding(steps.mesh)
    peak = config.optimizer.learning_rate
    run = trainer_lib.FineTuningRun(
        config=config, num_steps=num_steps,
        learning_rate=lambda t: peak * float(steps.unit_schedule(t)),
        p_train=steps.p_train, mesh=steps.mesh, train=prepared.train, dev=prepared.dev,
        evaluate=lambda s, out: evaluate(steps.p_predict, s, prepared.dev,
                                         config.eval_batch_size, sharding, out,
                                         batches_lib.buckets_of(config)),
        meta={"task": task.name, "seed": config.seed, "total_steps": num_steps,
              "model": dataclasses.asdict(prepared.model_config),
              "head": {"type": registry.HEAD_TYPES[task.kind], "labels": list(task.labels)}})
    if jax.process_index() == 0:
      # The run record: exports find the vocab through init_from, as for pretraining runs.
      record = json.loads(config.to_json())
      record["model"] = run.meta["model"]
      run_record.write(workdir, record)
    best = BestDev(task.primary, task.dev_splits[0], config.early_stopping_patience,
                   (resumed or {}).get("best"))
    with MetricLogger(workdir, prepared.model_config, num_steps) as logger, \
        PreemptionGuard() as guard, sharding_lib.mesh_context(steps.mesh, steps.rules):
      tuner = trainer_lib.FineTuner(
          run, state, jax.random.fold_in(jax.random.key(config.seed), 1),
          checkpointer=checkpointer, best_checkpointer=best_checkpointer, logger=logger,
          guard=guard, best=best, resumed=resumed)
      if not tuner.train():
        return {"preempted_at_step": tuner.step}
      dev = tuner.finish(workdir)
  finally:
    if best_checkpointer is not None:
      best_checkpointer.close()
    checkpointer.close()
  results = {"task": task.name, "steps": num_steps, "trained_steps": tuner.step,
             "stopped_early": tuner.step < num_steps, "seed": config.seed,
             "learning_rate": config.optimizer.learning_rate,
             "init_from": config.init_from, "num_train_examples": len(prepared.train),
             "primary_metric": task.primary, "dev": dev,
             "best": _best_result(best, workdir, config), **tuner.metrics.counts()}
  if jax.process_index() == 0:
    fileio.write_text(results_path, json.dumps(results, indent=2, sort_keys=True))
  return results


def _best_result(best: BestDev, workdir: str, config) -> Optional[dict[str, Any]]:
  """The best evaluation's step, score, dev metrics and checkpoint; None when every
  score was NaN. Without periodic evaluation the best is the last step's checkpoint."""
  if best.step is None:
    return None
  where = BEST_CHECKPOINT if config.eval_every_steps else CHECKPOINTS
  return {"step": best.step, "score": best.score, "dev": best.dev,
          "checkpoint": os.path.join(workdir, where, str(best.step))}


def prediction_checkpoint(best: Optional[dict[str, Any]], run_workdir: str) -> str:
  """The checkpoint a run's test-set predictions come from: the one that earned its
  best dev score (`best`, a results.json's "best": RUN/best/<step> with periodic
  evaluation, else the last step in RUN/checkpoints), so that predictions go with the
  score a sweep ranks the run by; the run's latest checkpoint when no evaluation
  scored (best is None: every score was NaN)."""
  if best is None:
    logging.warning("No dev evaluation of the run in %s scored (every score NaN): "
                    "predicting with its latest checkpoint.", run_workdir)
    return os.path.join(run_workdir, CHECKPOINTS)
  return best["checkpoint"]


def primary_score(task: registry.Task, results: dict) -> float:
  """The run's best primary score (NaN when it has none: every evaluation was NaN)."""
  del task  # results["best"] holds the task's primary metric on its first dev split.
  best = results.get("best")
  return float(best["score"]) if best else math.nan


def sweep(config: ml_collections.ConfigDict, workdir: str,
          weights_loader: Optional[WeightsLoader] = None) -> dict[str, Any]:
  """Every (learning rate, seed) of config.sweep, each in workdir/lr{lr}_seed{seed};
  results.json holds every run's dev figures and the best run by the task's primary
  metric (each run's best evaluation). All runs call one compiled train step and one
  predict step. Returns {"preempted_at_step": step} when a SIGTERM stopped a run."""
  prepared = prepare(config)
  steps = sweep_steps.build_sweep_steps(config, prepared)
  runs = []
  for lr in config.sweep.learning_rates:
    for seed in config.sweep.seeds:
      run_config = ml_collections.ConfigDict(config.to_dict())
      run_config.optimizer.learning_rate = float(lr)
      run_config.seed = int(seed)
      run_dir = os.path.join(workdir, f"lr{lr:g}_seed{seed}")
      logging.info("Sweep run: learning rate %g, seed %d in %s.", lr, seed, run_dir)
      result = finetune_and_evaluate(run_config, run_dir, weights_loader, prepared, steps)
      if "preempted_at_step" in result:
        return result
      runs.append({"learning_rate": float(lr), "seed": int(seed), "workdir": run_dir,
                   "score": primary_score(prepared.task, result), "dev": result["dev"],
                   "best": result["best"]})
  # A NaN score (a diverged run) ranks below every number.
  best = max(runs, key=lambda r: -math.inf if math.isnan(r["score"]) else r["score"])
  summary = {"task": prepared.task.name, "primary_metric": prepared.task.primary,
             "primary_split": prepared.task.dev_splits[0], "best": best, "runs": runs}
  logging.info("Sweep best: %s %.4f at learning rate %g, seed %d.", prepared.task.primary,
               best["score"], best["learning_rate"], best["seed"])
  if jax.process_index() == 0:
    fileio.write_text(os.path.join(workdir, RESULTS),
                      json.dumps(summary, indent=2, sort_keys=True))
  return summary


def bag_of_words_baseline(prepared: Prepared, seed: int = 0) -> dict[str, Any]:
  """Each dev split's metrics from bag_of_words' baseline, trained on the same
  training rows as fine-tuning (the task's kind must be in bag_of_words.KINDS)."""
  special = prepared.tokenizer.special_ids.values()
  return {split.name: dict(bag_of_words.fit_and_score(
      prepared.task.kind, prepared.task.num_labels, prepared.train, split,
      prepared.tokenizer.vocab_size, special, seed), num_examples=len(split))
          for split in prepared.dev}


def compare_with_random_init(config: ml_collections.ConfigDict, workdir: str,
                             weights_loader: Optional[WeightsLoader] = None) -> dict[str, Any]:
  """Fine-tunes from config.init_from (workdir/pretrained) and from random
  initialisation (workdir/random_init) with the same data, steps and settings;
  results.json holds both runs' final dev figures, the pretrained run's best
  evaluation (pretrained_best) and, for the kinds it covers, the dev figures of
  a bag-of-words baseline trained on the same rows (bag_of_words). Returns
  {"preempted_at_step": step} when a SIGTERM stopped a run."""
  prepared = prepare(config)
  steps = sweep_steps.build_sweep_steps(config, prepared)
  pretrained = finetune_and_evaluate(config, os.path.join(workdir, "pretrained"),
                                     weights_loader, prepared, steps)
  if "preempted_at_step" in pretrained:
    return pretrained
  random_config = ml_collections.ConfigDict(config.to_dict())
  random_config.init_from = ""
  random_init = finetune_and_evaluate(random_config, os.path.join(workdir, "random_init"),
                                      None, prepared, steps)
  if "preempted_at_step" in random_init:
    return random_init
  split = prepared.task.dev_splits[0]
  summary = {"task": prepared.task.name, "primary_metric": prepared.task.primary,
             "primary_split": split, "steps": pretrained["steps"],
             "init_from": config.init_from,
             "pretrained": pretrained["dev"], "random_init": random_init["dev"],
             "pretrained_best": pretrained["best"]}
  line = (f"Dev {prepared.task.primary} on {split}: "
          f"{primary_score(prepared.task, pretrained):.4f} fine-tuned from {config.init_from}, "
          f"{primary_score(prepared.task, random_init):.4f} from random initialisation")
  if prepared.task.kind in bag_of_words.KINDS:
    summary["bag_of_words"] = bag_of_words_baseline(prepared, config.seed)
    line += (f", {summary['bag_of_words'][split][prepared.task.primary]:.4f} from a "
             "bag of words (logistic regression on the same rows' word-piece counts)")
  logging.info("%s.", line)
  if jax.process_index() == 0:
    fileio.write_text(os.path.join(workdir, RESULTS),
                      json.dumps(summary, indent=2, sort_keys=True))
  return summary
