"""BERT's building blocks: embeddings, self-attention, feed-forward, one layer.

Every parameter carries logical axis names (vocab, embed, heads, kv, mlp,
hidden, layers, ...) and every large activation a logical constraint; the
rules table in the run config maps both onto mesh axes.

Shapes in names: B batch, L sequence length, D hidden size, N heads,
H head size, F feed-forward width.
"""

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import attention
from bertjax.model.config import BertConfig

BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")


def kernel_init(config: BertConfig, axes: tuple[str | None, ...]) -> Callable:
  """Truncated normal(initializer_range), as in the original release."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(stddev=config.initializer_range), axes)


def zeros_init(axes: tuple[str | None, ...]) -> Callable:
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  """LayerNorm computed in fp32 whatever the compute dtype."""
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps, dtype=jnp.float32,
      param_dtype=config.params_dtype, name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
      bias_init=zeros_init(("norm",)))


class Dense(nn.Module):
  """x . kernel + bias, contracting x's trailing `contract` axes.

  The kernel is created in its final shape (e.g. [D, N, H] for queries), so
  its logical axis names hold from initialisation on.
  """
  config: BertConfig
  features: tuple[int, ...]
  axes: tuple[str | None, ...]
  contract: int = 1

  @nn.compact
  def __call__(self, x):
    c = self.config
    kernel_shape = x.shape[x.ndim - self.contract:] + self.features
    kernel = self.param("kernel", kernel_init(c, self.axes), kernel_shape, c.params_dtype)
    bias = self.param("bias", zeros_init(self.axes[self.contract:]), self.features,
                      c.params_dtype)
    y = jnp.tensordot(x.astype(c.compute_dtype), kernel.astype(c.compute_dtype),
                      axes=self.contract)
    return y + bias.astype(c.compute_dtype)


def dense(config: BertConfig, features, axes, name: str, contract: int = 1) -> Dense:
  """A Dense in the compute dtype with logically named kernel and bias."""
  features = (features,) if isinstance(features, int) else tuple(features)
  return Dense(config, features, tuple(axes), contract, name=name)


class Embeddings(nn.Module):
  """Word + segment + learned position embeddings, then LayerNorm and dropout."""
  config: BertConfig

  def setup(self):
    c = self.config
    init = lambda axes: kernel_init(c, axes)
    self.word_embeddings = nn.Embed(
        c.padded_vocab_size, c.hidden_size, dtype=c.compute_dtype,
        param_dtype=c.params_dtype, embedding_init=init(("vocab", "embed")))
    self.position_embeddings = nn.Embed(
        c.max_position_embeddings, c.hidden_size, dtype=c.compute_dtype,
        param_dtype=c.params_dtype, embedding_init=init(("position", "embed")))
    self.token_type_embeddings = nn.Embed(
        c.type_vocab_size, c.hidden_size, dtype=c.compute_dtype,
        param_dtype=c.params_dtype, embedding_init=init(("segment", "embed")))
    self.layer_norm = layer_norm(c, "layer_norm")
    self.dropout = nn.Dropout(c.hidden_dropout_rate)

  def __call__(self, ids_BxL, segment_ids_BxL, deterministic: bool):
    length = ids_BxL.shape[1]
    if length > self.config.max_position_embeddings:
      raise ValueError(
          f"sequence length {length} exceeds model.max_position_embeddings="
          f"{self.config.max_position_embeddings}")
    x_BxLxD = (self.word_embeddings(ids_BxL)
               + self.position_embeddings(jnp.arange(length)[None, :])
               + self.token_type_embeddings(segment_ids_BxL))
    x_BxLxD = self.layer_norm(x_BxLxD).astype(self.config.compute_dtype)
    x_BxLxD = self.dropout(x_BxLxD, deterministic=deterministic)
    return nn.with_logical_constraint(x_BxLxD, BATCH_LENGTH_EMBED)

  def attend(self, x_BxPxD):
    """Logits against the (padded) word table (the tied MLM decoder), in fp32."""
    table_VxD = self.word_embeddings.embedding
    return jnp.einsum("bpd,vd->bpv", x_BxPxD.astype(self.config.compute_dtype),
                      table_VxD.astype(self.config.compute_dtype),
                      preferred_element_type=jnp.float32)


class SelfAttention(nn.Module):
  """Multi-head self-attention over the unpadded keys (kernel: model/attention.py)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxL, deterministic: bool):
    c = self.config
    qkv_axes = ("embed", "heads", "kv")
    features = (c.num_heads, c.head_dim)
    q = dense(c, features, qkv_axes, "query")(x_BxLxD)
    k = dense(c, features, qkv_axes, "key")(x_BxLxD)
    v = dense(c, features, qkv_axes, "value")(x_BxLxD)
    heads_axes = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
    q, k, v = (nn.with_logical_constraint(t, heads_axes) for t in (q, k, v))

    out_BxLxNxH = attention.attend(
        q, k, v, mask_BxL, impl=c.attention_impl,
        attention_dropout_rate=c.attention_dropout_rate, dtype=c.dtype,
        dropout=nn.Dropout(c.attention_dropout_rate), deterministic=deterministic)
    out_BxLxNxH = nn.with_logical_constraint(out_BxLxNxH, heads_axes)
    return dense(c, c.hidden_size, ("heads", "kv", "embed"), "output",
                 contract=2)(out_BxLxNxH)


class FeedForward(nn.Module):
  """Dense(4D) + exact GELU + Dense(D)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    c = self.config
    h_BxLxF = dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate")(x_BxLxD)
    h_BxLxF = nn.gelu(h_BxLxF, approximate=False)
    h_BxLxF = nn.with_logical_constraint(
        h_BxLxF, ("activation_batch", "activation_length", "activation_mlp"))
    return dense(c, c.hidden_size, ("mlp", "embed"), "output")(h_BxLxF)


class TransformerLayer(nn.Module):
  """One post-LN encoder layer. Returns (x, None) so that nn.scan can stack it."""
  config: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxL):
    c = self.config
    drop = nn.Dropout(c.hidden_dropout_rate)
    h = SelfAttention(c, name="attention")(x_BxLxD, mask_BxL, self.deterministic)
    h = drop(h, deterministic=self.deterministic)
    x_BxLxD = layer_norm(c, "attention_layer_norm")(x_BxLxD + h).astype(c.compute_dtype)
    h = FeedForward(c, name="mlp")(x_BxLxD)
    h = drop(h, deterministic=self.deterministic)
    x_BxLxD = layer_norm(c, "output_layer_norm")(x_BxLxD + h).astype(c.compute_dtype)
    return nn.with_logical_constraint(x_BxLxD, BATCH_LENGTH_EMBED), None


REMAT = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class Encoder(nn.Module):
  """The stack of layers, scanned (params stacked on a 'layers' axis) or unrolled."""
  config: BertConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxL, deterministic: bool):
    c = self.config
    layer_cls = TransformerLayer
    if c.remat_policy != "none":
      layer_cls = nn.remat(layer_cls, policy=REMAT[c.remat_policy],
                           prevent_cse=not c.scan_layers)
    if c.scan_layers:
      stack = nn.scan(
          layer_cls, variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=nn.broadcast, length=c.num_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})
      x_BxLxD, _ = stack(c, deterministic, name="layers")(x_BxLxD, mask_BxL)
    else:
      for i in range(c.num_layers):
        x_BxLxD, _ = layer_cls(c, deterministic, name=f"layer_{i}")(x_BxLxD, mask_BxL)
    return x_BxLxD
