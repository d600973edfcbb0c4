"""Fine-tuning the demo model on doc_area: which part of Python a sentence of the
demo corpus documents (nine areas; single sentence; accuracy). A reference
column of the suite: its words largely tell the area, so a bag of words does
it well (docs/recipes.md).

  python -m bertjax.studies.suite --data_dir=WORKDIR/demo_data \
      --checkpoint=WORKDIR/checkpoints --workdir=/tmp/suite

runs it with the suite's other tasks (the suite writes the task's files under
the demo data's tasks/ first). Alone, once those exist:

  python -m bertjax.finetune --config=configs/finetune/doc_area.py \
      --config.init_from=WORKDIR/checkpoints --config.data_dir=WORKDIR/demo_data \
      --config.vocab_file=WORKDIR/demo_data/vocab.txt --workdir=/tmp/doc_area
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  config = demo.get_config()  # The demo model, its dropout, lr 2e-4 and batch 32.
  config.task = "doc_area"  # Nine areas: the language reference and eight groups of library modules.
  config.init_from = ""  # The pretraining checkpoint (a directory); empty: random initialisation.
  config.data_dir = ""  # The demo data directory, holding tasks/doc_area/{train,dev}.tsv.
  config.vocab_file = ""  # The demo's vocab (DATA_DIR/vocab.txt).
  config.within_workdir = False  # The paths above are as given.
  config.random_init_baseline = False  # The suite scores random initialisation as a checkpoint of its own.
  config.max_seq_length = 64  # 99% of the corpus's sentences fit.
  config.num_epochs = 3.0  # 210 steps of 32 on the 2,250 training sentences.
  return config
