"""The model's hyperparameters: a small frozen dataclass, apart from training settings."""

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp

from bertjax.model import attention

REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
LAYER_LOOPS = ("auto", "scan", "unroll")
ATTENTION_IMPLS = attention.IMPLS


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """BERT's architecture (Devlin et al., 2018) plus how it is computed."""
  vocab_size: int  # The real vocab; exports and checkpoint metadata carry this size.
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  hidden_dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02
  # The word table and the MLM output bias get padded_vocab_size rows: the
  # vocab rounded up to a multiple of this (128 fills the TPU MXU's lanes in
  # the MLM decoder; the pretraining configs set it); 1 pads nothing. The
  # padded logit columns hold the most negative float (decoder.tied_logits).
  vocab_multiple: int = 1
  layer_norm_eps: float = 1e-12
  # Compute dtype of matmuls; parameters, softmax, LayerNorm and losses stay fp32.
  dtype: str = "float32"
  param_dtype: str = "float32"
  # Stack the layers with nn.scan (one compiled layer, fast compiles).
  scan_layers: bool = True
  # How the stacked layers run (scan_layers): scan (a loop over one compiled
  # layer) | unroll (each layer its own code over its slice of the stack, so
  # XLA schedules and fuses across layers; longer compiles) | auto: unroll
  # on the CPU at hidden size 256 or more, where it measured faster, scan
  # elsewhere (layers.unrolls).
  layer_loop: str = "auto"
  # What each layer keeps for the backward pass: none (keep everything),
  # full (recompute everything), dots, dots_no_batch (keep matmul outputs).
  remat_policy: str = "none"
  # xla | splash (Pallas, TPU; no attention dropout) | cudnn (GPU, bf16/fp16;
  # no attention dropout) | flash (Pallas, TPU and GPU, with attention
  # dropout) | auto: a fused kernel only where model/kernel_evidence.py
  # records it proven on the platform, XLA otherwise; see model/attention.py.
  attention_impl: str = "auto"
  # Each token attends only to itself and the tokens before it (a left-to-
  # right model: the paper's "LTR & No NSP" ablation). Every attention
  # kernel honours it; exports record it (Hugging Face's is_decoder).
  causal: bool = False
  # BertForPreTraining has the next-sentence head (the paper's objective);
  # False for the objectives without NSP, whose parameters then have no "nsp".
  next_sentence_head: bool = True

  def __post_init__(self):
    def bad(field, why):
      raise ValueError(f"model.{field}: {why}")
    if self.vocab_size is None or self.vocab_size <= 0:
      bad("vocab_size", f"must be a positive integer, got {self.vocab_size}")
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size", "vocab_multiple"):
      if getattr(self, name) <= 0:
        bad(name, f"must be positive, got {getattr(self, name)}")
    if self.hidden_size % self.num_heads:
      bad("hidden_size", f"{self.hidden_size} is not divisible by "
          f"model.num_heads={self.num_heads}")
    for name in ("hidden_dropout_rate", "attention_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        bad(name, f"must be in [0, 1), got {getattr(self, name)}")
    if self.remat_policy not in REMAT_POLICIES:
      bad("remat_policy", f"{self.remat_policy!r} is not one of {REMAT_POLICIES}")
    if self.layer_loop not in LAYER_LOOPS:
      bad("layer_loop", f"{self.layer_loop!r} is not one of {LAYER_LOOPS}")
    if self.attention_impl not in ATTENTION_IMPLS:
      bad("attention_impl", f"{self.attention_impl!r} is not one of {ATTENTION_IMPLS}")
    problem = attention.config_problem(self.attention_impl, self.attention_dropout_rate,
                                       self.dtype)
    if problem:
      raise ValueError(problem)
    for name in ("dtype", "param_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError:
        bad(name, f"{getattr(self, name)!r} is not a dtype name")

  @property
  def padded_vocab_size(self) -> int:
    """Rows of the word table and the MLM bias: vocab_size rounded up to vocab_multiple."""
    return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def params_dtype(self):
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes) -> "BertConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_mapping(cls, m: Mapping[str, Any], **overrides) -> "BertConfig":
    """Builds from a mapping (e.g. config.model), refusing unknown fields."""
    d = dict(m)
    d.update(overrides)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"model: unknown fields {unknown}; known: {sorted(names)}")
    return cls(**d)


# The paper's sizes, with Google's 30,522-token uncased WordPiece vocab.
BASE = dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072)
LARGE = dict(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096)
