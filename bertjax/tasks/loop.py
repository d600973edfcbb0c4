"""finetune_and_evaluate: one fine-tuning run, and sweep: the paper's grid of them.

A run reads the task's data once, trains num_epochs over the training split
(steps as the original release counts them) with linear warmup over
warmup_proportion of the steps and linear decay to 0, saves orbax
checkpoints (a rerun resumes from the latest), logs to TensorBoard and
writes the final dev metrics to WORKDIR/results.json. Starting weights come
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
import optax
from absl import logging

from bertjax.input import pipeline
from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.tasks import batches as batches_lib
from bertjax.tasks import features
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.tasks.split import Split
from bertjax.text import tokenization
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import optimizer as opt_lib
from bertjax.train import run_record
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train.logger import MetricLogger, quiet_library_logs, window_means
from bertjax.train.step_metrics import StepMetrics

# (path, abstract encoder params, model config) -> BertModel's params, e.g.
# bertjax.convert.weights.load_weights; the tasks layer does not import convert.
WeightsLoader = Callable[[str, Any, BertConfig], Any]
RESULTS = "results.json"


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


def _schedule(config, num_steps: int) -> optax.Schedule:
  opt = ml_collections.ConfigDict(config.optimizer.to_dict())
  opt.warmup_steps = int(round(config.warmup_proportion * num_steps))
  opt.end_learning_rate = 0.0
  opt.per_phase_warmup = False
  return opt_lib.learning_rate_schedule(opt, num_steps, [0, num_steps], [0])


def _initial_state(config, prepared, model, tx, mesh, rules, checkpointer, init,
                   weights_loader):
  """(state, shardings, meta of the resumed checkpoint or None)."""
  rng = jax.random.key(config.seed)
  abstract, shardings = state_lib.abstract_train_state(model, tx, mesh, rules, init)
  latest = checkpointer.latest_step()
  if latest is not None:
    state, meta = checkpointer.restore(abstract, shardings, latest)
    logging.info("Resumed fine-tuning from step %d.", latest)
    return state, shardings, meta
  params = None
  if config.init_from:
    if weights_loader is None:
      raise ValueError("--config.init_from: pass a weights_loader, e.g. "
                       "bertjax.convert.weights.load_weights as bertjax.finetune does")
    encoder = weights_loader(config.init_from, abstract.params["bert"],
                             prepared.model_config)
    fresh = jax.jit(lambda r: jax.tree.map(
        lambda x: x.unbox() if hasattr(x, "unbox") else x, init(model, r),
        is_leaf=lambda x: hasattr(x, "unbox")), out_shardings=shardings.params)(rng)
    params = dict(fresh, bert=encoder)
    logging.info("Encoder from %s; %s head freshly initialised.", config.init_from,
                 "/".join(k for k in fresh if k != "bert"))
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, rng,
                                                  params=params, init=init)
  return state, shardings, None


def predict(predict_fn, state, split: Split, batch_size: int, sharding):
  """The model's outputs for every example of `split`, in order (padding dropped)."""
  n = len(split)
  outs = []
  for batch in batches_lib.eval_batches(split.arrays, batch_size):
    outs.append(jax.device_get(predict_fn(state, pipeline.to_global(batch, sharding))))
  return jax.tree.map(lambda *xs: np.concatenate(xs)[:n], *outs)


def evaluate(predict_fn, state, dev: list[Split], batch_size: int, sharding,
             output_dir: str) -> dict:
  """Metrics of every dev split; tasks that write prediction files do so in output_dir."""
  result = {}
  for split in dev:
    outputs = predict(predict_fn, state, split, batch_size, sharding)
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
                          prepared: Optional[Prepared] = None) -> dict[str, Any]:
  """Runs (or resumes) one fine-tuning run in `workdir`; returns its results."""
  quiet_library_logs()
  results_path = os.path.join(workdir, RESULTS)
  if fileio.exists(results_path):
    logging.info("%s exists: the run in %s is complete.", results_path, workdir)
    return json.loads(fileio.read_text(results_path))
  prepared = prepared or prepare(config)
  task, train = prepared.task, prepared.train
  num_steps = max(1, batches_lib.train_steps(len(train), config.global_batch_size,
                                             config.num_epochs))
  schedule = _schedule(config, num_steps)
  tx = opt_lib.make_optimizer(config.optimizer, schedule, frozen=task.frozen)
  mesh = sharding_lib.make_mesh(config.mesh)
  rules = sharding_lib.rules(config.mesh)
  model = registry.model_for(task, prepared.model_config, config)
  init = registry.init_fn(task, config.max_seq_length)
  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                       keep=config.checkpoint.keep,
                                       async_save=config.checkpoint.async_save)
  logger = None
  try:
    state, shardings, resumed = _initial_state(config, prepared, model, tx, mesh, rules,
                                               checkpointer, init, weights_loader)
    logger = MetricLogger(workdir, prepared.model_config, num_steps)
    p_train, p_predict = step_lib.jit_steps(shardings, mesh, task.kind)
    sharding = sharding_lib.batch_sharding(mesh)
    dropout_rng = jax.random.fold_in(jax.random.key(config.seed), 1)
    meta = {"task": task.name, "seed": config.seed, "total_steps": num_steps,
            "model": dataclasses.asdict(prepared.model_config),
            "head": {"type": registry.HEAD_TYPES[task.kind], "labels": list(task.labels)}}
    if jax.process_index() == 0:
      # The run record: exports find the vocab through init_from, as for pretraining runs.
      record = json.loads(config.to_json())
      record["model"] = meta["model"]
      run_record.write(workdir, record)
    step = int(jax.device_get(state.step))
    # Non-finite steps are skipped and counted (the counts go on from the
    # checkpoint resumed from); optimizer.max_nonfinite_in_a_row of them in a
    # row stop the run, and non-finite parameters are never saved.
    counts = (resumed or {}).get("nonfinite", {})
    step_metrics = StepMetrics(
        on_nonfinite="Lower --config.optimizer.learning_rate or check the data.",
        max_nonfinite_in_a_row=config.optimizer.max_nonfinite_in_a_row,
        skipped=counts.get("skipped_steps", 0), in_a_row=counts.get("nonfinite_in_a_row", 0))
    with sharding_lib.mesh_context(mesh, rules):
      t0 = time.perf_counter()
      for batch in batches_lib.train_batches(train.arrays, config.global_batch_size,
                                             seed=config.seed, start_step=step,
                                             num_steps=num_steps):
        state, metrics = p_train(state, pipeline.to_global(batch, sharding), dropout_rng)
        step += 1
        step_metrics.add(step, metrics)
        if step % config.logging.every_steps == 0 or step == num_steps:
          _log_window(logger, step_metrics, step, num_steps, schedule, t0)
          t0 = time.perf_counter()
        if step % config.checkpoint.every_steps == 0 and step < num_steps:
          step_metrics.drain_for_save(step)
          checkpointer.save(state, dict(meta, nonfinite=step_metrics.counts()))
      step_metrics.drain_for_save(step)
      checkpointer.save(state, dict(meta, nonfinite=step_metrics.counts()))
      dev = evaluate(p_predict, state, prepared.dev, config.eval_batch_size, sharding,
                     workdir)
    for name, m in dev.items():
      logger.write(num_steps, {k: v for k, v in m.items() if k != "num_examples"},
                   prefix=f"dev_{name}")
  finally:
    checkpointer.close()
    if logger is not None:
      logger.close()
  results = {"task": task.name, "steps": num_steps, "seed": config.seed,
             "learning_rate": config.optimizer.learning_rate,
             "init_from": config.init_from, "num_train_examples": len(train),
             "primary_metric": task.primary, "dev": dev, **step_metrics.counts()}
  if jax.process_index() == 0:
    fileio.write_text(results_path, json.dumps(results, indent=2, sort_keys=True))
  return results


def _log_window(logger, step_metrics: StepMetrics, step, num_steps, schedule, t0):
  """Averages a window of host metrics, prints them and writes them to TensorBoard,
  with the counts of skipped (non-finite) steps."""
  host = step_metrics.take_window()  # Reads back and counts the skipped steps first.
  m = window_means(host)
  # The learning rate of the latest applied update: skipped steps leave the
  # schedule's count (in the optimizer state) as it was.
  m["learning_rate"] = float(schedule(max(step - step_metrics.skipped - 1, 0)))
  m["steps_per_second"] = len(host) / max(time.perf_counter() - t0, 1e-9)
  m.update(step_metrics.counts())
  logging.info("step %d/%d %s", step, num_steps,
               "  ".join(f"{k} {v:.4g}" for k, v in sorted(m.items())))
  logger.write(step, m, prefix="train")


def primary_score(task: registry.Task, results: dict) -> float:
  first = task.dev_splits[0]
  return float(results["dev"][first][task.primary])


def sweep(config: ml_collections.ConfigDict, workdir: str,
          weights_loader: Optional[WeightsLoader] = None) -> dict[str, Any]:
  """Every (learning rate, seed) of config.sweep, each in workdir/lr{lr}_seed{seed};
  results.json holds every run's dev figures and the best run by the task's primary metric."""
  prepared = prepare(config)
  runs = []
  for lr in config.sweep.learning_rates:
    for seed in config.sweep.seeds:
      run_config = ml_collections.ConfigDict(config.to_dict())
      run_config.optimizer.learning_rate = float(lr)
      run_config.seed = int(seed)
      run_dir = os.path.join(workdir, f"lr{lr:g}_seed{seed}")
      logging.info("Sweep run: learning rate %g, seed %d in %s.", lr, seed, run_dir)
      result = finetune_and_evaluate(run_config, run_dir, weights_loader, prepared)
      runs.append({"learning_rate": float(lr), "seed": int(seed), "workdir": run_dir,
                   "score": primary_score(prepared.task, result), "dev": result["dev"]})
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


def compare_with_random_init(config: ml_collections.ConfigDict, workdir: str,
                             weights_loader: Optional[WeightsLoader] = None) -> dict[str, Any]:
  """Fine-tunes from config.init_from (workdir/pretrained) and from random
  initialisation (workdir/random_init) with the same data, steps and settings;
  results.json holds both runs' dev figures."""
  prepared = prepare(config)
  pretrained = finetune_and_evaluate(config, os.path.join(workdir, "pretrained"),
                                     weights_loader, prepared)
  random_config = ml_collections.ConfigDict(config.to_dict())
  random_config.init_from = ""
  random_init = finetune_and_evaluate(random_config, os.path.join(workdir, "random_init"),
                                      None, prepared)
  split = prepared.task.dev_splits[0]
  summary = {"task": prepared.task.name, "primary_metric": prepared.task.primary,
             "primary_split": split, "steps": pretrained["steps"],
             "init_from": config.init_from,
             "pretrained": pretrained["dev"], "random_init": random_init["dev"]}
  logging.info("Dev %s on %s: %.4f fine-tuned from %s, %.4f from random initialisation.",
               prepared.task.primary, split, primary_score(prepared.task, pretrained),
               config.init_from, primary_score(prepared.task, random_init))
  if jax.process_index() == 0:
    fileio.write_text(os.path.join(workdir, RESULTS),
                      json.dumps(summary, indent=2, sort_keys=True))
  return summary
