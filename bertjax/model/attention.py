"""Scaled dot-product attention over BERT's padded sequences, in four kernels.

- `xla`: plain einsum attention with an fp32 softmax and dropout on the
  probabilities; runs everywhere, and is the reference of the others.
- `splash`: the Pallas splash-attention kernel (TPU): a bidirectional
  FullMask, the padding as segment ids (real tokens 1, padding 0, so a real
  query sees only real keys), lengths padded to a multiple of 128, vmapped
  over the batch and, under a mesh, run per shard with shard_map (batch over
  the data axes, heads over the tensor axis). On CPU it runs in Pallas
  interpret mode, for tests only.
- `cudnn`: cuDNN flash attention through jax.nn.dot_product_attention
  (GPU, bf16/fp16), the padding as per-sequence lengths, which assumes
  right padding (BERT's input_mask is 1...1 0...0).
- `flash`: flash attention with dropout on the probabilities inside the
  kernel (Pallas; flash_tpu.py on TPU, flash_gpu.py on GPU through Triton),
  forward and backward; the padding or packed-example ids as segment ids,
  lengths padded to a multiple of 128, run per shard with shard_map under a
  mesh as splash is. Its keep-mask is dropout.attention_keep_mask's, formed
  in the kernel from the row words of the queries and the column words of
  the keys, global indices, so it drops what XLA attention drops for the
  same key, on any mesh. On CPU it runs the
  TPU kernel in Pallas interpret mode, for tests only.

With `causal` (a left-to-right model) each query sees only the keys at
its own position and before: XLA masks the logits, splash takes a
CausalMask instead of the FullMask, cuDNN `is_causal` and flash masks
each block's logits (skipping blocks wholly after the queries). Queries at
some positions only (the last pretraining layer) are refused with it: the causal
objective predicts at every position.

Packed rows (several examples per row, input/packing.py) give the kernels
the packed-example ids [B, L] (int, 0 for padding) instead of the boolean
padding mask: XLA builds the block-diagonal mask from them, splash and
flash take them as their segment ids, and cuDNN is refused
(jax.nn.dot_product_attention takes per-row lengths or a dense mask, but no
segment ids; bertjax passes it lengths). A query subset
(the last layer) gets a boolean [B, Q, S] mask and always runs XLA.

Splash and cuDNN have no attention dropout; flash has. `auto` takes a
fused kernel only where kernel_evidence.py records that it is proven on
that platform (BERT-LARGE's train step compiles within a bound, and it beats
XLA attention there), for that step (with or without attention dropout),
length and jax release; XLA attention everywhere else, and on CPU. Every
fused kernel runs by name.
It logs its choice and the reason once per distinct choice.

Shapes in names: B batch, L sequence length, N heads, H head size.
"""

import functools
import math

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import dropout as dropout_lib
from bertjax.model import kernel_evidence
from bertjax.model.dropout import apply_keep_mask

IMPLS = ("auto", "xla", "splash", "cudnn", "flash")
FUSED = ("splash", "cudnn", "flash")
# The platform each fused kernel runs on (splash and flash also on CPU, interpreted).
PLATFORMS = {"splash": ("tpu", "cpu"), "cudnn": ("gpu",), "flash": ("tpu", "gpu", "cpu")}
NO_DROPOUT = ("splash", "cudnn")  # The fused kernels without attention dropout.
PER_SHARD = ("splash", "flash")  # Run per shard under a mesh (shard_map).
SPLASH_LANES = 128  # Splash and flash blocks are multiples of this; so must L be.
SPLASH_MAX_BLOCK = 512
CUDNN_DTYPES = ("bfloat16", "float16")
# XLA attention's batch slices on one CPU device (batch_slices).
CPU_BATCH_SLICES = 4

PACKED_CUDNN = ("model.attention_impl='cudnn' does not take packed rows: "
                "jax.nn.dot_product_attention has no segment (packed-example) ids, and "
                "bertjax's cuDNN path passes per-row lengths, not a dense [B, L, L] mask "
                "(a bias the size of the logits): set model.attention_impl to 'auto' or "
                "'xla', or data.packing=False")

_logged: set[tuple[str, str]] = set()


def target_platform() -> str:
  """The platform being compiled for: the mesh's devices, else the default backend.

  An ahead-of-time compile for a TPU topology on a CPU host says `tpu`.
  """
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  return device.platform if device is not None else jax.default_backend()


def config_problem(impl: str, attention_dropout_rate: float, dtype: str) -> str | None:
  """Why a fused `impl` cannot run this config (None if it can), naming the fields."""
  if impl not in FUSED:
    return None
  if impl in NO_DROPOUT and attention_dropout_rate > 0:
    return (f"model.attention_impl={impl!r} has no attention dropout, but "
            f"model.attention_dropout_rate={attention_dropout_rate}: set "
            "model.attention_dropout_rate=0 or model.attention_impl to 'auto', 'flash' or "
            "'xla'")
  if impl == "cudnn" and dtype not in CUDNN_DTYPES:
    return (f"model.attention_impl='cudnn' needs model.dtype in {CUDNN_DTYPES}, "
            f"got {dtype!r}")
  return None


def _runtime_problem(impl: str, platform: str) -> str | None:
  if impl not in FUSED:
    return None
  if platform not in PLATFORMS[impl]:
    return f"model.attention_impl={impl!r} does not run on {platform}"
  return None


def choose(impl: str, *, attention_dropout_rate: float, dtype: str, platform: str,
           seq_len: int, deterministic: bool, packed: bool = False,
           jax_version: str | None = None) -> tuple[str, str]:
  """(kernel, reason) for a configured attention_impl; raises ValueError if invalid.

  `packed`: the rows hold several examples (packed-example ids).
  `jax_version`: the release auto's evidence is checked against (the running one's).
  """
  if impl == "xla":
    return "xla", "model.attention_impl='xla'"
  if packed and impl == "cudnn":
    raise ValueError(PACKED_CUDNN)
  if impl in FUSED:
    problem = (_runtime_problem(impl, platform)
               or config_problem(impl, 0.0 if deterministic else attention_dropout_rate, dtype))
    if problem:
      raise ValueError(problem)
    return impl, f"model.attention_impl={impl!r}"
  dropout = not deterministic and attention_dropout_rate > 0
  return _auto(platform, dropout, dtype, packed, seq_len, jax_version)


def _auto(platform: str, dropout: bool, dtype: str, packed: bool, seq_len: int,
          jax_version: str | None) -> tuple[str, str]:
  """`auto`'s kernel: a fused one only where kernel_evidence proves it."""
  if platform not in ("tpu", "gpu"):
    return "xla", f"no fused attention kernel for {platform}"
  evidence = kernel_evidence.proven(platform, dropout, seq_len, jax_version)
  if evidence is None:
    return "xla", kernel_evidence.unproven_reason(platform, dropout, seq_len, jax_version)
  kernel = evidence.kernel
  if kernel in ("splash", "flash") and seq_len % SPLASH_LANES:
    return "xla", (f"sequence length {seq_len} is not a multiple of {SPLASH_LANES}: "
                   f"{kernel} would compute on padding")
  if kernel == "cudnn" and packed:
    return "xla", "packed rows: cuDNN attention takes no packed-example ids"
  problem = config_problem(kernel, 0.0, dtype)
  if problem:
    return "xla", f"{kernel} not usable: {problem}"
  return kernel, f"proven on {platform}: {evidence.faster}"


def _log_once(kernel: str, reason: str):
  if (kernel, reason) not in _logged:
    _logged.add((kernel, reason))
    logging.info("attention kernel: %s (%s)", kernel, reason)


def xla_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, dropout=None,
                  deterministic: bool = True, causal: bool = False):
  """Plain attention with fp32 softmax and (optional) dropout on the probabilities.

  `dropout` is a dropout.Dropout (anything with `rate` and `key()`), whose
  key gives the row and column words of the keep-mask
  (dropout.attention_words, dropout.attention_keep_mask; the dropped
  fraction is dropout.attention_drop_rate of its rate). Softmax, dropout
  and the product with the values are one function with a written-out
  gradient (probabilities_times_values). With `causal` the logits of later
  keys are the most negative float before the softmax, so those keys get
  probability 0 and no gradient. On one CPU device the batch runs in
  slices (batch_slices, sliced_attention), with the same values and
  gradients.
  """
  batch, length, heads, _ = q_BxLxNxH.shape
  keys = k_BxLxNxH.shape[1]
  words, rate = None, 0.0
  if dropout is not None and not deterministic and dropout.rate > 0:
    rows, cols = jax.lax.optimization_barrier(dropout_lib.attention_words(
        dropout.key(), batch, heads, max(length, keys)))
    words, rate = (rows[:, :length], cols[:, :, :keys]), dropout.rate
  slices = batch_slices(batch)
  if slices > 1:
    return sliced_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, words, rate, causal,
                            slices)
  logits_BxNxLxL = scaled_logits(q_BxLxNxH, k_BxLxNxH)
  if causal:
    logits_BxNxLxL = jnp.where(_earlier(length, keys), logits_BxNxLxL,
                               jnp.finfo(jnp.float32).min)
  return probabilities_times_values(logits_BxNxLxL, v_BxLxNxH, mask_BxL, words, rate)


def _earlier(length: int, keys: int):
  """[L, S]: whether key s is at query l's position or before (the causal mask)."""
  return jnp.arange(keys)[None, :] <= jnp.arange(length)[:, None]


def batch_slices(batch: int) -> int:
  """How many equal slices of the batch XLA attention runs apart (sliced_attention).

  CPU_BATCH_SLICES where that divides the batch into slices of two rows or
  more, on a CPU mesh of one device (or one CPU device and no mesh); else 1.
  XLA:CPU runs each batched product of attention on one thread, and runs
  independent operations concurrently: the slices give it independent
  products. Slices of one row (the demo's batch of 4 at length 512) ran
  slower than the whole batch. On a mesh of several devices the batch axis
  is sharded, and slicing it would move rows between devices.
  """
  if target_platform() != "cpu":
    return 1
  mesh = jax.sharding.get_abstract_mesh()
  if (jax.device_count() if mesh.empty else mesh.size) != 1:
    return 1
  if batch % CPU_BATCH_SLICES or batch < 2 * CPU_BATCH_SLICES:
    return 1
  return CPU_BATCH_SLICES


def _batch_slice(x, i: int, size: int):
  return None if x is None else x[i * size:(i + 1) * size]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def sliced_attention(q_BxLxNxH, k_BxSxNxH, v_BxSxNxH, mask_BxS, words, rate: float,
                     causal: bool, slices: int):
  """XLA attention on `slices` equal slices of the batch, concatenated.

  Each slice is what xla_attention computes unsliced, scaled_logits then
  the causal mask (if `causal`) then probabilities_times_values, through
  their own forward and backward functions, on that slice's rows of q, k,
  v, the mask and the dropout words: values and gradients are the
  unsliced ones. The gradients of q, k and v are the slices' gradients
  concatenated.
  """
  return _sliced_attention_fwd(q_BxLxNxH, k_BxSxNxH, v_BxSxNxH, mask_BxS, words, rate,
                               causal, slices)[0]


def _sliced_attention_fwd(q_BxLxNxH, k_BxSxNxH, v_BxSxNxH, mask_BxS, words, rate, causal,
                          slices):
  size = q_BxLxNxH.shape[0] // slices
  outs, residuals = [], []
  for i in range(slices):
    part = functools.partial(_batch_slice, i=i, size=size)
    logits, logits_residuals = _scaled_logits_fwd(part(q_BxLxNxH), part(k_BxSxNxH))
    if causal:
      logits = jnp.where(_earlier(*logits.shape[2:]), logits, jnp.finfo(jnp.float32).min)
    slice_words = None if words is None else tuple(map(part, words))
    out, values_residuals = _probabilities_times_values_fwd(
        logits, part(v_BxSxNxH), part(mask_BxS), slice_words, rate)
    outs.append(out)
    residuals.append((logits_residuals, values_residuals))
  return jnp.concatenate(outs), (residuals, words)


def _sliced_attention_bwd(rate, causal, slices, residuals, g_BxLxNxH):
  residuals, words = residuals
  size = g_BxLxNxH.shape[0] // slices
  grads = []
  for i, (logits_residuals, values_residuals) in enumerate(residuals):
    d_logits, dv, _, _ = _probabilities_times_values_bwd(
        rate, values_residuals, _batch_slice(g_BxLxNxH, i, size))
    if causal:
      d_logits = jnp.where(_earlier(*d_logits.shape[2:]), d_logits, 0.0)
    grads.append((*_scaled_logits_bwd(logits_residuals, d_logits), dv))
  dq, dk, dv = (jnp.concatenate(parts) for parts in zip(*grads))
  return dq, dk, dv, None, None if words is None else (None, None)


sliced_attention.defvjp(_sliced_attention_fwd, _sliced_attention_bwd)


@jax.custom_vjp
def scaled_logits(q_BxLxNxH, k_BxSxNxH):
  """q . k / sqrt(H) in fp32, [B, N, L, S].

  Its gradient runs the two products of the backward pass (dq and dk) on
  operands in q's dtype: the fp32 gradient of the logits is scaled and cast
  once (to bf16 in the shipped configs), as the forward's products take bf16
  q and k, rather than promoting q and k to fp32.
  """
  return _scaled_logits_fwd(q_BxLxNxH, k_BxSxNxH)[0]


def _scaled_logits_fwd(q_BxLxNxH, k_BxSxNxH):
  logits = jnp.einsum("blnh,bsnh->bnls", q_BxLxNxH, k_BxSxNxH,
                      preferred_element_type=jnp.float32)
  return logits / jnp.sqrt(jnp.float32(q_BxLxNxH.shape[-1])), (q_BxLxNxH, k_BxSxNxH)


def _scaled_logits_bwd(residuals, g_BxNxLxS):
  q_BxLxNxH, k_BxSxNxH = residuals
  g = (g_BxNxLxS / jnp.sqrt(jnp.float32(q_BxLxNxH.shape[-1]))).astype(q_BxLxNxH.dtype)
  dq = jnp.einsum("bnls,bsnh->blnh", g, k_BxSxNxH.astype(g.dtype))
  dk = jnp.einsum("bnls,blnh->bsnh", g, q_BxLxNxH)
  return dq.astype(q_BxLxNxH.dtype), dk.astype(k_BxSxNxH.dtype)


scaled_logits.defvjp(_scaled_logits_fwd, _scaled_logits_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def probabilities_times_values(logits_BxNxLxS, v_BxSxNxH, mask_BxS, words, rate: float):
  """softmax(logits over the keys where mask_BxS) in fp32, dropped out at `rate`
  by the product mask of `words` (the queries' row words [B, L] and the keys'
  column words [B, N, S], dropout.attention_words; None: no dropout), times v.

  The backward pass keeps the probabilities (in v's dtype, the compute
  dtype: bf16 in the shipped configs, where the forward's softmax is fp32),
  the words and the padding mask, and forms the keep-mask and the dropped
  probabilities again; the softmax's backward runs in fp32 from the kept
  probabilities. Autodiff of the same steps keeps four [B, N, L, S] arrays
  with dropout (a boolean keep-mask among them) and three without, the
  probabilities in fp32 (with scanned layers, stacked residuals of every
  layer).
  """
  return _probabilities_times_values_fwd(logits_BxNxLxS, v_BxSxNxH, mask_BxS, words,
                                         rate)[0]


def _key_mask(mask):
  """[B, S] (per key) or [B, L, S] (per query and key) -> broadcastable to [B, N, L, S]."""
  return mask[:, None, None, :] if mask.ndim == 2 else mask[:, None, :, :]


def packed_mask(query_ids_BxL, key_ids_BxS):
  """Block-diagonal mask [B, L, S] from packed-example ids: a query sees the
  keys of its own example; padding (id 0) is no key."""
  return (query_ids_BxL[:, :, None] == key_ids_BxS[:, None, :]) & (key_ids_BxS[:, None, :] > 0)


def _dropped(probs_BxNxLxS, words, rate):
  if words is None:
    return probs_BxNxLxS
  rows_BxL, cols_BxNxS = words
  keep = dropout_lib.product_keep(rows_BxL[:, None, :, None], cols_BxNxS[:, :, None, :], rate)
  return apply_keep_mask(probs_BxNxLxS, keep, dropout_lib.attention_drop_rate(rate))


def _probabilities_times_values_fwd(logits_BxNxLxS, v_BxSxNxH, mask_BxS, words, rate):
  big_neg = jnp.finfo(jnp.float32).min
  logits_BxNxLxS = jnp.where(_key_mask(mask_BxS), logits_BxNxLxS.astype(jnp.float32),
                             big_neg)
  probs_BxNxLxS = jax.nn.softmax(logits_BxNxLxS, axis=-1)
  dropped = _dropped(probs_BxNxLxS, words, rate).astype(v_BxSxNxH.dtype)
  out_BxLxNxH = jnp.einsum("bnls,bsnh->blnh", dropped, v_BxSxNxH)
  # Kept in the compute dtype (v's): half the bytes of fp32 under bf16.
  kept_BxNxLxS = probs_BxNxLxS.astype(v_BxSxNxH.dtype)
  return out_BxLxNxH, (kept_BxNxLxS, v_BxSxNxH, mask_BxS, words)


def _probabilities_times_values_bwd(rate, residuals, g_BxLxNxH):
  kept_BxNxLxS, v_BxSxNxH, mask_BxS, words = residuals
  probs_BxNxLxS = kept_BxNxLxS.astype(jnp.float32)
  dropped = _dropped(kept_BxNxLxS, words, rate)
  dv_BxSxNxH = jnp.einsum("bnls,blnh->bsnh", dropped, g_BxLxNxH.astype(v_BxSxNxH.dtype))
  d_dropped = jnp.einsum("blnh,bsnh->bnls", g_BxLxNxH, v_BxSxNxH,
                         preferred_element_type=jnp.float32)
  d_probs = _dropped(d_dropped, words, rate)
  d_logits = probs_BxNxLxS * (d_probs - jnp.sum(d_probs * probs_BxNxLxS, -1, keepdims=True))
  d_logits = jnp.where(_key_mask(mask_BxS), d_logits, 0.0)
  words_cotangent = None if words is None else (None, None)
  return d_logits, dv_BxSxNxH.astype(v_BxSxNxH.dtype), None, words_cotangent


probabilities_times_values.defvjp(_probabilities_times_values_fwd,
                                  _probabilities_times_values_bwd)


def splash_block_sizes(seq_len: int):
  """One block over the whole sequence up to 512 (128 -> 128, 512 -> 512)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top
  b = min(seq_len, SPLASH_MAX_BLOCK)
  while seq_len % b:
    b -= SPLASH_LANES
  return splash.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                           block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b,
                           block_kv_dq=b)


def _splash_local(q_BxNxLxH, k_BxNxLxH, v_BxNxLxH, seg_BxL, interpret: bool,
                  causal: bool = False):
  """Splash over the (local) batch and heads; segment ids keep padding apart."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top
  heads, seq_len = q_BxNxLxH.shape[1], q_BxNxLxH.shape[2]
  shape = (seq_len, seq_len)
  mask = splash.MultiHeadMask(
      [splash.CausalMask(shape) if causal else splash.FullMask(shape)] * heads)
  kernel = splash.make_splash_mha(mask, block_sizes=splash_block_sizes(seq_len),
                                  head_shards=1, q_seq_shards=1, interpret=interpret)
  segments = splash.SegmentIds(q=seg_BxL, kv=seg_BxL)
  return jax.vmap(kernel)(q_BxNxLxH, k_BxNxLxH, v_BxNxLxH, segments)


def _divisible_spec(spec, shape, mesh):
  """`spec` with each dimension left whole where its mesh axes do not divide it."""
  def fits(axes, size):
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    return size % math.prod(mesh.shape[a] for a in axes) == 0
  return jax.sharding.PartitionSpec(
      *(axes if fits(axes, size) else None for axes, size in zip(spec, shape)))


def splash_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, *, interpret: bool = False,
                     causal: bool = False):
  """Splash attention, sharded over batch and heads when a mesh is set.

  mask_BxL (boolean padding mask, or packed-example ids) gives the segment
  ids. A length that is not a multiple of 128 is padded up to one (the extra
  positions are padding: segment 0) and cut off again.
  """
  length = q_BxLxNxH.shape[1]
  extra = -length % SPLASH_LANES
  scale = 1.0 / jnp.sqrt(jnp.float32(q_BxLxNxH.shape[-1]))
  q_BxLxNxH = (q_BxLxNxH * scale).astype(q_BxLxNxH.dtype)
  pad = lambda t: jnp.pad(t, [(0, 0), (0, extra)] + [(0, 0)] * (t.ndim - 2))
  heads_major = lambda t: pad(t).transpose(0, 2, 1, 3)
  q, k, v = (heads_major(t) for t in (q_BxLxNxH, k_BxLxNxH, v_BxLxNxH))
  seg_BxL = pad(mask_BxL.astype(jnp.int32))
  local = functools.partial(_splash_local, interpret=interpret, causal=causal)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    qkv_spec = _divisible_spec(nn.logical_to_mesh_axes(
        ("activation_batch", "activation_heads", None, None)), q.shape, mesh)
    seg_spec = jax.sharding.PartitionSpec(qkv_spec[0], None)
    local = jax.shard_map(local, in_specs=(qkv_spec, qkv_spec, qkv_spec, seg_spec),
                          out_specs=qkv_spec, check_vma=False)
  return local(q, k, v, seg_BxL).transpose(0, 2, 1, 3)[:, :length]


def _flash_local(q, k, v, seg_BxL, *words, rate: float, causal: bool, gpu: bool,
                 interpret: bool, block_sizes):
  """The flash kernel of the platform over this shard's batch rows and heads
  (`words`: this shard's dropout words, when rate > 0)."""
  from bertjax.model import flash_gpu, flash_tpu  # pylint: disable=g-import-not-at-top
  # flash_gpu's layout is [B, L, N, H], flash_tpu's [B, N, H, L].
  head_dim = q.shape[3] if gpu else q.shape[2]
  scale = 1.0 / math.sqrt(head_dim)
  if gpu:
    return flash_gpu.flash_attention(q, k, v, seg_BxL, *words, dropout_rate=rate,
                                     causal=causal, sm_scale=scale, block_sizes=block_sizes,
                                     interpret=interpret)
  return flash_tpu.flash_attention(q, k, v, seg_BxL, seg_BxL, *words, dropout_rate=rate,
                                   causal=causal, sm_scale=scale, block_sizes=block_sizes,
                                   interpret=interpret)


def flash_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, *, key=None, rate: float = 0.0,
                    causal: bool = False, platform: str = "tpu", interpret: bool = False,
                    block_sizes=None):
  """Flash attention with dropout at `rate` (drawn from `key`; none without
  one), sharded over batch and heads when a mesh is set.

  mask_BxL (boolean padding mask, or packed-example ids) gives the segment
  ids. A length that is not a multiple of 128 is padded up to one (segment
  0) and cut off again; the dropout words (dropout.attention_words, formed
  here over the whole array, so each shard reads its slice) keep the mask of
  the real positions dropout.attention_keep_mask's. `platform` 'gpu' runs
  flash_gpu (layout [B, L, N, H]), else flash_tpu (q, k and v
  positions-minor); `interpret` runs either in Pallas interpret mode;
  `block_sizes` is that kernel's BlockSizes (None: its default).
  """
  batch, length, heads = q_BxLxNxH.shape[:3]
  extra = -length % SPLASH_LANES
  gpu = platform == "gpu"
  pad = lambda t: jnp.pad(t, [(0, 0), (0, extra)] + [(0, 0)] * (t.ndim - 2))
  if gpu:
    q, k, v = (pad(t) for t in (q_BxLxNxH, k_BxLxNxH, v_BxLxNxH))
  else:  # flash_tpu: positions-minor [B, N, H, L].
    q, k, v = (pad(t).transpose(0, 2, 3, 1) for t in (q_BxLxNxH, k_BxLxNxH, v_BxLxNxH))
  rate = rate if key is not None else 0.0
  words = (dropout_lib.attention_words(key, batch, heads, length + extra, jnp.int32)
           if rate else ())
  local = functools.partial(_flash_local, rate=rate, causal=causal, gpu=gpu,
                            interpret=interpret, block_sizes=block_sizes)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    logical = (("activation_batch", None, "activation_heads", None) if gpu
               else ("activation_batch", "activation_heads", None, None))
    spec = _divisible_spec(nn.logical_to_mesh_axes(logical), q.shape, mesh)
    batch_axes, head_axes = spec[0], spec[2 if gpu else 1]
    P = jax.sharding.PartitionSpec  # pylint: disable=invalid-name
    word_specs = (P(batch_axes, None), P(batch_axes, head_axes, None)) if rate else ()
    local = jax.shard_map(local, in_specs=(spec, spec, spec, P(batch_axes, None), *word_specs),
                          out_specs=spec, check_vma=False)
  out = local(q, k, v, pad(mask_BxL.astype(jnp.int32)), *words)
  # flash_tpu's output is heads-major, [B, N, L, H].
  return (out if gpu else out.transpose(0, 2, 1, 3))[:, :length]


def cudnn_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, *, implementation="cudnn",
                    causal: bool = False):
  """jax.nn.dot_product_attention with the padding given as sequence lengths.

  The lengths count each row's real tokens, so the mask must be right
  padding. `implementation="xla"` runs the same call anywhere (for tests).
  """
  lengths_B = jnp.maximum(jnp.sum(mask_BxL, axis=-1, dtype=jnp.int32), 1)
  return jax.nn.dot_product_attention(
      q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, query_seq_lengths=lengths_B,
      key_value_seq_lengths=lengths_B, implementation=implementation, is_causal=causal)


def is_packed(mask) -> bool:
  """Whether an attention mask is packed-example ids (int) rather than a boolean mask."""
  return jnp.issubdtype(mask.dtype, jnp.integer)


def attend(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, *, impl: str,
           attention_dropout_rate: float, dtype: str, dropout, deterministic: bool,
           causal: bool = False):
  """Attention by the kernel that `impl` resolves to for this platform and length.

  mask_BxL: the boolean padding mask [B, L]; or packed-example ids [B, L]
  (int, 0 for padding); or, for queries at some positions only, a boolean
  [B, Q, L] mask (layers.TransformerLayer builds it).
  """
  platform = target_platform()
  if q_BxLxNxH.shape[1] != k_BxLxNxH.shape[1]:
    if causal:
      raise ValueError("model.causal: queries at some positions only have no causal mask; "
                       "run the whole sequence (BertForPreTraining does for model.causal)")
    # Queries at some positions only (the last layer in pretraining): small, plain XLA.
    return xla_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, dropout, deterministic)
  packed = is_packed(mask_BxL)
  kernel, reason = choose(impl, attention_dropout_rate=attention_dropout_rate, dtype=dtype,
                          platform=platform, seq_len=q_BxLxNxH.shape[1],
                          deterministic=deterministic, packed=packed)
  _log_once(kernel, reason)
  if kernel == "splash":
    # Splash's segment ids: equal ids attend, so packed examples stay apart
    # and padding (0) stays out of every real token's view.
    return splash_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL,
                            interpret=platform == "cpu", causal=causal)
  if kernel == "cudnn":
    return cudnn_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, causal=causal)
  if kernel == "flash":
    drop = dropout is not None and not deterministic and attention_dropout_rate > 0
    return flash_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL,
                           key=dropout.key() if drop else None,
                           rate=attention_dropout_rate if drop else 0.0, causal=causal,
                           platform=platform, interpret=platform == "cpu")
  if packed:
    mask_BxL = packed_mask(mask_BxL, mask_BxL)
  return xla_attention(q_BxLxNxH, k_BxLxNxH, v_BxLxNxH, mask_BxL, dropout, deterministic,
                       causal)
