"""The demo's downstream step: fine-tune the demo's pretrained model on a task from
the demo corpus, and the same model from random initialisation with the same budget.

  python -m bertjax.main --config=configs/tiny.py --workdir=/tmp/bertjax_demo
  python -m bertjax.finetune --config=configs/finetune/demo.py --workdir=/tmp/bertjax_demo

The task (same_document): does sentence B follow sentence A in its document, or come
from another document? Trained on pairs from the pretraining sources, scored on pairs
from the held-out sources; a bag-of-words baseline on the same rows is printed beside.
Paths are relative to the workdir (the demo pretraining's); the runs go to
workdir/downstream/pretrained and workdir/downstream/random_init, and both dev
accuracies into workdir/downstream/results.json and workdir/summary.json.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import glue  # pylint: disable=g-import-not-at-top,wrong-import-position
import tiny  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  config = glue.get_config()
  config.task = "same_document"  # The next sentence of its document or one of another document.
  config.init_from = "checkpoints"  # The demo pretraining's checkpoints (relative to the workdir).
  config.data_dir = "demo_data"  # The demo data (text/train.txt, text/eval.txt).
  config.vocab_file = "demo_data/vocab.txt"  # The demo's WordPiece vocab.
  config.num_train_pairs = 2000  # Sentence pairs drawn from the training documents.
  config.num_dev_pairs = 1000  # Sentence pairs drawn from the held-out documents.
  config.max_seq_length = 64  # Two sentences of the corpus fit.
  config.num_epochs = 2.0  # 125 steps of 32, the same budget for both runs.
  config.random_init_baseline = True  # Also fine-tune from random initialisation, same budget.
  config.within_workdir = True  # The paths above are inside --workdir; runs go to WORKDIR/downstream, results also into WORKDIR/summary.json.

  config.model = tiny.get_config().model  # The demo model's architecture.
  config.model.vocab_size = 0  # From the demo vocab.
  config.model.hidden_dropout_rate = 0.1  # The paper's fine-tuning dropout.
  config.model.attention_dropout_rate = 0.1  # As above.

  config.optimizer.learning_rate = 2e-4  # A small model takes a larger step (both runs).
  config.checkpoint.every_steps = 10_000  # Only the final checkpoint: the runs take seconds.
  return config
