"""Fine-tuning on a GLUE task with the paper's hyperparameters (Devlin et al., 2018).

  python -m bertjax.finetune --config=configs/finetune/glue.py --config.task=mrpc \
      --config.init_from=WORKDIR/checkpoints --config.vocab_file=DATA/vocab.txt \
      --config.data_dir=glue_data/MRPC --workdir=DIR

Batch 32, 3 epochs, learning rate from {5e-5, 4e-5, 3e-5, 2e-5} (--config.sweep.enabled
runs the grid), 10% warmup then linear decay, dropout 0.1. With init_from, the
model's architecture fields and do_lower_case are the checkpoint's (its config.json,
bert_config.json or bertjax meta and run record), except those given as
--config.* flags, which must agree with it; without init_from, BERT-BASE.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position


def get_config() -> ml_collections.ConfigDict:
  pretraining = base.get_config()
  config = ml_collections.ConfigDict()

  config.task = "mrpc"  # cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli (and the other tasks in bertjax.tasks.registry); case, hyphens and underscores aside (SST-2, STS-B, MNLI).
  config.init_from = ""  # A bertjax pretraining checkpoint dir, a Hugging Face BERT dir or a TF1 checkpoint dir (bert_model.ckpt.*); empty: random init.
  config.segment_b_init = "copy_a"  # copy_a | zeros | keep: segment B's token-type row when init_from is a bertjax checkpoint pretrained on one segment (objective mlm or ltr), whose row B was never trained: copied from segment A's row, zeros, or kept at its random initial values. Other weights are left as they are (docs/recipes.md).
  config.data_dir = ""  # Directory of the task's files (GLUE TSVs: train.tsv, dev.tsv), or the GLUE root holding a directory per task (SST-2/, STS-B/, ...); empty reads TFDS.
  config.tfds_data_dir = ""  # TFDS data_dir when data_dir is empty; empty: TFDS's default.
  config.vocab_file = ""  # WordPiece vocab.txt; empty takes init_from/vocab.txt (Hugging Face and TF1 dirs).
  config.tokenizer = "wordpiece"  # wordpiece | sentencepiece (a .model file in vocab_file).
  config.do_lower_case = True  # Lower-case and strip accents (uncased models); init_from's casing when it records one, unless given as a flag.
  config.max_seq_length = 128  # [CLS] A [SEP] B [SEP] truncated and padded to this length.
  config.seed = 0  # Head initialisation, dropout and the training order.
  config.num_epochs = 3.0  # Passes over the training split.
  config.global_batch_size = 32  # Training examples per step over all hosts.
  config.eval_batch_size = 32  # Dev examples per prediction step over all hosts.
  config.warmup_proportion = 0.1  # Share of the steps with linear warmup; then linear decay to 0.
  config.eval_every_steps = 0  # Dev evaluation (TensorBoard dev_*) every this many steps, keeping the best checkpoint in WORKDIR/best; 0: only at the end.
  config.early_stopping_patience = 0  # Stop after this many dev evaluations without a better primary score; 0: never (needs eval_every_steps).
  config.random_init_baseline = False  # Also fine-tune from random initialisation with the same budget; report both.
  config.mode = "train"  # train: fine-tune and score dev | predict: write test-set predictions with the fine-tuned checkpoint in predict_from, no training | train_and_predict: both, predicting with the checkpoint of the run's best dev evaluation (a sweep's best run's).
  config.predict_from = ""  # predict mode: a fine-tuning run's checkpoints directory (its latest step) or one step of it; empty: WORKDIR/checkpoints.
  config.predict_file = ""  # The input to predict (SQuAD JSON, CoNLL text, SWAG csv); empty: the task's test files in data_dir (GLUE test.tsv, MNLI test_matched/test_mismatched.tsv and AX; CoNLL test.txt; SWAG test.csv). SQuAD needs it.
  config.predict_dir = ""  # Where prediction files go; empty: WORKDIR/predictions.
  config.within_workdir = False  # True: init_from, data_dir and vocab_file are relative to --workdir, runs go to WORKDIR/downstream.

  # The architecture (bertjax.model.config.BertConfig). With init_from, every size but
  # vocab_size is taken from the checkpoint unless given as a --config.model.* flag.
  config.model = pretraining.model
  config.model.vocab_size = 0  # 0 takes the tokenizer's vocab size; must equal the checkpoint's.
  config.model.hidden_dropout_rate = 0.1  # Dropout on embeddings, sublayers and the classifier input.
  config.model.attention_dropout_rate = 0.1  # Dropout on attention probabilities.

  # AdamW with decoupled weight decay (not on LayerNorm or biases); bias_correction=False
  # and schedule='original' make it the original release's optimizer and schedule exactly.
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "adamw"  # adamw | lamb.
  config.optimizer.learning_rate = 5e-5  # Peak learning rate (the original run_classifier's default).
  config.optimizer.b1 = 0.9  # Adam beta1.
  config.optimizer.b2 = 0.999  # Adam beta2.
  config.optimizer.eps = 1e-6  # Adam epsilon, as in the original release.
  config.optimizer.weight_decay = 0.01  # Decoupled decay, as in the original release.
  config.optimizer.bias_correction = True  # False: the original release's Adam (no bias correction).
  config.optimizer.schedule = "linear"  # linear: decay from the peak after warmup | original: the original release's (decay from step 0 under the warmup).
  config.optimizer.clip_norm = 1.0  # Global gradient-norm clipping; 0 disables.
  config.optimizer.grad_accum_steps = 1  # Micro-batches per step: the global batch is split into this many, their gradients summed in fp32 before one update.
  config.optimizer.max_nonfinite_in_a_row = 10  # A step with a non-finite loss, gradient or updated parameters is skipped (state kept) and counted; this many in a row stop the run.

  # The paper's grid: run with --config.sweep.enabled to fine-tune once per (rate, seed).
  config.sweep = ml_collections.ConfigDict()
  config.sweep.enabled = False  # Run the grid in WORKDIR/lr{rate}_seed{seed} and report the best.
  config.sweep.learning_rates = (5e-5, 4e-5, 3e-5, 2e-5)  # The paper's learning rates.
  config.sweep.seeds = (0,)  # Seeds per rate; the paper reran small tasks with several.

  # Length bucketing: each batch is cut to the shortest of a few lengths that holds its
  # longest example, so short sentences run on short shapes (one compile per length).
  # On by default: dev and test outputs are the same as unbucketed (tested), and
  # training sees every epoch's examples, step count and schedule as without it, with
  # GLUE's mostly short sentences costing a fraction of max_seq_length; off, every
  # batch holds shuffled examples of any length, as the original release's do.
  config.bucketing = ml_collections.ConfigDict()
  config.bucketing.enabled = True  # False: every batch padded to max_seq_length.
  config.bucketing.min_length = 32  # The shortest length; lengths double up to max_seq_length (32, 64, 128).
  config.bucketing.group_batches = 50  # Training: this many batches of shuffled examples are sorted by length together, then the batches shuffled.

  config.mesh = pretraining.mesh  # The device mesh and sharding rules of pretraining.

  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every_steps = 1000  # Save every this many steps, and always at the end.
  config.checkpoint.keep = 1  # Keep the latest this many.
  config.checkpoint.async_save = True  # Write in the background while training goes on.

  config.logging = ml_collections.ConfigDict()
  config.logging.every_steps = 50  # Console line and TensorBoard scalars every this many steps.
  return config
