"""BERT-BASE's architecture with a modern pretraining recipe (MosaicBERT's).

The architecture is configs/base.py's, unchanged; what changes is how it is
trained, after MosaicBERT (Portes et al., 2023; mosaicml/examples,
examples/benchmarks/bert/yamls/main/mosaic-bert-base-uncased.yaml) and
RoBERTa (Liu et al., 2019): masked LM alone on full sentences (no NSP),
30% of the tokens masked afresh every epoch, one phase at length 128,
batch 4096, lr 5e-4 with 6% warmup and a linear decay to 0.02x, no
attention dropout (so the fused kernels without it, splash on TPU and cuDNN
on GPU, can run: by name, or by 'auto' where docs/attention.md records them
proven).

  python -m bertjax.create_data --objective=mlm --max_seq_length=128 \
      --max_predictions_per_seq=40 --dupe_factor=1 ... --output_dir=gs://BUCKET/data/mlm_128
  python -m bertjax.main --config=configs/modern.py --workdir=gs://BUCKET/modern \
      --config.phases.seq128.train_files='gs://BUCKET/data/mlm_128/*.tfrecord'
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config():
  config = base.get_config()
  config.objective = "mlm"  # No NSP (the paper's Table 5 ablation; RoBERTa, MosaicBERT): masked LM on FULL-SENTENCES records (create_data --objective=mlm). Their rows are one segment, so segment B's token-type row is never trained; fine-tuning sets it (configs/finetune/glue.py's segment_b_init; docs/recipes.md).
  config.total_steps = 70_000  # MosaicBERT's max_duration, 286,720,000 samples, at batch 4096.

  config.model.attention_dropout_rate = 0.0  # MosaicBERT's attention_probs_dropout_prob 0 (for the fused kernel): splash (TPU) or cuDNN (GPU) may then train, by name or where 'auto' has them proven.

  config.data.dynamic_masking = True  # A fresh mask each epoch, as RoBERTa and MosaicBERT's collator.
  config.data.masked_lm_prob = 0.3  # MosaicBERT's mlm_probability (Wettig et al., 2022: 30% beats 15%); evaluation stays at the records' 15%.
  # data.packing stays off, as in base: FULL-SENTENCES rows are filled to the length already (114 of 128 tokens on average in the demo's records), so no second example fits a row; packing pays for data with short rows.

  del config.phases["seq512"]  # MosaicBERT trains at length 128 only.
  config.phases.seq128.fraction = 1.0  # The whole run at length 128.
  config.phases.seq128.max_predictions_per_seq = 40  # 30% of 128 tokens is 38; records must be made with this many (create_data --max_predictions_per_seq=40).
  config.phases.seq128.global_batch_size = 4096  # MosaicBERT's global_train_batch_size.

  config.optimizer.learning_rate = 5e-4  # MosaicBERT's peak lr.
  config.optimizer.b2 = 0.98  # MosaicBERT's betas (0.9, 0.98); eps 1e-6 as base.
  config.optimizer.weight_decay = 0.02  # MosaicBERT's decoupled_adamw weight_decay 1e-5 is the decay per step at the peak lr (composer scales it by lr / peak lr); optax's adamw multiplies by lr, so 1e-5 / 5e-4. bertjax never decays LayerNorm parameters or biases.
  config.optimizer.clip_norm = 0.0  # MosaicBERT's recipe clips no gradients.
  config.optimizer.warmup_steps = config.get_ref("total_steps") * 6 // 100  # MosaicBERT's t_warmup 0.06dur: 6% of total_steps (follows --config.total_steps).
  config.optimizer.end_learning_rate = config.optimizer.get_ref("learning_rate") * 0.02  # MosaicBERT's alpha_f 0.02: linear decay to 0.02x the peak.
  return config
