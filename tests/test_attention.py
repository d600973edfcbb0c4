"""The attention kernels against plain XLA attention, and the choice between them.

Splash runs in Pallas interpret mode on CPU (slow, so the sizes are small);
its TPU lowering is checked in test_attention_tpu.py. cuDNN needs a GPU; its
padding-as-lengths call is checked here through the same
jax.nn.dot_product_attention call with implementation="xla". The flash
kernels (attention dropout) have test_flash_attention.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import attention
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig

B, L, N, H = 2, 128, 2, 64
LENGTHS = (L, 70)  # One full row, one padded.


def _inputs(dtype, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v, w = (jnp.asarray(rng.normal(size=(B, L, N, H)), dtype) for _ in range(4))
  mask = jnp.asarray(np.arange(L)[None, :] < np.array(LENGTHS)[:, None])
  return q, k, v, w, mask


def _value_and_grads(fn, q, k, v, w, mask):
  """Output and gradients of a weighted sum over the real (unpadded) query positions."""
  real = mask[:, :, None, None].astype(w.dtype)

  def loss(q, k, v):
    return jnp.sum((fn(q, k, v, mask) * w * real).astype(jnp.float32))
  out = jax.jit(fn)(q, k, v, mask)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  return np.asarray(out.astype(jnp.float32)), [np.asarray(g.astype(jnp.float32)) for g in grads]


def _splash(q, k, v, mask):
  return attention.splash_attention(q, k, v, mask, interpret=True)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_splash_matches_xla_forward_and_gradient(dtype, tol):
  inputs = _inputs(dtype)
  mask = np.asarray(inputs[-1])
  out, grads = _value_and_grads(_splash, *inputs)
  ref_out, ref_grads = _value_and_grads(attention.xla_attention, *inputs)
  # Padded queries attend among the padding in splash (segment 0) and to the
  # real keys in XLA; neither reaches a real position, so compare real rows.
  scale = lambda x: float(np.abs(x).max())
  np.testing.assert_allclose(out[mask], ref_out[mask], rtol=0, atol=tol * scale(ref_out))
  for name, g, r in zip("qkv", grads, ref_grads):
    np.testing.assert_allclose(g, r, rtol=0, atol=tol * scale(r), err_msg=f"d{name}")
  # The padding is live: the padded row's real outputs differ from attending to all keys.
  unmasked = np.asarray(attention.xla_attention(*inputs[:3], jnp.ones((B, L), bool)))
  assert np.abs(unmasked[1, :LENGTHS[1]] - ref_out[1, :LENGTHS[1]]).max() > 10 * tol


@pytest.mark.slow
def test_splash_pads_lengths_that_are_not_a_multiple_of_128():
  _assert_matches_xla(_splash, *(x[:, :100] for x in _inputs(jnp.float32)))


def test_cudnn_call_pads_through_sequence_lengths():
  """The lengths derived from the mask give the masked-attention result."""
  lengths_call = lambda q, k, v, m: attention.cudnn_attention(q, k, v, m, implementation="xla")
  _assert_matches_xla(lengths_call, *_inputs(jnp.float32))


def _assert_matches_xla(fn, q, k, v, w, mask):
  out, grads = _value_and_grads(fn, q, k, v, w, mask)
  ref_out, ref_grads = _value_and_grads(attention.xla_attention, q, k, v, w, mask)
  real = np.asarray(mask)
  np.testing.assert_allclose(out[real], ref_out[real], atol=1e-5)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=1e-5)


def _choose(impl, platform, *, dropout=0.0, dtype="bfloat16", seq_len=128,
            deterministic=False):
  return attention.choose(impl, attention_dropout_rate=dropout, dtype=dtype,
                          platform=platform, seq_len=seq_len, deterministic=deterministic)


def test_auto_takes_the_platforms_fused_kernel_when_valid():
  assert _choose("auto", "tpu")[0] == "splash"
  assert _choose("auto", "tpu", seq_len=512)[0] == "splash"
  assert _choose("auto", "gpu")[0] == "cudnn"
  kernel, why = _choose("auto", "cpu")
  assert kernel == "xla" and "cpu" in why
  kernel, why = _choose("auto", "tpu", seq_len=100)
  assert kernel == "xla" and "not a multiple of 128" in why
  kernel, why = _choose("auto", "gpu", dtype="float32")
  assert kernel == "xla" and "model.dtype" in why


def test_auto_takes_flash_for_attention_dropout_in_training_only():
  """The paper's configs (attention dropout 0.1) train with flash on TPU and
  GPU, in any dtype; evaluation (no dropout) keeps splash and cuDNN."""
  for platform in ("tpu", "gpu"):
    for dtype in ("bfloat16", "float32"):
      kernel, why = _choose("auto", platform, dropout=0.1, dtype=dtype)
      assert kernel == "flash" and "model.attention_dropout_rate=0.1" in why
  assert _choose("auto", "tpu", dropout=0.1, seq_len=512)[0] == "flash"
  assert _choose("auto", "tpu", dropout=0.1, deterministic=True)[0] == "splash"
  assert _choose("auto", "gpu", dropout=0.1, deterministic=True)[0] == "cudnn"
  kernel, why = _choose("auto", "tpu", dropout=0.1, seq_len=100)
  assert kernel == "xla" and "not a multiple of 128: flash" in why
  assert _choose("auto", "cpu", dropout=0.1)[0] == "xla"
  for platform in ("tpu", "gpu"):  # Packed rows too.
    kernel = attention.choose("auto", attention_dropout_rate=0.1, dtype="bfloat16",
                              platform=platform, seq_len=128, deterministic=False,
                              packed=True)[0]
    assert kernel == "flash", platform


def test_explicit_kernels_on_the_wrong_platform_or_length_are_refused():
  with pytest.raises(ValueError, match=r"model\.attention_impl='cudnn' does not run on tpu"):
    _choose("cudnn", "tpu")
  with pytest.raises(ValueError, match=r"model\.attention_impl='splash' does not run on gpu"):
    _choose("splash", "gpu")
  assert _choose("splash", "tpu", seq_len=96)[0] == "splash"  # Padded to 128.
  assert _choose("splash", "cpu")[0] == "splash"  # Interpret mode, for tests.
  assert _choose("xla", "tpu")[0] == "xla"
  for platform in ("tpu", "gpu", "cpu"):  # Flash: Mosaic, Triton, interpreted.
    assert _choose("flash", platform, dropout=0.1, dtype="float32")[0] == "flash"


@pytest.mark.parametrize("impl", attention.NO_DROPOUT)
def test_fused_kernel_with_attention_dropout_is_refused_naming_both_fields(impl):
  with pytest.raises(ValueError, match=(rf"model\.attention_impl='{impl}' has no attention "
                                        r"dropout, but model\.attention_dropout_rate=0\.1: "
                                        r".*'flash'")):
    BertConfig(vocab_size=97, attention_impl=impl, attention_dropout_rate=0.1,
               dtype="bfloat16")
  BertConfig(vocab_size=97, attention_impl=impl, attention_dropout_rate=0.0, dtype="bfloat16")


def test_cudnn_in_fp32_is_refused():
  with pytest.raises(ValueError, match=r"model\.attention_impl='cudnn' needs model\.dtype"):
    BertConfig(vocab_size=97, attention_impl="cudnn", attention_dropout_rate=0.0)


@pytest.mark.slow
def test_model_with_splash_matches_model_with_xla():
  """The whole pretraining model: splash (interpreted) against XLA attention, with grads."""
  config = BertConfig(vocab_size=97, hidden_size=64, num_layers=2, num_heads=2,
                      intermediate_size=128, max_position_embeddings=L,
                      attention_dropout_rate=0.0, hidden_dropout_rate=0.0,
                      attention_impl="splash")
  rng = np.random.default_rng(1)
  mask = (np.arange(L)[None, :] < np.array(LENGTHS)[:, None]).astype(np.int32)
  batch = dict(input_ids=(rng.integers(5, 97, (B, L)) * mask).astype(np.int32),
               input_mask=mask, segment_ids=np.zeros((B, L), np.int32),
               masked_lm_positions=np.array([[1, 5, 9], [2, 30, 69]], np.int32))
  params = BertForPreTraining(config).init(jax.random.key(0), **batch)

  def run(impl):
    model = BertForPreTraining(config.replace(attention_impl=impl))
    def loss(p):
      out = model.apply(p, **batch)
      return jnp.sum(out["mlm_logits"] ** 2) + jnp.sum(out["nsp_logits"] ** 2), out
    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return out, grads
  out, grads = run("splash")
  ref_out, ref_grads = run("xla")
  for key in ("mlm_logits", "nsp_logits", "pooled_output"):
    np.testing.assert_allclose(out[key], ref_out[key], rtol=0, atol=1e-5, err_msg=key)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out["sequence_output"])[real],
                             np.asarray(ref_out["sequence_output"])[real], atol=1e-5)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=0, atol=1e-5 * float(jnp.abs(r).max()) + 1e-7)
