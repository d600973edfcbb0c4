"""Fine-tuning on SQuAD v1.1 or v2.0 span extraction, as the paper and the original run_squad.

  python -m bertjax.finetune --config=configs/finetune/squad.py --config.version=2.0 \
      --config.init_from=DIR --config.data_dir=squad --workdir=DIR

data_dir holds train-v{version}.json and dev-v{version}.json (empty: TFDS
squad/v{version}). The run writes predictions.json, nbest_predictions.json and,
for v2.0, null_odds.json to the workdir, and EM/F1 (v2.0: also the best
null_score_diff_threshold on dev and its scores) to results.json.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glue  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  config = glue.get_config()  # 10% warmup, dropout 0.1, AdamW.
  config.task = "squad"  # Start and end logits over the document tokens.
  config.version = "1.1"  # 1.1 | 2.0 (unanswerable questions, the null score).
  config.max_seq_length = 384  # [CLS] question [SEP] document window [SEP].
  config.doc_stride = 128  # Tokens between the starts of consecutive document windows.
  config.max_query_length = 64  # Question tokens kept.
  config.num_epochs = 0.0  # 0: the paper's, 3 for v1.1 and 2 for v2.0.
  config.global_batch_size = 0  # 0: the paper's, 32 for v1.1 and 48 for v2.0.
  config.optimizer.learning_rate = 5e-5  # The paper's SQuAD learning rate.
  config.n_best_size = 20  # Candidate spans per question in nbest_predictions.json.
  config.max_answer_length = 30  # Longest answer in tokens.
  config.null_score_diff_threshold = 0.0  # v2.0: predict no answer when s_null - best span score exceeds this.
  return config
