"""BERT's building blocks: embeddings, self-attention, feed-forward, one layer.

Every parameter carries logical axis names (vocab, embed, heads, kv, mlp,
hidden, layers, ...) and every large activation a logical constraint; the
rules table in the run config maps both onto mesh axes.

Shapes in names: B batch, L sequence length, D hidden size, N heads,
H head size, F feed-forward width.
"""

import functools
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import attention
from bertjax.model import decoder
from bertjax.model import products
from bertjax.model.config import BertConfig
from bertjax.model.dropout import Dropout

BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")
# The word table's logical axes: its embed axis has a name of its own so that
# the rules can keep it off the batch's mesh axes (see decoder.tied_logits).
WORD_TABLE_AXES = ("vocab", "vocab_embed")


def kernel_init(config: BertConfig, axes: tuple[str | None, ...]) -> Callable:
  """Truncated normal(initializer_range), as in the original release."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(stddev=config.initializer_range), axes)


def zeros_init(axes: tuple[str | None, ...]) -> Callable:
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis, in fp32, with a written-out gradient.

  y = (x - mean) / sqrt(var + eps) * scale + bias, with var the mean squared
  deviation; the parameters are named and partitioned as flax's
  nn.LayerNorm's ('scale', 'bias'; logical axis 'norm'). The backward pass
  keeps the normalised x and the per-row 1 / sqrt(var + eps) only, where
  autodiff of the formula keeps three [..., D] arrays: with scanned layers
  each of them is a stacked residual of every layer.
  """
  epsilon: float
  param_dtype: str = "float32"

  @nn.compact
  def __call__(self, x):
    features = (x.shape[-1],)
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             ("norm",)),
                       features, self.param_dtype)
    bias = self.param("bias", zeros_init(("norm",)), features, self.param_dtype)
    return normalise(x, scale, bias, self.epsilon)


def layer_norm(config: BertConfig, name: str) -> LayerNorm:
  """LayerNorm computed in fp32 whatever the compute dtype."""
  return LayerNorm(config.layer_norm_eps, config.params_dtype, name=name)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def normalise(x, scale, bias, epsilon: float):
  """The LayerNorm function: fp32 output, gradient through (x_hat, rstd)."""
  return _normalise_fwd(x, scale, bias, epsilon)[0]


def _normalise_fwd(x, scale, bias, epsilon):
  x32 = x.astype(jnp.float32)
  centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
  rstd = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
  x_hat = centred * rstd
  y = x_hat * scale.astype(jnp.float32) + bias.astype(jnp.float32)
  # The zero-size array carries x's dtype to the backward pass.
  return y, (x_hat, rstd, scale, bias, jnp.zeros((0,), x.dtype))


def _normalise_bwd(epsilon, residuals, g):
  del epsilon
  x_hat, rstd, scale, bias, x_like = residuals
  g32 = g.astype(jnp.float32)
  rows = tuple(range(g.ndim - 1))
  d_scale = jnp.sum(g32 * x_hat, axis=rows).astype(scale.dtype)
  d_bias = jnp.sum(g32, axis=rows).astype(bias.dtype)
  d_hat = g32 * scale.astype(jnp.float32)
  dx = rstd * (d_hat - jnp.mean(d_hat, axis=-1, keepdims=True)
               - x_hat * jnp.mean(d_hat * x_hat, axis=-1, keepdims=True))
  return dx.astype(x_like.dtype), d_scale, d_bias


normalise.defvjp(_normalise_fwd, _normalise_bwd)


@jax.custom_vjp
def gelu(x):
  """The exact GELU, x * Phi(x) (Phi the standard normal CDF, through erf).

  Its gradient keeps only x for the backward pass, which recomputes
  Phi(x) + x * phi(x) from it in fp32. Autodiff of the formula keeps erf's
  and exp's intermediates too: with scanned layers every kept [B, L, F]
  array is a stacked residual that XLA cannot recompute across the loop, so
  this halves the feed-forward's saved activations (x here and the GELU
  output, which the output projection's weight gradient reads).

  Phi(x) is 0.5 * (1 + erf(x / sqrt(2))), the formula of transformers'
  PyTorch BERT (torch's gelu), in fp32. jax.nn.gelu forms it through erfc,
  which is more precise in relative terms where Phi(x) is small (x below
  about -3; the two GELUs differ by less than 1e-6 anywhere) and costs
  about twice as much on the CPU: XLA expands erfc into three polynomials,
  an exponential and two divisions for every element.
  """
  x32 = x.astype(jnp.float32)
  return (x32 * (0.5 * (1.0 + jax.lax.erf(x32 * (1.0 / math.sqrt(2.0)))))).astype(x.dtype)


def _gelu_fwd(x):
  return gelu(x), x


def _gelu_bwd(x, g):
  x32 = x.astype(jnp.float32)
  cdf = 0.5 * (1.0 + jax.lax.erf(x32 * (1.0 / math.sqrt(2.0))))
  pdf = jnp.exp(-0.5 * x32 * x32) * (1.0 / math.sqrt(2.0 * math.pi))
  return ((g.astype(jnp.float32) * (cdf + x32 * pdf)).astype(g.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


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
    y = products.contract_trailing(x.astype(c.compute_dtype),
                                   kernel.astype(c.compute_dtype), self.contract)
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
        param_dtype=c.params_dtype, embedding_init=init(WORD_TABLE_AXES))
    self.position_embeddings = nn.Embed(
        c.max_position_embeddings, c.hidden_size, dtype=c.compute_dtype,
        param_dtype=c.params_dtype, embedding_init=init(("position", "embed")))
    self.token_type_embeddings = nn.Embed(
        c.type_vocab_size, c.hidden_size, dtype=c.compute_dtype,
        param_dtype=c.params_dtype, embedding_init=init(("segment", "embed")))
    self.layer_norm = layer_norm(c, "layer_norm")
    self.dropout = Dropout(c.hidden_dropout_rate)

  def __call__(self, ids_BxL, segment_ids_BxL, deterministic: bool, position_ids_BxL=None):
    """position_ids_BxL: each token's position (packed rows restart them per
    example); None for 0, 1, ..., L-1."""
    length = ids_BxL.shape[1]
    if length > self.config.max_position_embeddings:
      raise ValueError(
          f"sequence length {length} exceeds model.max_position_embeddings="
          f"{self.config.max_position_embeddings}")
    # The tables are read in the parameter dtype (fp32) and the sum normalised
    # in fp32, so no lookup's gradient is a scatter-add in the compute
    # dtype: added up in bf16 on a GPU, where the rows that every sequence
    # shares ([CLS], [SEP], padding, each position, each segment) take
    # thousands of colliding additions, it was half of BERT-BASE's step
    # (docs/benchmarks.md). Unpacked positions are a slice and the segment
    # rows a selection, so their gradients are sums, not scatter-adds.
    positions_PxD = self.position_embeddings.embedding
    x_BxLxD = (jnp.take(self.word_embeddings.embedding, ids_BxL, axis=0)
               + (positions_PxD[None, :length] if position_ids_BxL is None
                  else jnp.take(positions_PxD, position_ids_BxL, axis=0))
               + small_table_rows(self.token_type_embeddings.embedding, segment_ids_BxL))
    x_BxLxD = self.layer_norm(x_BxLxD).astype(self.config.compute_dtype)
    x_BxLxD = self.dropout(x_BxLxD, deterministic=deterministic)
    return nn.with_logical_constraint(x_BxLxD, BATCH_LENGTH_EMBED)

  def attend(self, x_BxPxD, bias_V):
    """Logits [B, P, padded vocab] in fp32 against the word table plus a bias
    (the tied MLM decoder), padded columns at the most negative float."""
    return decoder.tied_logits(x_BxPxD, self.word_embeddings.embedding, bias_V,
                               self.config)


def small_table_rows(table_VxD, ids):
  """table_VxD[ids] for a table of a few rows (the segment embeddings).

  Selected row by row, so the table's gradient is a masked sum per row (a
  reduction) instead of a scatter-add; ids outside [0, V) give NaN, as
  jnp.take's default does.
  """
  out = jnp.full(ids.shape + table_VxD.shape[1:], jnp.nan, table_VxD.dtype)
  for v in range(table_VxD.shape[0]):
    out = jnp.where((ids == v)[..., None], table_VxD[v], out)
  return out


class SelfAttention(nn.Module):
  """Multi-head self-attention over the unpadded keys (kernel: model/attention.py)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxL, deterministic: bool, queries_BxQxD=None):
    """Queries from `queries_BxQxD` (default: x itself), keys and values from x."""
    c = self.config
    qkv_axes = ("embed", "heads", "kv")
    features = (c.num_heads, c.head_dim)
    q = dense(c, features, qkv_axes, "query")(
        x_BxLxD if queries_BxQxD is None else queries_BxQxD)
    k = dense(c, features, qkv_axes, "key")(x_BxLxD)
    v = dense(c, features, qkv_axes, "value")(x_BxLxD)
    heads_axes = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
    q, k, v = (nn.with_logical_constraint(t, heads_axes) for t in (q, k, v))

    out_BxLxNxH = attention.attend(
        q, k, v, mask_BxL, impl=c.attention_impl,
        attention_dropout_rate=c.attention_dropout_rate, dtype=c.dtype,
        dropout=Dropout(c.attention_dropout_rate), deterministic=deterministic,
        causal=c.causal)
    out_BxLxNxH = nn.with_logical_constraint(out_BxLxNxH, heads_axes)
    return dense(c, c.hidden_size, ("heads", "kv", "embed"), "output",
                 contract=2)(out_BxLxNxH)


class FeedForward(nn.Module):
  """Dense(4D) + exact GELU (layers.gelu) + Dense(D)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    c = self.config
    h_BxLxF = dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate")(x_BxLxD)
    h_BxLxF = gelu(h_BxLxF)
    h_BxLxF = nn.with_logical_constraint(
        h_BxLxF, ("activation_batch", "activation_length", "activation_mlp"))
    return dense(c, c.hidden_size, ("mlp", "embed"), "output")(h_BxLxF)


class TransformerLayer(nn.Module):
  """One post-LN encoder layer. Returns (x, None) so that nn.scan can stack it.

  With `positions_BxQ` the layer computes its output only at those
  positions (keys and values still come from every token) and returns
  [B, Q, D]: what the last layer needs when only some positions are read.
  mask_BxL is the boolean padding mask or packed-example ids
  (attention.attend).
  """
  config: BertConfig
  deterministic: bool

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxL, positions_BxQ=None):
    c = self.config
    drop = Dropout(c.hidden_dropout_rate)
    queries = None
    if positions_BxQ is not None:
      queries = jnp.take_along_axis(x_BxLxD, positions_BxQ[..., None].astype(jnp.int32), axis=1)
      if attention.is_packed(mask_BxL):
        # Packed-example ids: each query keeps to its own example's keys.
        query_ids_BxQ = jnp.take_along_axis(mask_BxL, positions_BxQ.astype(jnp.int32), axis=1)
        mask_BxL = attention.packed_mask(query_ids_BxQ, mask_BxL)
    h = SelfAttention(c, name="attention")(x_BxLxD, mask_BxL, self.deterministic, queries)
    h = drop(h, deterministic=self.deterministic)
    if queries is not None:
      x_BxLxD = queries
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
  """The stack of layers, scanned (params stacked on a 'layers' axis) or unrolled.

  With `positions_BxQ` the last layer runs only at those positions and the
  encoder returns [B, Q, D] (the parameters are the same either way). With
  `all_layers` it returns every layer's output, [num_layers, B, L, D] (layer
  0 first). The scanned stack is created by nn.scan and run by run_stack.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxL, deterministic: bool, positions_BxQ=None,
               all_layers: bool = False):
    c = self.config
    if all_layers and positions_BxQ is not None:
      raise ValueError("Encoder: all_layers returns every position; give no positions")
    layer_cls = _layer_class(c)
    if not c.scan_layers:
      outputs = []
      for i in range(c.num_layers):
        last = positions_BxQ if i == c.num_layers - 1 else None
        x_BxLxD, _ = layer_cls(c, deterministic, name=f"layer_{i}")(x_BxLxD, mask_BxL, last)
        outputs.append(x_BxLxD)
      return jnp.stack(outputs) if all_layers else x_BxLxD
    if self.is_initializing():
      # Initialisation creates the stacked parameters through nn.scan.
      stack = _scan(layer_cls, c.num_layers)(c, deterministic, name="layers")
      out_BxLxD = stack(x_BxLxD, mask_BxL, None)[0]
      if not all_layers:
        if positions_BxQ is None:
          return out_BxLxD
        return jnp.take_along_axis(out_BxLxD, positions_BxQ[..., None].astype(jnp.int32),
                                   axis=1)
    rng = None if deterministic else self.make_rng("dropout")
    stacked = nn.unbox(self.variables["params"]["layers"])
    return run_stack(c, deterministic, stacked, x_BxLxD, mask_BxL, positions_BxQ, rng,
                     all_layers)


def _layer_class(c: BertConfig):
  if c.remat_policy == "none":
    return TransformerLayer
  return nn.remat(TransformerLayer, policy=REMAT[c.remat_policy], prevent_cse=not c.scan_layers)


def _scan(layer_cls, length: int):
  return nn.scan(
      layer_cls, variable_axes={"params": 0},
      split_rngs={"params": True, "dropout": True},
      in_axes=(nn.broadcast, nn.broadcast), length=length,
      metadata_params={nn.PARTITION_NAME: "layers"})


def _parameters_recomputed(policy, stacked):
  """`policy`, except that values computed from parameters alone are not kept.

  An operation whose inputs all have the shape of a stacked parameter, of
  one layer's slice of it, or no shape (the layer index) is recomputed in
  the backward pass: that covers reading a layer out of the stack and any
  reshape or cast of the slice. (A same-shaped activation would only be
  recomputed too, never computed wrongly.)
  """
  shapes = set()
  for a in jax.tree.leaves(stacked):
    shapes.update((tuple(a.shape), tuple(a.shape[1:]), (1,) + tuple(a.shape[1:])))

  def saveable(prim, *avals, **params):
    if all(tuple(a.shape) in shapes or not a.shape for a in avals):
      return False
    return policy(prim, *avals, **params)
  return saveable


def _kernels_in_compute_dtype(c: BertConfig, stacked):
  """The stack's matrices ([L, ...] of 3 or more axes) cast to the compute dtype
  once, before the loops: each Dense casts its kernel to that dtype anyway
  (the same values), but a cast inside the loop is a cast of the whole stack
  hoisted out of it, which the backward loop makes again. Biases and
  LayerNorm parameters stay as they are."""
  dtype = jnp.dtype(c.compute_dtype)
  cast = lambda a: (a.astype(dtype) if a.ndim >= 3 and jnp.issubdtype(a.dtype, jnp.floating)
                    and a.dtype != dtype else a)
  return jax.tree.map(cast, stacked)


# model.layer_loop=auto unrolls on the CPU from this hidden size on (measured
# in docs/performance.md: faster at hidden size 256, slower for the demo's 128).
UNROLL_MIN_HIDDEN = 256


def unrolls(c: BertConfig, platform: str | None = None) -> bool:
  """Whether the stacked layers run unrolled on `platform` (default: the one
  being compiled for): model.layer_loop, whose auto unrolls on the CPU at a
  hidden size of UNROLL_MIN_HIDDEN or more."""
  if c.layer_loop == "auto":
    return ((platform or attention.target_platform()) == "cpu"
            and c.hidden_size >= UNROLL_MIN_HIDDEN)
  return c.layer_loop == "unroll"


def unrolled_stack(c: BertConfig, run_layer, stacked, x_BxLxD, positions_BxQ,
                   all_layers: bool):
  """The stack's layers one after another, layer i on stacked[i] (a constant
  index), the last at `positions_BxQ` where given; the same function as the
  loop, layer i's dropout from fold_in(rng, i) as there.

  With no loop, XLA schedules and fuses across layers and keeps each layer's
  activations as they are (a loop stacks them for its backward pass). With
  remat_policy none the backward pass keeps each layer's slice of the stack
  (together one copy of the layers' parameters in the compute dtype); with
  a recomputation policy the slice is read again there instead.
  """
  last = c.num_layers - 1
  policy = _parameters_recomputed(REMAT[c.remat_policy], stacked) if (
      c.remat_policy != "none") else None
  outputs = []
  for i in range(c.num_layers):
    positions = positions_BxQ if i == last else None

    def layer_i(stacked, x_BxLxD, i=i, positions=positions):
      params = jax.tree.map(lambda a: a[i], stacked)
      return run_layer(params, x_BxLxD, i, positions)
    if policy is not None:
      layer_i = jax.checkpoint(layer_i, policy=policy, prevent_cse=False)
    x_BxLxD = layer_i(stacked, x_BxLxD)
    outputs.append(x_BxLxD)
  return jnp.stack(outputs) if all_layers else x_BxLxD


def run_stack(c: BertConfig, deterministic: bool, stacked, x_BxLxD, mask_BxL,
              positions_BxQ, rng, all_layers: bool = False):
  """The scanned encoder's layers over stacked parameters ([L, ...] each).

  Without positions every layer runs at every position, a loop over the
  stack; with `all_layers` the loop also returns each layer's output
  ([num_layers, B, L, D]). With `positions_BxQ`, layers 0..L-2 run in a loop over all
  positions and layer L-1 only at those positions ([B, Q, D] out): that
  loop reads layer i out of the whole stack by index, and the backward pass
  recomputes the read instead of keeping it, so no copy of the stack
  ([:L-1] would be one) is made in either direction. Layer i draws its
  dropout from fold_in(rng, i) either way.

  With model.layer_loop unroll (auto's choice on the CPU for a model of
  hidden size 256 or more) there is no loop: layer i runs on its slice of
  the stack, read by a constant index (unrolled_stack).
  """
  layer = TransformerLayer(c, deterministic, parent=None)
  policy = REMAT.get(c.remat_policy, jax.checkpoint_policies.everything_saveable)
  stacked = _kernels_in_compute_dtype(c, stacked)

  def run_layer(params, x_BxLxD, i, positions=None):
    rngs = None if rng is None else {"dropout": jax.random.fold_in(rng, i)}
    return layer.apply({"params": params}, x_BxLxD, mask_BxL, positions, rngs=rngs)[0]

  if unrolls(c):
    return unrolled_stack(c, run_layer, stacked, x_BxLxD, positions_BxQ, all_layers)

  if positions_BxQ is None:
    step = (run_layer if c.remat_policy == "none"
            else jax.checkpoint(run_layer, policy=policy, prevent_cse=False))
    def body(x, params_i):
      y = step(params_i[0], x, params_i[1])
      return y, (y if all_layers else None)
    last_BxLxD, every_NxBxLxD = jax.lax.scan(body, x_BxLxD, (stacked, jnp.arange(c.num_layers)))
    return every_NxBxLxD if all_layers else last_BxLxD

  @functools.partial(jax.checkpoint, policy=_parameters_recomputed(policy, stacked),
                     static_argnums=(3,))
  def layer_of_stack(stacked, x_BxLxD, i, at_positions: bool):
    params = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), stacked)
    return run_layer(params, x_BxLxD, i, positions_BxQ if at_positions else None)

  x_BxLxD = jax.lax.scan(lambda x, i: (layer_of_stack(stacked, x, i, False), None),
                         x_BxLxD, jnp.arange(c.num_layers - 1))[0]
  return layer_of_stack(stacked, x_BxLxD, c.num_layers - 1, True)
