"""Fine-tuning learns: a tiny model from random initialisation separates a task
whose label is a token's presence, bidirectional or causal (left-to-right,
whose pooled output is the last real token's)."""

import os
import sys

import pytest

from bertjax.tasks import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "configs", "finetune"))
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import glue as glue_config  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_a_token_presence_task_reaches_high_dev_accuracy(tmp_path, causal):
  config = glue_config.get_config()
  config.task = "sst2"
  config.data_dir = finetune_data.write_sst2_token_presence(str(tmp_path / "data"))
  config.vocab_file = finetune_data.write_vocab(str(tmp_path / "vocab.txt"))
  config.model.update(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                      max_position_embeddings=16, dtype="float32", causal=causal)
  config.max_seq_length = 16
  config.global_batch_size = 16
  config.eval_batch_size = 64
  config.num_epochs = 5.0  # 80 steps.
  config.optimizer.learning_rate = 2e-3  # A tiny model takes a larger step.
  config.logging.every_steps = 16
  config.checkpoint.async_save = False
  results = loop.finetune_and_evaluate(config, str(tmp_path / "run"))
  dev = results["dev"]["dev"]
  assert dev["num_examples"] == 64
  assert dev["accuracy"] >= 0.9, results
