"""What fine-tuning takes from init_from's checkpoint (architecture, casing), what
an export takes from a fine-tuning run's record, and how the sweep ranks a NaN run."""

import json
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bertjax import downstream
from bertjax.convert import export
from bertjax.convert import weights
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.tasks import loop
from bertjax.tasks import registry
from bertjax.train import state as state_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "configs", "finetune"))
import cheap_compiles  # pylint: disable=g-import-not-at-top,wrong-import-position
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import glue as glue_config  # pylint: disable=g-import-not-at-top,wrong-import-position

# Not the config's architecture (BERT-BASE): init_from's must be taken.
SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
             max_position_embeddings=64)


@pytest.fixture(scope="module", autouse=True)
def compile_cheaply(tmp_path_factory):
  """The runs here compile their steps once between them (cheap_compiles.py)."""
  with cheap_compiles.in_process(cheap_compiles.cache_dir(tmp_path_factory)):
    yield


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("data")
  return {"mrpc": finetune_data.write_mrpc(str(d / "mrpc"), num_train=16, num_dev=8),
          "vocab": finetune_data.write_vocab(str(d / "vocab.txt"))}


def _vocab_size(data):
  with open(data["vocab"], encoding="utf-8") as f:
    return len(f.read().split())


def _config(data, **fields):
  """The GLUE config as the command line gives it: BERT-BASE's model fields."""
  c = glue_config.get_config()
  c.task = "mrpc"
  c.data_dir = data["mrpc"]
  c.model.dtype = "float32"
  c.max_seq_length = 32
  c.global_batch_size = 8
  c.eval_batch_size = 8
  c.num_epochs = 1.0
  c.checkpoint.async_save = False
  for k, v in fields.items():
    c[k] = v
  return c


def _pretraining_params(model_config):
  # Compiled: op by op, the init takes seconds more on the CPU.
  init = jax.jit(lambda rng: nn.unbox(state_lib.init_params(BertForPreTraining(model_config),
                                                            rng)))
  return jax.tree.map(np.asarray, init(jax.random.key(3)))


def _copy_vocab(data, directory):
  with open(data["vocab"], encoding="utf-8") as src, open(
      os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as dst:
    dst.write(src.read())


def _checkpoint_dir(data, tmp_path_factory, name, save):
  """A small checkpoint written by `save(params, model_config, directory)`, with vocab.txt."""
  directory = str(tmp_path_factory.mktemp(name))
  model_config = BertConfig(vocab_size=_vocab_size(data), **SMALL)
  save(_pretraining_params(model_config), model_config, directory)
  _copy_vocab(data, directory)
  return directory


@pytest.fixture(scope="module")
def hf_dir(data, tmp_path_factory):
  """A small cased Hugging Face model directory (tokenizer_config.json says so)."""
  from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
  directory = _checkpoint_dir(data, tmp_path_factory, "hf", hf_files.save_hf_checkpoint)
  with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump({"do_lower_case": False}, f)
  return directory


@pytest.fixture(scope="module")
def tf1_dir(data, tmp_path_factory):
  """A small TF1 directory: bert_model.ckpt.*, bert_config.json, vocab.txt, no casing."""
  from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
  return _checkpoint_dir(data, tmp_path_factory, "tf1", tf1.save_tf1_checkpoint)


@pytest.mark.slow
def test_the_architecture_and_casing_come_from_a_hugging_face_directory(data, hf_dir,
                                                                         tmp_path):
  config = _config(data, init_from=hf_dir)
  assert config.model.hidden_size == 768 and config.do_lower_case
  workdir = str(tmp_path / "run")
  results = downstream.finetune(config, workdir)
  assert results["steps"] == 2
  for field, value in SMALL.items():
    assert config.model[field] == value, field
  assert config.do_lower_case is False
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    record = json.load(f)
  assert record["model"]["hidden_size"] == 32 and record["do_lower_case"] is False


def test_fields_set_on_the_command_line_win_and_a_contradiction_names_the_field(
    data, hf_dir, tmp_path):
  config = _config(data, init_from=hf_dir)
  config.model.hidden_dropout_rate = 0.0
  downstream.take_checkpoint_settings(config, explicit={"model.num_layers"})
  assert config.model.num_layers == 12 and config.model.hidden_size == 32
  with pytest.raises(ValueError, match=r"has num_layers=1 but --config.model.num_layers is 12"):
    downstream.finetune(_config(data, init_from=hf_dir), str(tmp_path / "run"),
                        explicit={"model.num_layers"})
  with pytest.raises(ValueError, match=r"--config.do_lower_case=True, but .* a cased model"):
    downstream.take_checkpoint_settings(_config(data, init_from=hf_dir),
                                        explicit={"do_lower_case"})
  agreeing = _config(data, init_from=hf_dir, do_lower_case=False)
  downstream.take_checkpoint_settings(agreeing, explicit={"do_lower_case"})
  assert agreeing.do_lower_case is False


@pytest.mark.slow
def test_casing_of_tf1_directories_and_bertjax_runs(data, tf1_dir, tmp_path):
  settings = weights.checkpoint_settings(tf1_dir)
  assert settings.model["hidden_size"] == 32 and settings.do_lower_case is None
  # The original release's checkpoints are known by name, as its
  # validate_case_matches_checkpoint knew them.
  for name, lower in (("cased_L-12_H-768_A-12", False), ("uncased_L-12_H-768_A-12", True)):
    named = tmp_path / name
    named.mkdir()
    for f in ("bert_config.json", "bert_model.ckpt.index"):
      (named / f).write_bytes(open(os.path.join(tf1_dir, f), "rb").read())
    assert weights.checkpoint_settings(str(named)).do_lower_case is lower
  # A bertjax fine-tuning run records its casing; a run from it inherits it.
  first = _config(data, init_from="", vocab_file=data["vocab"], do_lower_case=False)
  first.model.update(SMALL)
  downstream.finetune(first, str(tmp_path / "first"))
  settings = weights.checkpoint_settings(str(tmp_path / "first" / "checkpoints"))
  assert settings.do_lower_case is False and settings.model["num_layers"] == 1
  second = _config(data, init_from=str(tmp_path / "first" / "checkpoints"),
                   vocab_file=data["vocab"])
  downstream.take_checkpoint_settings(second)
  assert second.do_lower_case is False and second.model.hidden_size == 32


def _tokenizer_config(directory):
  with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
    return json.load(f)


@pytest.mark.slow
def test_export_of_a_run_from_tf1_or_random_init_takes_the_recorded_vocab(data, tf1_dir,
                                                                          tmp_path):
  # From a TF1 directory (its vocab.txt, no casing there): the run's casing is recorded.
  from_tf1 = _config(data, init_from=tf1_dir, do_lower_case=False)
  downstream.finetune(from_tf1, str(tmp_path / "tf1_run"))
  out = str(tmp_path / "tf1_export")
  export.export(str(tmp_path / "tf1_run" / "checkpoints"), out)
  assert _tokenizer_config(out)["do_lower_case"] is False
  # From random initialisation: the vocab file and casing are the record's.
  random_init = _config(data, init_from="", vocab_file=data["vocab"], do_lower_case=False)
  random_init.model.update(SMALL)
  downstream.finetune(random_init, str(tmp_path / "random_run"))
  out = str(tmp_path / "random_export")
  export.export(str(tmp_path / "random_run" / "checkpoints"), out)
  assert _tokenizer_config(out)["do_lower_case"] is False
  with open(os.path.join(out, "vocab.txt"), encoding="utf-8") as a, open(
      data["vocab"], encoding="utf-8") as b:
    assert a.read() == b.read()
  # The flags still replace the record.
  export.export(str(tmp_path / "random_run" / "checkpoints"), str(tmp_path / "flagged"),
                do_lower_case=True)
  assert _tokenizer_config(str(tmp_path / "flagged"))["do_lower_case"] is True


def test_sweep_ranks_a_nan_run_last(monkeypatch, tmp_path):
  task = registry.get_task("mrpc")
  monkeypatch.setattr(loop, "prepare", lambda config: loop.Prepared(
      task, None, None, None, []))
  monkeypatch.setattr(loop.sweep_steps, "build_sweep_steps", lambda config, prepared: None)
  scores = {5e-5: math.nan, 4e-5: 0.5, 3e-5: 0.75, 2e-5: math.nan}

  def fake_run(config, workdir, weights_loader, prepared, steps):
    del workdir, weights_loader, prepared, steps
    score = scores[config.optimizer.learning_rate]
    dev = {"dev": {"f1": score}}
    # A run whose every evaluation was NaN has no best.
    return {"dev": dev, "best": None if math.isnan(score) else {"score": score, "dev": dev}}
  monkeypatch.setattr(loop, "finetune_and_evaluate", fake_run)
  summary = loop.sweep(glue_config.get_config(), str(tmp_path))
  assert summary["best"]["learning_rate"] == 3e-5 and summary["best"]["score"] == 0.75


@pytest.mark.slow
def test_cli_flags_are_the_explicit_fields(data, hf_dir, tmp_path):
  flags = [f"--config={REPO}/configs/finetune/glue.py", f"--config.init_from={hf_dir}",
           f"--config.data_dir={data['mrpc']}", "--config.max_seq_length=32",
           "--config.model.num_layers=12", f"--workdir={tmp_path / 'run'}"]
  result = subprocess.run([sys.executable, "-m", "bertjax.finetune", *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "has num_layers=1 but --config.model.num_layers is 12" in result.stderr
