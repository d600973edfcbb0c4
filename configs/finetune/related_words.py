"""Fine-tuning the demo model on related_words: do two words belong to the same
part of Python? Each pair is two words that each occur mostly in one of
doc_area's nine areas; the dev pairs hold only words that no training pair
holds, so what the training pairs teach about their words does not reach the dev
words, and a bag of words trained on them is near chance (docs/recipes.md); what
a model knows of the dev words comes from pretraining (sentence pair of single
words; accuracy, 0.5 is chance).

  python -m bertjax.studies.suite --data_dir=WORKDIR/demo_data \
      --checkpoint=WORKDIR/checkpoints --workdir=/tmp/suite

runs it with the suite's other tasks (the suite writes the task's files under
the demo data's tasks/ first). Alone, once those exist:

  python -m bertjax.finetune --config=configs/finetune/related_words.py \
      --config.init_from=WORKDIR/checkpoints --config.data_dir=WORKDIR/demo_data \
      --config.vocab_file=WORKDIR/demo_data/vocab.txt --workdir=/tmp/related_words
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_area  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  config = doc_area.get_config()  # The demo model, its dropout, lr 2e-4, batch 32, paths as given.
  config.task = "related_words"  # Labels different and same.
  config.max_seq_length = 16  # [CLS] word [SEP] word [SEP]: the longest words are a few pieces.
  config.num_epochs = 3.0  # 375 steps of 32 on the 4,000 training pairs.
  return config
