"""SQuAD through the fine-tuning loop: the paper's per-version defaults, the original's
prediction files in the workdir, EM/F1 (and the best v2.0 threshold) in results.json."""

import json
import os
import sys

import pytest

from bertjax.tasks import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "configs", "finetune"))
import squad as squad_config  # pylint: disable=g-import-not-at-top,wrong-import-position
import squad_fixtures  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_squad_run_writes_predictions_and_scores(version, tmp_path):
  data = squad_fixtures.squad_v2() if version == "2.0" else squad_fixtures.squad_v1()
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  for split in ("train", "dev"):
    squad_fixtures.write_json(str(data_dir / f"{split}-v{version}.json"), data)
  config = squad_config.get_config()
  config.version = version
  config.data_dir = str(data_dir)
  config.vocab_file = squad_fixtures.write_vocab(str(tmp_path), data)
  config.model.update(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                      dtype="float32")
  config.max_seq_length, config.doc_stride, config.max_query_length = 48, 16, 12
  config.eval_batch_size = 8
  workdir = str(tmp_path / "run")
  results = loop.finetune_and_evaluate(config, workdir)
  # The paper's epochs and batch size for the version, where the config leaves 0.
  assert (config.num_epochs, config.global_batch_size) == (
      (2.0, 48) if version == "2.0" else (3.0, 32))
  dev = results["dev"]["dev"]
  written = sorted(f for f in os.listdir(workdir) if f.endswith(".json"))
  questions = sum(len(p["qas"]) for a in data["data"] for p in a["paragraphs"])
  with open(os.path.join(workdir, "predictions.json"), encoding="utf-8") as f:
    assert len(json.load(f)) == questions
  if version == "2.0":
    assert written == ["config.json", "nbest_predictions.json", "null_odds.json",
                       "predictions.json", "results.json"]
    for key in ("exact", "f1", "best_f1", "best_f1_thresh", "best_exact_thresh"):
      assert key in dev
    assert dev["total"] == questions
  else:
    assert written == ["config.json", "nbest_predictions.json", "predictions.json",
                       "results.json"]
    assert 0.0 <= dev["exact_match"] <= dev["f1"] <= 100.0
  assert results["primary_metric"] == "f1"
