"""The README's main command end to end, with fewer steps: demo data, both
phases, held-out evaluation, checkpoints, a rerun that finds the run complete,
the export that transformers loads for fine-tuning, the downstream step
(fine-tuning from the demo checkpoint and from random initialisation, beside a
bag-of-words baseline) and the command's output."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.create import demo
from bertjax.train import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "configs"))
import tiny  # pylint: disable=g-import-not-at-top,wrong-import-position

# Every test reads the one demo run of the module's fixture.
pytestmark = pytest.mark.slow


def _config(workdir):
  config = tiny.get_config()
  config.total_steps = 40  # 39 steps at length 128, then 1 at 512.
  config.checkpoint.every_steps = 15
  config.logging.every_steps = 5
  config.logging.eval_batches = 3
  demo.prepare_config(config, workdir)
  return config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("demo_run"))
  return workdir, loop.train_and_evaluate(_config(workdir), workdir)


def test_both_phases_train_and_evaluate(run):
  workdir, summary = run
  assert summary["step"] == summary["total_steps"] == 40
  assert list(summary["phases"]) == ["seq128", "seq512"]
  assert summary["phases"]["seq128"]["steps"] == 39
  assert summary["phases"]["seq512"]["steps"] == 1
  config = _config(workdir)
  for name in ("seq128", "seq512"):
    result = summary["phases"][name]["eval"]
    assert result["num_examples"] == 3 * config.phases[name].global_batch_size
    for key in ("loss", "mlm_accuracy", "nsp_accuracy", "mlm_baseline_accuracy",
                "nsp_baseline_accuracy"):
      assert np.isfinite(result[key]), (name, key)
    assert 0.0 <= result["mlm_accuracy"] <= 1.0
    assert 0.5 <= result["nsp_baseline_accuracy"] <= 1.0
  # The demo data was built inside the workdir, both phases and both splits.
  for split in ("train", "eval"):
    for length in (128, 512):
      assert glob.glob(os.path.join(workdir, "demo_data", f"{split}_{length}",
                                    "part-*.tfrecord"))
  steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))
                 if d.isdigit())
  assert steps[-1] == 40 and 30 in steps
  assert glob.glob(os.path.join(workdir, "tensorboard", "events.*"))
  assert os.path.exists(os.path.join(workdir, "summary.json"))


def test_rerun_reports_the_run_complete(run, caplog):
  workdir, summary = run
  mtimes = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(workdir, "checkpoints", "*"))}
  with caplog.at_level("INFO"):
    again = loop.train_and_evaluate(_config(workdir), workdir)
  assert again == summary
  assert "is complete" in caplog.text
  assert {p: os.path.getmtime(p) for p in mtimes} == mtimes


def test_export_loads_in_transformers_with_the_same_outputs(run, tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  workdir, _ = run
  out = str(tmp_path / "hf")
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.convert.export",
       f"--checkpoint={os.path.join(workdir, 'checkpoints')}", f"--output={out}",
       "--format=flax"], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Exported step 40" in result.stdout

  from bertjax.convert import export  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  params, model_config, _ = export.read_checkpoint(os.path.join(workdir, "checkpoints"))
  model = transformers.FlaxBertForPreTraining.from_pretrained(out)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, model_config.vocab_size, (2, 16)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 10:] = 0
  segments = np.zeros_like(ids)
  segments[:, 8:] = 1
  hf_out = model(ids, attention_mask=mask, token_type_ids=segments)
  positions = np.tile(np.arange(16, dtype=np.int32), (2, 1))
  ours = BertForPreTraining(model_config).apply(
      {"params": params}, ids, mask, segments, positions, deterministic=True)
  np.testing.assert_allclose(ours["nsp_logits"], hf_out.seq_relationship_logits, atol=1e-4)
  # bertjax's logits keep the padded vocab columns (at the most negative float).
  vocab = model_config.vocab_size
  assert (np.asarray(ours["mlm_logits"][..., vocab:]) < -1e38).all()
  np.testing.assert_allclose(ours["mlm_logits"][..., :vocab], hf_out.prediction_logits,
                             atol=1e-4)


def test_downstream_step_fine_tunes_from_the_checkpoint_and_from_random_init(run):
  from bertjax import downstream  # pylint: disable=g-import-not-at-top
  workdir, _ = run
  config = downstream.demo_config()
  config.num_train_pairs, config.num_dev_pairs = 64, 40  # Two steps of 32 per run.
  config.num_epochs = 1.0
  result = downstream.demo_downstream(workdir, config)
  with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
    assert json.load(f)["downstream"] == result
  assert result["steps"] == 2 and result["task"] == "same_document"
  for init in ("pretrained", "random_init", "bag_of_words"):
    dev = result[init]["dev"]
    assert dev["num_examples"] == 40 and 0.0 <= dev["accuracy"] <= 1.0
  for init in ("pretrained", "random_init"):
    assert os.path.exists(os.path.join(workdir, "downstream", init, "results.json"))
  assert result["init_from"] == os.path.join(workdir, "checkpoints")


# What TensorFlow and absl print as they start, which the demo's output leaves out.
STARTUP_NOISE = ("All log messages before absl::InitializeLog() is called",
                 "oneDNN custom operations are on", "cpu_feature_guard")


def test_the_demo_command_prints_its_figures_and_no_start_up_noise(run, tmp_path):
  """The README's command, with fewer steps, on the fixture's demo data: the
  held-out figures of both phases, the downstream line with its bag-of-words
  baseline, and none of TensorFlow's start-up lines."""
  workdir, _ = run
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/tiny.py",
       f"--workdir={tmp_path / 'demo'}", "--config.total_steps=40",
       f"--config.data.demo_dir={os.path.join(workdir, 'demo_data')}",
       "--config.logging.eval_batches=3"],
      cwd=REPO, capture_output=True, text=True, timeout=900, check=False, env=env)
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  assert not [line for line in STARTUP_NOISE if line in output], output[-3000:]
  for phase in ("seq128", "seq512"):
    assert f"{phase}: held-out MLM accuracy" in output and "majority-label baseline" in output
  assert "Dev accuracy on dev: " in output
  assert "from a bag of words (logistic regression on the same rows' word-piece counts)" in (
      output)


def test_predict_reads_the_runs_checkpoint_and_vocab(run):
  workdir, _ = run
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.fill_mask",
       f"--checkpoint={os.path.join(workdir, 'checkpoints')}",
       "--text=The [MASK] statement leaves the loop.", "--text=It returns a [MASK] [MASK].",
       "--text_b=The loop ends.", "--top_k=3"],
      cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert lines[0] == "The [MASK] statement leaves the loop."
  assert lines[1].startswith("  [MASK] #1: ") and lines[1].count("(") == 3
  assert lines[2].startswith("  next sentence 'The loop ends.': ")
  assert lines[4].startswith("  [MASK] #1: ")  # Two adjacent masks: one whole-word run.
