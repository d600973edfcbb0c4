"""Fine-tuning on CoNLL-2003 named entities (first sub-token of each word labelled, no CRF).

  python -m bertjax.finetune --config=configs/finetune/ner.py \
      --config.init_from=DIR --config.data_dir=conll2003 --workdir=DIR

data_dir holds train.txt and valid.txt (BIO); with data_dir empty the splits come
from TFDS `conll2003` (in tfds_data_dir). The dev score is seqeval's span F1.
--config.document_context=true encodes each sentence with its document's
neighbouring sentences as context (docs/features.md).
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glue  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  config = glue.get_config()  # Batch 32, 3 epochs, 10% warmup, dropout 0.1.
  config.task = "conll2003"  # Token classification over the nine BIO tags.
  config.do_lower_case = False  # The paper's NER model is cased; init_from's recorded casing replaces it unless given as a flag.
  config.max_seq_length = 128  # Sub-tokens per row with [CLS] and [SEP].
  config.document_context = False  # True: the sentence's document neighbours fill each row's spare room (the paper's maximal document context; data_dir files only).
  return config
