"""Fine-tuning on SWAG multiple choice with the paper's settings (learning rate 2e-5, batch 16).

  python -m bertjax.finetune --config=configs/finetune/swag.py \
      --config.init_from=DIR --config.data_dir=swag --workdir=DIR

data_dir holds train.csv and val.csv; the dev score is accuracy over the four endings.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glue  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  config = glue.get_config()  # 3 epochs, 10% warmup, dropout 0.1.
  config.task = "swag"  # Four (context, ending) sequences per example.
  config.data_dir = ""  # Directory of SWAG's train.csv and val.csv: required (TFDS has no SWAG).
  config.max_seq_length = 128  # Per choice: [CLS] sent1 [SEP] sent2 ending [SEP].
  config.global_batch_size = 16  # The paper's SWAG batch.
  config.eval_batch_size = 16  # Examples (of four sequences each) per prediction step.
  config.optimizer.learning_rate = 2e-5  # The paper's SWAG learning rate.
  config.sweep.learning_rates = (2e-5,)  # The paper used this one rate.
  return config
