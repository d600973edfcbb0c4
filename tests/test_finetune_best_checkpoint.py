"""train_and_predict writes its test-set predictions with the checkpoint that earned
the run's best dev score (which a sweep ranks runs by), not with its last step."""

import csv
import os
import sys

import numpy as np
import pytest

from bertjax import downstream
from bertjax.tasks import loop
from bertjax.tasks import submissions
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.tasks.best import BestDev
from bertjax.text import tokenization
from bertjax.train import sharding as sharding_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "configs", "finetune"))
import cheap_compiles  # pylint: disable=g-import-not-at-top,wrong-import-position
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import glue as glue_config  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.slow

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
            max_position_embeddings=32, dtype="float32")


@pytest.fixture(scope="module", autouse=True)
def compile_cheaply(tmp_path_factory):
  """The runs here compile their steps once between them (cheap_compiles.py)."""
  with cheap_compiles.in_process(cheap_compiles.cache_dir(tmp_path_factory)):
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  mrpc = finetune_data.write_mrpc(str(root / "MRPC"), num_train=32, num_dev=12)
  with open(os.path.join(mrpc, "dev.tsv"), encoding="utf-8") as f:
    dev_texts = [tuple(line.rstrip("\n").split("\t")[3:5]) for line in f.readlines()[1:]]
  finetune_data.write_glue_test(str(root), "MRPC", dev_texts)  # Test = dev's texts.
  return {"mrpc": mrpc, "vocab": finetune_data.write_vocab(str(root / "vocab.txt"))}


def _config(data, **fields):
  # 4 steps, evaluated after steps 2 and 4.
  config = glue_config.get_config()
  config.update(task="mrpc", data_dir=data["mrpc"], vocab_file=data["vocab"],
                max_seq_length=32, global_batch_size=8, eval_batch_size=4, num_epochs=1.0,
                eval_every_steps=2, mode="train_and_predict", **fields)
  config.model.update(TINY)
  config.optimizer.learning_rate = 1e-3
  config.checkpoint.every_steps = 1000
  config.logging.every_steps = 100
  return config


def _outputs(config, checkpoint):
  """The dev split's outputs with the parameters of `checkpoint` (a step directory)."""
  task = registry.get_task(config.task)
  mesh, rules = sharding_lib.make_mesh(config.mesh), sharding_lib.rules(config.mesh)
  state, shardings, _, _ = submissions.restore_for_prediction(
      task, checkpoint, config.max_seq_length, mesh, rules)
  split = task.load("dev", tokenization.load_tokenizer("wordpiece", config.vocab_file),
                    config)
  _, p_predict = step_lib.jit_steps(shardings, mesh, task.kind)
  with sharding_lib.mesh_context(mesh, rules):
    return loop.predict(p_predict, state, split, 4, sharding_lib.batch_sharding(mesh))


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_predictions_come_from_the_best_scoring_step(data, tmp_path, monkeypatch, sweep):
  # A dev score that falls at every evaluation: the first (step 2) is the best, and
  # the run goes on to step 4 with other weights.
  monkeypatch.setattr(BestDev, "score_of", lambda self, dev: -float(self.evaluated_step))
  config = _config(data)
  config.sweep.enabled = sweep
  config.sweep.learning_rates = (1e-3,)
  workdir = str(tmp_path / "run")
  result = downstream.finetune(config, workdir)
  run_dir, best = ((result["best"]["workdir"], result["best"]["best"]) if sweep
                   else (workdir, result["best"]))
  assert best["step"] == 2 and best["checkpoint"] == os.path.join(run_dir, "best", "2")
  assert result["test"]["step"] == 2 and result["test"]["checkpoint"] == best["checkpoint"]
  with open(os.path.join(workdir, "predictions", "MRPC.tsv"), encoding="utf-8") as f:
    rows = list(csv.reader(f, delimiter="\t"))[1:]
  at_best = _outputs(config, best["checkpoint"])
  assert [r[1] for r in rows] == [str(i) for i in np.argmax(at_best, -1)]
  # The last step's weights differ, so predicting with them would be another model.
  at_last = _outputs(config, os.path.join(run_dir, "checkpoints", "4"))
  assert np.abs(at_last - at_best).max() > 1e-3
