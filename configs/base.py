"""BERT-BASE pretraining as in Devlin et al. (2018) and the original release.

L=12, H=768, A=12 (110M parameters with the 30,522-token uncased vocab);
1M steps of 256 sequences, 90% at length 128 then 10% at 512; Adam with
lr 1e-4, 10k warmup steps and linear decay; trained on 16 TPU chips.

  python -m bertjax.main --config=configs/base.py --workdir=gs://BUCKET/base \
      --config.phases.seq128.train_files='gs://BUCKET/data/train_128/*.tfrecord' \
      --config.phases.seq512.train_files='gs://BUCKET/data/train_512/*.tfrecord'
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()

  config.seed = 0  # Seeds parameter init, dropout and the data order.
  config.objective = "mlm+nsp"  # The paper's masked LM + next sentence | mlm (Table 5's No NSP) | ltr (LTR & No NSP: left-to-right LM, causal mask); must match the records' metadata.json (bertjax.create_data --objective).
  config.total_steps = 1_000_000  # Optimizer steps over all phases together.
  config.init_from = ""  # Weights to start from when the workdir has no checkpoint: a bertjax checkpoint dir, a Hugging Face model dir or the original release's TF1 checkpoint dir.
  config.compile_cache_dir = "compile_cache"  # Persistent XLA compilation cache: relative to the workdir, or an absolute or gs:// path; "" turns it off. A restart of the same config compiles from it.
  config.allow_changes = ""  # Comma-separated fields (e.g. total_steps,phases.*.train_files) that may differ from the run recorded in workdir/config.json when resuming; logged.

  # The architecture (bertjax.model.config.BertConfig).
  config.model = ml_collections.ConfigDict()
  config.model.vocab_size = 30522  # At least the data's vocab size (checked against metadata.json); 0 takes the data's.
  config.model.vocab_multiple = 128  # Word table and MLM bias padded to a multiple of this (MXU lanes); exports carry vocab_size rows.
  config.model.hidden_size = 768  # H.
  config.model.num_layers = 12  # L.
  config.model.num_heads = 12  # A; hidden_size must be divisible by it.
  config.model.intermediate_size = 3072  # Feed-forward width, 4H.
  config.model.hidden_dropout_rate = 0.1  # Dropout on embeddings and sublayer outputs.
  config.model.attention_dropout_rate = 0.1  # Dropout on attention probabilities, as in the paper; only XLA attention and the flash kernel (by name) drop them.
  config.model.max_position_embeddings = 512  # Learned positions, sized for the last phase from the start.
  config.model.type_vocab_size = 2  # Segments A and B.
  config.model.initializer_range = 0.02  # Stddev of the truncated-normal init.
  config.model.layer_norm_eps = 1e-12  # As in the original release.
  config.model.dtype = "bfloat16"  # Compute dtype of matmuls; softmax, LayerNorm and losses stay fp32.
  config.model.param_dtype = "float32"  # Parameters and optimizer state.
  config.model.scan_layers = True  # Stack layers with nn.scan: one compiled layer.
  config.model.layer_loop = "auto"  # How stacked layers run: scan (a loop over one compiled layer) | unroll (each layer its own code; longer compiles) | auto (unroll on the CPU at hidden size 256 or more, where it measured faster; scan elsewhere; docs/performance.md).
  config.model.remat_policy = "none"  # none | full | dots | dots_no_batch: activation recomputation.
  config.model.attention_impl = "auto"  # auto (a fused kernel only where proven on the platform, else XLA; docs/attention.md) | xla | splash (TPU) | cudnn (GPU) | flash (TPU, GPU); splash and cudnn need attention_dropout_rate 0.
  config.model.causal = False  # Causal attention: pretraining sets it from objective (ltr); fine-tuning takes it from init_from's checkpoint.

  # Where batches come from.
  config.data = ml_collections.ConfigDict()
  config.data.source = "tfrecord"  # tfrecord | synthetic (random tokens, for benchmarks).
  config.data.demo_dir = ""  # If set, build the pydoc demo corpus and TFRecords there when absent and train on them.
  config.data.vocab_hash = ""  # If set, must equal the vocab hash in each phase's metadata.json.
  config.data.order = "files"  # files: hosts read disjoint files; global: one order for any host count (resume on a different slice size).
  config.data.shuffle_block = 1  # Records moved together when shuffling; larger reads faster from gs://.
  config.data.skip_corrupt = False  # Skip and count corrupt records instead of stopping with the file's name.
  config.data.dynamic_masking = False  # Re-mask on the fly each epoch (RoBERTa style) instead of the stored masks.
  config.data.masked_lm_prob = 0.15  # Masking rate used by dynamic masking.
  config.data.prefetch = 2  # Batches kept in flight on the devices.
  # Sequence packing (docs/packing.md): off keeps the paper's one example per row.
  config.data.packing = False  # Pack several examples into each row as batches are read. Evaluation scores the same examples with the same sums (to float rounding) as unpacked; a training step gets examples of its chunk of packing_chunk_steps steps, reordered, less any packing_overflow.
  config.data.packing_factor = 1.25  # Examples per packed row the batch is sized for: packing_chunk_steps steps' global_batch_size examples each go into global_batch_size / packing_factor rows per step (a whole number, divisible by the hosts and data-parallel devices); an example that fits in no row is left out, counted as packing_overflow. packing_bench measures it for your data.
  config.data.packing_chunk_steps = 16  # Steps whose examples are packed together (one resume reads one chunk); larger chunks average the lengths out and leave fewer rows part-empty.
  config.data.packing_max_examples_per_row = 3  # At most this many examples (and next-sentence pairs) in a row; at least packing_factor.
  config.data.packing_max_predictions_per_row = 0  # Masked-LM slots per packed row, at least the phase's max_predictions_per_seq and at most its max_seq_length; 0 takes min(max_predictions_per_seq + max_examples_per_row, max_seq_length): a row holds about as many predictions as one full-length record; every slot costs a masked-LM projection each step.

  # The sequence-length schedule: phases run in this order; fractions of
  # total_steps add up to 1; one learning-rate schedule spans them.
  config.phases = ml_collections.ConfigDict()
  config.phases.seq128 = _phase(
      fraction=0.9, max_seq_length=128, max_predictions_per_seq=20, global_batch_size=256)
  config.phases.seq512 = _phase(
      fraction=0.1, max_seq_length=512, max_predictions_per_seq=80, global_batch_size=256)

  # AdamW with the paper's hyperparameters; bias_correction=False and schedule='original' make it the original release's optimizer exactly.
  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.name = "adamw"  # adamw | lamb (large batches).
  config.optimizer.learning_rate = 1e-4  # Peak learning rate.
  config.optimizer.b1 = 0.9  # Adam beta1.
  config.optimizer.b2 = 0.999  # Adam beta2.
  config.optimizer.eps = 1e-6  # Adam epsilon, as in the original release.
  config.optimizer.weight_decay = 0.01  # Decoupled decay; never on LayerNorm parameters or biases.
  config.optimizer.bias_correction = True  # False: the original release's Adam (no bias correction).
  config.optimizer.schedule = "linear"  # linear: decay from the peak after warmup | original: the original release's (decay from step 0 under the warmup); with bias_correction=False, the original's optimizer exactly.
  config.optimizer.clip_norm = 1.0  # Global gradient-norm clipping; 0 disables.
  config.optimizer.warmup_steps = 10_000  # Linear warmup from 0 to the peak.
  config.optimizer.end_learning_rate = 0.0  # Linear decay ends here at total_steps.
  config.optimizer.per_phase_warmup = False  # Restart warmup (phase.warmup_steps) at each phase, decaying to the phase's end.
  config.optimizer.grad_accum_steps = 1  # Micro-batches per step; the global batch is split into this many.
  config.optimizer.max_nonfinite_in_a_row = 10  # A step with a non-finite loss, gradient or updated parameters is skipped (state kept) and counted; this many in a row stop the run.

  # The device mesh: each axis is its size inside a slice (ICI) times its size
  # across slices (DCN, the data-center network); -1 takes what remains.
  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # Pure data parallelism (replicated parameters) inside a slice; -1: the slice's remaining devices.
  config.mesh.fsdp = 1  # Parameters and optimizer state sharded, batch split too, inside a slice.
  config.mesh.tensor = 1  # Heads and feed-forward split (Megatron style) inside a slice.
  config.mesh.dcn_data = -1  # Data parallelism across slices; -1: the number of slices (1 on devices that name no slice).
  config.mesh.dcn_fsdp = 1  # FSDP across slices (parameter all-gathers over the DCN every step: rarely worth it).
  config.mesh.dcn_tensor = 1  # Tensor parallelism across slices (activations over the DCN every layer: not advised).
  # Logical axis -> mesh axes: the one sharding table for parameters and activations.
  config.mesh.rules = (
      ("activation_batch", ("data", "fsdp")),
      ("activation_length", None),
      ("activation_embed", None),
      ("activation_heads", "tensor"),
      ("activation_kv", None),
      ("activation_mlp", "tensor"),
      ("vocab", ("tensor", "fsdp")),  # The word table and MLM bias: their vocab axis carries all the sharding ...
      ("vocab_embed", None),  # ... and the table's embed axis none: XLA miscompiles gradients with it on fsdp while the batch is too (model/decoder.py: tied_logits).
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("kv", None),
      ("mlp", "tensor"),
      ("hidden", "tensor"),
      ("layers", None),
      ("norm", None),
      ("position", None),
      ("segment", None),
      ("classes", None),
  )

  # Checkpoints (orbax) in workdir/checkpoints.
  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every_steps = 10_000  # Save every this many steps, and always at the end.
  config.checkpoint.keep = 3  # Keep the latest this many.
  config.checkpoint.async_save = True  # Write in the background while training goes on.

  # Logging and evaluation.
  config.logging = ml_collections.ConfigDict()
  config.logging.every_steps = 100  # Console line and TensorBoard scalars every this many steps.
  config.logging.eval_every_steps = 50_000  # Held-out evaluation; 0 evaluates only at phase ends.
  config.logging.eval_batches = 100  # Held-out records scored: the first eval_batches x the phase's global_batch_size, the same records packed or not (so eval figures compare); 0 reads the whole eval set.
  config.logging.profile_steps = (0, 0)  # (first step, number of steps) traced with jax.profiler into workdir/tensorboard (TensorBoard's profile plugin); 0 steps traces nothing.
  config.logging.peak_tflops = 0.0  # Peak bf16 TFLOP/s per chip for MFU; 0 looks it up by device kind.
  return config


def _phase(*, fraction, max_seq_length, max_predictions_per_seq, global_batch_size):
  """One phase of the sequence-length schedule."""
  p = ml_collections.ConfigDict()
  p.fraction = fraction  # Share of total_steps spent in this phase.
  p.max_seq_length = max_seq_length  # Sequence length of this phase's records.
  p.max_predictions_per_seq = max_predictions_per_seq  # Masked positions per sequence.
  p.global_batch_size = global_batch_size  # Sequences per optimizer step over all hosts.
  p.train_files = ""  # Glob of training TFRecords (local or gs://).
  p.eval_files = ""  # Glob of held-out TFRecords; empty skips evaluation.
  p.warmup_steps = 0  # Warmup at the phase's start when optimizer.per_phase_warmup.
  p.remat_policy = ""  # This phase's model.remat_policy (none | full | dots | dots_no_batch); empty: the model's. `python -m bertjax.fit --remat_policy=...` shows what fits.
  return p
