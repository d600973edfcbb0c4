"""Fine-tuning the demo model on word_area: each word of a sentence that several
parts of Python use ("buffer", "connection", "close", ...) tagged with the part
that the sentence documents, the other words O (token tagging, span F1; each
word's first sub-token carries its tag). A reference column of the suite: the
word itself says whether it is tagged and its sentence's words say which area,
both within a bag of words' reach (docs/recipes.md).

  python -m bertjax.studies.suite --data_dir=WORKDIR/demo_data \
      --checkpoint=WORKDIR/checkpoints --workdir=/tmp/suite

runs it with the suite's other tasks (the suite writes the task's files under
the demo data's tasks/ first). Alone, once those exist:

  python -m bertjax.finetune --config=configs/finetune/word_area.py \
      --config.init_from=WORKDIR/checkpoints --config.data_dir=WORKDIR/demo_data \
      --config.vocab_file=WORKDIR/demo_data/vocab.txt --workdir=/tmp/word_area
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_area  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  config = doc_area.get_config()  # The demo model, its dropout, batch 32, 3 epochs, paths as given.
  config.task = "word_area"  # Tags O and B-<area> for the nine areas, per word.
  config.optimizer.learning_rate = 5e-4  # Tagging learns little in 3 epochs at doc_area's 2e-4 (docs/recipes.md).
  return config
