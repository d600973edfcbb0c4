"""The fine-tuning loop and CLI: results.json, resume, init_from (bertjax checkpoint,
Hugging Face directory), the checks on vocab and dimensions, and the sweep."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from bertjax.convert.weights import load_weights
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.tasks import loop
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train.step_metrics import NonFiniteError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "configs", "finetune"))
import cheap_compiles  # pylint: disable=g-import-not-at-top,wrong-import-position
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import glue as glue_config  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.slow

MODEL = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
             max_position_embeddings=64, dtype="float32")


@pytest.fixture(scope="module", autouse=True)
def compile_cheaply(tmp_path_factory):
  """The runs here compile their steps once between them (cheap_compiles.py)."""
  with cheap_compiles.in_process(cheap_compiles.cache_dir(tmp_path_factory)):
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("data")
  return {"mrpc": finetune_data.write_mrpc(str(d / "mrpc")),
          "vocab": finetune_data.write_vocab(str(d / "vocab.txt"))}


def _config(data, **changes):
  c = glue_config.get_config()
  c.task = "mrpc"
  c.data_dir = data["mrpc"]
  c.vocab_file = data["vocab"]
  c.model.update(MODEL)
  c.max_seq_length = 32
  c.global_batch_size = 8
  c.eval_batch_size = 16
  c.num_epochs = 1.0
  c.logging.every_steps = 4
  c.checkpoint.every_steps = 1000  # Only the final save (the resume test sets 4).
  for path, value in changes.items():
    *groups, field = path.split(".")
    target = c
    for g in groups:
      target = target[g]
    target[field] = value
  return c


def _vocab_size(data):
  with open(data["vocab"], encoding="utf-8") as f:
    return len(f.read().split())


def _saved_params(workdir):
  step = max(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
  with ocp.StandardCheckpointer() as ckptr:
    return ckptr.restore(os.path.join(workdir, "checkpoints", str(step), "params"))


def test_cli_writes_results_and_a_rerun_finds_them(data, tmp_path, tmp_path_factory):
  workdir = str(tmp_path / "run")
  flags = [f"--config={REPO}/configs/finetune/glue.py", "--config.task=mrpc",
           f"--config.data_dir={data['mrpc']}", f"--config.vocab_file={data['vocab']}",
           "--config.max_seq_length=32", "--config.global_batch_size=8",
           "--config.eval_batch_size=16", "--config.num_epochs=2",
           "--config.logging.every_steps=4", f"--workdir={workdir}"]
  flags += [f"--config.model.{k}={v}" for k, v in MODEL.items()]
  result = subprocess.run([sys.executable, "-m", "bertjax.finetune", *flags], cwd=REPO,
                          env=cheap_compiles.child_env(cheap_compiles.cache_dir(tmp_path_factory)),
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    results = json.load(f)
  assert results["steps"] == 2 * 64 // 8
  dev = results["dev"]["dev"]
  assert dev["num_examples"] == 24
  assert 0.0 <= dev["accuracy"] <= 1.0 and 0.0 <= dev["f1"] <= 1.0
  assert os.listdir(os.path.join(workdir, "tensorboard"))
  assert loop.finetune_and_evaluate(_config(data), workdir) == results


def test_resume_continues_from_the_latest_checkpoint(data, tmp_path):
  workdir = str(tmp_path / "run")
  config = _config(data, num_epochs=2.0, **{"checkpoint.every_steps": 4})
  full = loop.finetune_and_evaluate(config, str(tmp_path / "full"))
  # The run as it would be had it stopped after step 8 of 16.
  shutil.copytree(str(tmp_path / "full"), workdir)
  os.remove(os.path.join(workdir, "results.json"))
  for step in os.listdir(os.path.join(workdir, "checkpoints")):
    if step.isdigit() and int(step) > 8:
      shutil.rmtree(os.path.join(workdir, "checkpoints", step))
  resumed = loop.finetune_and_evaluate(config, workdir)
  assert resumed["dev"] == full["dev"]
  a, b = _saved_params(workdir), _saved_params(str(tmp_path / "full"))
  jax.tree.map(np.testing.assert_array_equal, a, b)


def _assert_same_encoder(tuned, source):
  """Equal leaves; the fine-tuning model's word table may have more rows (its vocab
  padded to model.vocab_multiple): the source's rows, then zeros."""
  def check(a, b):
    np.testing.assert_array_equal(a[:b.shape[0]], b)
    np.testing.assert_array_equal(a[b.shape[0]:], 0)
  jax.tree.map(check, tuned, source)


def _pretraining_checkpoint(directory, model_config):
  mesh = sharding_lib.make_mesh(glue_config.get_config().mesh)
  rules = sharding_lib.rules(glue_config.get_config().mesh)
  state, _ = state_lib.create_train_state(BertForPreTraining(model_config),
                                          optax.adam(1e-3), mesh, rules, jax.random.key(7))
  checkpointer = ckpt_lib.Checkpointer(directory, keep=1, async_save=False)
  # The meta records the architecture, as the pretraining loop's does.
  checkpointer.save(state, {"phase": "seq128", "model": dataclasses.asdict(model_config)})
  checkpointer.close()
  return jax.tree.map(np.asarray, state.params)


def test_init_from_a_pretraining_checkpoint_keeps_the_encoder(data, tmp_path):
  model_config = BertConfig(vocab_size=_vocab_size(data), **MODEL)
  source = _pretraining_checkpoint(str(tmp_path / "pretrained"), model_config)
  workdir = str(tmp_path / "run")
  config = _config(data, init_from=str(tmp_path / "pretrained"))
  config.optimizer.learning_rate = 0.0  # Nothing moves: the saved encoder is the loaded one.
  loop.finetune_and_evaluate(config, workdir, weights_loader=load_weights)
  tuned = _saved_params(workdir)
  assert set(tuned) == {"bert", "classifier"}
  _assert_same_encoder(tuned["bert"], source["bert"])
  assert tuned["classifier"]["kernel"].shape == (MODEL["hidden_size"], 2)


def test_init_from_a_hugging_face_directory(data, tmp_path):
  transformers = pytest.importorskip("transformers")
  from bertjax.convert import hf  # pylint: disable=g-import-not-at-top
  model_config = BertConfig(vocab_size=_vocab_size(data), **MODEL)
  hf_dir = str(tmp_path / "hf")
  model = transformers.FlaxBertForPreTraining(hf.bertjax_config_to_hf(model_config),
                                              _do_init=False)
  # One compiled init: _do_init=True runs it op by op, seconds more on the CPU.
  params = jax.jit(model.init_weights, static_argnums=1)(jax.random.PRNGKey(3), (1, 1))
  model.save_pretrained(hf_dir, params=params)
  with open(data["vocab"], encoding="utf-8") as src, open(
      os.path.join(hf_dir, "vocab.txt"), "w", encoding="utf-8") as dst:
    dst.write(src.read())
  config = _config(data, init_from=hf_dir, vocab_file="")  # vocab.txt from init_from.
  config.optimizer.learning_rate = 0.0
  workdir = str(tmp_path / "run")
  loop.finetune_and_evaluate(config, workdir, weights_loader=load_weights)
  expected = hf.hf_to_bertjax(params, model_config)["params"]["bert"]
  _assert_same_encoder(_saved_params(workdir)["bert"], jax.tree.map(np.asarray, expected))


def test_vocab_and_dimension_mismatches_name_the_field(data, tmp_path):
  with pytest.raises(ValueError, match=r"--config.model.vocab_size=99 .* has \d+ tokens"):
    loop.prepare(_config(data, **{"model.vocab_size": 99}))
  model_config = BertConfig(vocab_size=_vocab_size(data), **MODEL)
  _pretraining_checkpoint(str(tmp_path / "pretrained"), model_config)
  config = _config(data, init_from=str(tmp_path / "pretrained"),
                   **{"model.intermediate_size": 128})
  with pytest.raises(ValueError, match=r"has intermediate_size=64 but "
                     r"--config.model.intermediate_size is 128"):
    loop.finetune_and_evaluate(config, str(tmp_path / "run"), weights_loader=load_weights)
  assert not os.path.exists(os.path.join(tmp_path, "run", "results.json"))


def test_an_update_that_makes_the_parameters_nonfinite_stops_the_run_naming_its_step(
    data, tmp_path):
  # An infinite learning rate: the loss and gradient of step 1 are finite, the
  # parameters it writes are not. A skip could not undo that (the update is
  # applied in place of the old parameters), so the run stops at once.
  inf = {"optimizer.learning_rate": float("inf"), "optimizer.max_nonfinite_in_a_row": 100}
  workdir = str(tmp_path / "inf")
  with pytest.raises(NonFiniteError, match=(
      r"the update of step 1 made the parameters non-finite \(param_norm nan\) from a "
      r"finite loss and gradient")):
    loop.finetune_and_evaluate(_config(data, **inf), workdir)
  assert not os.path.exists(os.path.join(workdir, "results.json"))
  saved = os.path.join(workdir, "checkpoints")
  assert not os.path.isdir(saved) or not [d for d in os.listdir(saved) if d.isdigit()]


def test_sweep_reports_every_run_and_the_best(data, tmp_path):
  config = _config(data)
  config.sweep.learning_rates = (1e-3, 1e-4)
  config.sweep.seeds = (5,)
  summary = loop.sweep(config, str(tmp_path))
  assert [(r["learning_rate"], r["seed"]) for r in summary["runs"]] == [(1e-3, 5), (1e-4, 5)]
  assert summary["best"]["score"] == max(r["score"] for r in summary["runs"])
  assert summary["primary_metric"] == "f1"
  for r in summary["runs"]:
    assert os.path.exists(os.path.join(r["workdir"], "results.json"))
  with open(tmp_path / "results.json", encoding="utf-8") as f:
    assert json.load(f) == summary
