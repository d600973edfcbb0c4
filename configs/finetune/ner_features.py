"""The paper's feature-based CoNLL-2003 NER (Table 7): frozen BERT, a BiLSTM tagger.

  python -m bertjax.finetune --config=configs/finetune/ner_features.py \
      --config.init_from=DIR --config.data_dir=conll2003 --workdir=DIR

BERT's parameters stay as init_from has them; each batch runs through the
frozen encoder and the concatenation of the chosen hidden layers (the top
four: the paper's best, 96.1 dev F1 with BERT-BASE) feeds a two-layer
bidirectional LSTM (768 units per direction) and a linear classifier, the
only parameters trained. Scored like ner.py (seqeval span F1 on the dev split).
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ner  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  config = ner.get_config()  # Cased, max_seq_length 128, batch 32.
  config.task = "conll2003_features"  # CoNLL-2003 tagged by a BiLSTM over frozen BERT features.
  config.num_epochs = 4.0  # Passes over the training split (the paper gives no figure; bertjax's choice).
  config.optimizer.learning_rate = 1e-3  # Peak rate for the LSTM and classifier (bertjax's choice; BERT is frozen).
  config.sweep.learning_rates = (2e-3, 1e-3, 5e-4)  # --config.sweep.enabled's grid for the tagger (bertjax's choice).

  config.feature_based = ml_collections.ConfigDict()
  config.feature_based.layers = (-1, -2, -3, -4)  # Encoder layers concatenated per token (0 the first, -1 the last).
  config.feature_based.lstm_units = 768  # LSTM units per direction, as in the paper.
  config.feature_based.lstm_layers = 2  # Stacked bidirectional LSTM layers, as in the paper.
  config.feature_based.dropout_rate = 0.1  # Dropout on the features, between and after the LSTM layers (training only).
  return config
