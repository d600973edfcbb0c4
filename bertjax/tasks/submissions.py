"""Test-set predictions with a fine-tuned checkpoint: the files a benchmark takes.

predict_test(config, workdir) reads the task's test inputs (Task.load_test:
GLUE's test TSVs, a SQuAD JSON, a CoNLL text file, a SWAG csv), restores the
parameters of a fine-tuning run's checkpoint (config.predict_from, else
WORKDIR/checkpoints), runs the model over them as evaluation does
(loop.predict, bucketed by length with config.bucketing) and writes the
task's prediction files to config.predict_dir (else WORKDIR/predictions):

  GLUE       CoLA.tsv, SST-2.tsv, MRPC.tsv, STS-B.tsv, QQP.tsv, MNLI-m.tsv,
             MNLI-mm.tsv and AX.tsv (MNLI's model), QNLI.tsv, RTE.tsv, WNLI.tsv
  SQuAD      predictions.json, nbest_predictions.json (v2.0: null_odds.json)
  CoNLL      conll2003_predictions.txt
  SWAG       swag_predictions.csv

The model's architecture and task come from the checkpoint's meta; the
tokenizer from the config (vocab_file, do_lower_case), as for training.
"""

import json
import os
from typing import Any, Optional

import jax
import ml_collections
import optax
from absl import logging

from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.tasks import batches as batches_lib
from bertjax.tasks import features
from bertjax.tasks import loop
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.text import tokenization
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib

MODES = ("train", "predict", "train_and_predict")
SUMMARY = "prediction_summary.json"


def checkpoint_path(config, workdir: str) -> str:
  return config.predict_from or os.path.join(workdir, "checkpoints")


def restore_for_prediction(task: registry.Task, path: str, max_seq_length: int, mesh,
                           rules) -> tuple[Any, Any, BertConfig, dict]:
  """(state, shardings, model config, meta) of the fine-tuned checkpoint at `path`:
  the parameters only, placed on `mesh`; the architecture from its meta."""
  if not fileio.isdir(path):
    raise FileNotFoundError(f"--config.predict_from={path}: no such checkpoint directory; "
                            "give a fine-tuning run's checkpoints directory (default: "
                            "WORKDIR/checkpoints of the run in --workdir)")
  meta = ckpt_lib.read_meta(path)
  if "model" not in meta or "task" not in meta:
    raise ValueError(f"--config.predict_from={path}: not a fine-tuning checkpoint (its meta "
                     "has no task and model); give a fine-tuning run's checkpoints directory")
  if registry.get_task(meta["task"]).name != task.name:
    raise ValueError(f"--config.predict_from={path}: fine-tuned on task {meta['task']!r}, "
                     f"not {task.name!r}; give --config.task={meta['task']} or another "
                     "checkpoint")
  model_config = BertConfig.from_mapping(meta["model"])
  model = registry.model_for(task, model_config)
  init = registry.init_fn(task, max_seq_length)
  tx = optax.identity()  # Prediction needs no optimizer state.
  abstract, shardings = state_lib.abstract_train_state(model, tx, mesh, rules, init)
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract.params, shardings.params)
  params = ckpt_lib.restore_params(path, target)
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0),
                                                  params=params, init=init)
  return state, shardings, model_config, meta


def predict_test(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Writes the test-set prediction files of config.task; returns (and writes to
  predict_dir/prediction_summary.json) the checkpoint, step and each test set's counts."""
  task = registry.get_task(config.task)
  if task.load_test is None:
    raise ValueError(f"--config.task={config.task}: task {task.name} has no test-set "
                     "prediction files")
  if task.configure is not None:
    task.configure(config)
  mesh = sharding_lib.make_mesh(config.mesh)
  rules = sharding_lib.rules(config.mesh)
  path = checkpoint_path(config, workdir)
  state, shardings, model_config, meta = restore_for_prediction(
      task, path, config.max_seq_length, mesh, rules)
  tokenizer = tokenization.load_tokenizer(config.tokenizer, loop.vocab_file(config),
                                          config.do_lower_case)
  features.check_vocab(tokenizer, model_config.vocab_size, "--config.vocab_file's vocab "
                       "against the checkpoint's model.vocab_size")
  tests = task.load_test(tokenizer, config)
  output_dir = config.predict_dir or os.path.join(workdir, "predictions")
  writer_dir: Optional[str] = output_dir if jax.process_index() == 0 else None
  _, p_predict = step_lib.jit_steps(shardings, mesh, task.kind)
  sharding = sharding_lib.batch_sharding(mesh)
  buckets = batches_lib.buckets_of(config)
  summary = {"task": task.name, "checkpoint": path, "step": meta["step"],
             "output_dir": output_dir, "test": {}}
  with sharding_lib.mesh_context(mesh, rules):
    for split in tests:
      outputs = loop.predict(p_predict, state, split, config.eval_batch_size, sharding,
                             buckets)
      summary["test"][split.name] = split.score(outputs, output_dir=writer_dir)
      logging.info("test [%s] %s predictions written to %s.", split.name, len(split),
                   output_dir)
  if writer_dir is not None:
    fileio.write_text(os.path.join(output_dir, SUMMARY),
                      json.dumps(summary, indent=2, sort_keys=True))
  return summary


def check_mode(config) -> None:
  if config.mode not in MODES:
    raise ValueError(f"--config.mode={config.mode!r}: must be one of {MODES}")
