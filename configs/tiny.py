"""The CPU demo: a small BERT pretrained on the pydoc corpus in minutes.

  python -m bertjax.main --config=configs/tiny.py --workdir=/tmp/bertjax_demo

builds the demo corpus (the Python reference documentation that ships with
every Python), a WordPiece vocab and both phases' TFRecords under
workdir/demo_data when absent, then trains through both phases (128, then
512), evaluates on held-out documents and checkpoints; bertjax.main then
runs the demo's downstream step (configs/finetune/demo.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config():
  config = base.get_config()
  config.total_steps = 5600  # The whole demo (data, pretraining, downstream step) in under 4 minutes on 2 idle CPU cores (docs/demo.md), long enough for next-sentence prediction to learn.

  config.model.vocab_size = 0  # 0 takes the vocab size from the demo data's metadata.json.
  config.model.hidden_size = 128  # H.
  config.model.num_layers = 2  # L.
  config.model.num_heads = 2  # A.
  config.model.intermediate_size = 512  # 4H.
  config.model.hidden_dropout_rate = 0.0  # Every example is seen about once: dropout would only slow learning.
  config.model.attention_dropout_rate = 0.0  # As above.
  config.model.dtype = "float32"  # CPUs have no fast bf16 matmul.

  config.data.demo_dir = "demo_data"  # Relative to the workdir; built there when absent.

  config.phases.seq128.fraction = 0.97  # Most of the CPU minutes go to the cheaper length.
  config.phases.seq128.global_batch_size = 8  # Sequences per step at length 128: small batches learn most per sequence.
  config.phases.seq512.fraction = 0.03  # The 512 phase still runs, briefly.
  config.phases.seq512.global_batch_size = 4  # Sequences per step at length 512.

  config.optimizer.learning_rate = 7e-4  # A small model takes a larger step.
  config.optimizer.warmup_steps = 200  # Linear warmup.

  config.checkpoint.every_steps = 1000  # Save every this many steps.
  config.logging.every_steps = 200  # Console line every this many steps.
  config.logging.eval_every_steps = 0  # Evaluate at the end of each phase only.
  config.logging.eval_batches = 250  # The first 250 x global_batch_size held-out records, packed or not: 2,000 at 128 and 1,000 at 512, enough pairs to tell NSP's accuracy from its baseline.
  return config
