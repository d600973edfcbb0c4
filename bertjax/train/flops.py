"""Analytic training FLOPs of BERT and model FLOPs utilisation (MFU).

Counted for one training step (forward + backward = 3 x forward), matmuls
only, multiply-add = 2 FLOPs, activation recomputation not counted (MFU,
not hardware utilisation):

  per token, per layer  2 x (4 D^2 + 2 D F)     Q, K, V, output; feed-forward
  attention, per token  2 x 2 x L x D           Q K^T and probabilities x V
  per example           2 x D^2 + 2 x 2 D       pooler and NSP classifier
  per masked position   2 x (D^2 + D V)         MLM transform and tied decoder

A sequence is one row of L tokens; a packed row (bertjax/input/packing.py)
holds E examples, one [CLS] each, where an unpacked row holds one. The last
layer computes its output only where the losses read it, at [CLS] and the P
masked positions: there K and V are counted for all L tokens and the rest
for P + E. The decoder runs only at the P masked positions, never
at all L tokens, and over the padded vocab (model.padded_vocab_size), since
that is what the matmul computes.
"""

from bertjax.model.config import BertConfig

# Peak dense bf16 matmul TFLOP/s per chip, matched by substring of
# jax.Device.device_kind (most specific first).
PEAK_TFLOPS = (
    ("TPU v6 lite", 918.0),  # v6e (Trillium)
    ("TPU v6e", 918.0),
    ("TPU v5p", 459.0),
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v5", 459.0),  # v5p reports itself as "TPU v5"
    ("TPU v4", 275.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
)


# Nominal HBM per chip in GiB, matched the same way. What the TPU compiler lets
# a program use differs (15.75 GiB on a v5e chip); the fit checks use that
# figure (bertjax.fit.topology.available_hbm_bytes), not this table.
HBM_GIB = (
    ("TPU v6 lite", 32.0),
    ("TPU v6e", 32.0),
    ("TPU v5p", 95.0),
    ("TPU v5 lite", 16.0),
    ("TPU v5e", 16.0),
    ("TPU v5", 95.0),
    ("TPU v4", 32.0),
    ("H200", 141.0),
    ("H100", 80.0),
    ("A100", 80.0),
)


def _lookup(table, device_kind: str) -> float | None:
  for name, value in table:
    if name.lower() in device_kind.lower():
      return value
  return None


def hbm_gib(device_kind: str) -> float | None:
  """Nominal HBM of one chip in GiB, or None when unknown."""
  return _lookup(HBM_GIB, device_kind)


def peak_tflops(device_kind: str) -> float | None:
  """Peak bf16 TFLOP/s of one chip, or None when unknown (e.g. CPU)."""
  return _lookup(PEAK_TFLOPS, device_kind)


def forward_flops_per_sequence(c: BertConfig, seq_len: int, num_predictions: int,
                               num_examples: int = 1) -> float:
  """Forward FLOPs of one row with `num_examples` [CLS] slots (1 unless packed)."""
  d, f, v = c.hidden_size, c.intermediate_size, c.padded_vocab_size
  per_query = 2 * (2 * d * d + 2 * d * f) + 2 * 2 * seq_len * d  # Q, output, FFN, attention
  per_token_layer = per_query + 2 * 2 * d * d  # and K, V
  last = seq_len * 2 * 2 * d * d + (num_predictions + num_examples) * per_query
  encoder = (c.num_layers - 1) * seq_len * per_token_layer + last
  heads = num_examples * (2 * d * d + 2 * 2 * d) + num_predictions * 2 * (d * d + d * v)
  return float(encoder + heads)


def train_flops_per_sequence(c: BertConfig, seq_len: int, num_predictions: int,
                             num_examples: int = 1) -> float:
  """FLOPs of forward and backward for one row (see forward_flops_per_sequence)."""
  return 3.0 * forward_flops_per_sequence(c, seq_len, num_predictions, num_examples)


def mfu(c: BertConfig, seq_len: int, num_predictions: int, sequences_per_second: float,
        num_chips: int, peak_tflops_per_chip: float | None, num_examples: int = 1) -> float | None:
  """Achieved model FLOP/s over the peak of all chips; None when the peak is unknown.

  `sequences_per_second` counts rows (packed rows with packing), each with
  `num_examples` [CLS] slots."""
  if not peak_tflops_per_chip:
    return None
  achieved = (train_flops_per_sequence(c, seq_len, num_predictions, num_examples)
              * sequences_per_second)
  return achieved / (num_chips * peak_tflops_per_chip * 1e12)
