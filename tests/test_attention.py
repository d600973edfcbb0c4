"""The attention kernels against plain XLA attention, and the choice between them.

Splash runs in Pallas interpret mode on CPU (slow, so the sizes are small);
its TPU lowering is checked in test_attention_tpu.py. cuDNN needs a GPU; its
padding-as-lengths call is checked here through the same
jax.nn.dot_product_attention call with implementation="xla". The flash
kernels (attention dropout) have test_flash_attention.py.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import attention
from bertjax.model import kernel_evidence
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


def _evidence(kernel, platform, dropout, seq_lens=(128, 512), jax_minors=None):
  return kernel_evidence.Evidence(
      kernel=kernel, platform=platform, dropout=dropout, seq_lens=seq_lens,
      jax_minors=jax_minors or (kernel_evidence.jax_minor(),), compiled="a test",
      faster="a timed row")


class _Drawn:
  """What xla_attention asks of a dropout.Dropout, drawing from a fixed key."""

  def __init__(self, key, rate):
    self._key, self.rate = key, rate

  def key(self):
    return self._key


@pytest.mark.parametrize("rate,causal,packed,queries", [
    (0.0, False, False, 16), (0.1, False, False, 16), (0.1, True, False, 16),
    (0.1, False, True, 16), (0.1, False, False, 3)])
def test_attention_in_batch_slices_gives_the_unsliced_values_and_gradients(
    monkeypatch, rate, causal, packed, queries):
  """On one CPU device XLA attention runs in slices of the batch; against the
  same attention unsliced: dropout, the causal mask, packed rows and queries
  at some positions only (a [B, Q, S] mask)."""
  b, s, n, h = 8, 16, 2, 8
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.normal(size=(b, queries, n, h)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(b, s, n, h)), jnp.float32) for _ in range(2))
  w = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
  lengths = np.array([16, 9, 12, 5, 16, 3, 8, 14])
  if packed:
    ids = jnp.asarray(np.where(np.arange(s) < lengths[:, None],
                               1 + (np.arange(s) >= lengths[:, None] // 2), 0), jnp.int32)
    mask = attention.packed_mask(ids, ids)
  elif queries < s:
    mask = jnp.asarray(np.arange(s)[None, None, :] < lengths[:, None, None]).repeat(queries, 1)
  else:
    mask = jnp.asarray(np.arange(s)[None, :] < lengths[:, None])
  drawn = _Drawn(jax.random.key(7), rate)

  def value_and_grads():
    def run(q, k, v):  # A new function each time: jit's cache holds the last trace.
      return attention.xla_attention(q, k, v, mask, drawn, deterministic=False, causal=causal)
    out = jax.jit(run)(q, k, v)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(run(*a) * w), argnums=(0, 1, 2)))(q, k, v)
    products = str(jax.make_jaxpr(run)(q, k, v)).count("dot_general")
    return out, grads, products

  assert attention.batch_slices(b) == 4
  sliced = value_and_grads()
  monkeypatch.setattr(attention, "batch_slices", lambda batch: 1)
  whole = value_and_grads()
  assert (sliced[2], whole[2]) == (8, 2)  # Two products per slice.
  for got, want in zip((sliced[0], *sliced[1]), (whole[0], *whole[1])):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_batch_slices_on_one_cpu_device_only():
  assert [attention.batch_slices(b) for b in (32, 12, 8, 6, 4, 3, 1)] == [4, 4, 4, 1, 1, 1, 1]
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((2,), ("data",))):
    assert attention.batch_slices(32) == 1
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("data",))):
    assert attention.batch_slices(32) == 4


def test_auto_takes_no_fused_kernel_without_evidence_and_says_why(monkeypatch):
  monkeypatch.setattr(kernel_evidence, "PROVEN", ())
  for platform, dropout, kernel in (("tpu", 0.1, "flash"), ("tpu", 0.0, "splash"),
                                    ("gpu", 0.1, "flash"), ("gpu", 0.0, "cudnn")):
    got, why = _choose("auto", platform, dropout=dropout)
    assert got == "xla", (platform, dropout)
    assert f"{kernel} is not proven on {platform}" in why
    assert f"model.attention_impl={kernel!r} opts in" in why
  kernel, why = _choose("auto", "cpu")
  assert kernel == "xla" and "cpu" in why


def test_auto_takes_a_kernel_only_where_its_evidence_holds(monkeypatch):
  monkeypatch.setattr(kernel_evidence, "PROVEN", (
      _evidence("flash", "gpu", True, seq_lens=(128,)), _evidence("cudnn", "gpu", False),
      _evidence("splash", "tpu", False, seq_lens=(100, 128, 512))))
  kernel, why = _choose("auto", "gpu", dropout=0.1)
  assert kernel == "flash" and "proven on gpu: a timed row" in why
  kernel, why = _choose("auto", "gpu", dropout=0.1, seq_len=512)  # Not covered.
  assert kernel == "xla" and "covers lengths [128]" in why
  assert _choose("auto", "gpu", dropout=0.1, deterministic=True)[0] == "cudnn"
  assert _choose("auto", "gpu")[0] == "cudnn"
  assert _choose("auto", "tpu")[0] == "splash"
  assert _choose("auto", "tpu", dropout=0.1)[0] == "xla"  # No TPU flash evidence.
  # Another jax release: the evidence does not carry over.
  kernel, why = attention.choose("auto", attention_dropout_rate=0.0, dtype="bfloat16",
                                 platform="gpu", seq_len=128, deterministic=True,
                                 jax_version="9.9.0")
  assert kernel == "xla" and "on jax ['" in why and "not length 128 on jax 9.9" in why
  # What the proven kernel cannot do falls back to XLA, with the reason.
  kernel, why = _choose("auto", "tpu", seq_len=100)
  assert kernel == "xla" and "not a multiple of 128" in why
  kernel, why = _choose("auto", "gpu", dtype="float32")
  assert kernel == "xla" and "model.dtype" in why
  kernel, why = attention.choose("auto", attention_dropout_rate=0.0, dtype="bfloat16",
                                 platform="gpu", seq_len=128, deterministic=True,
                                 packed=True)
  assert kernel == "xla" and "packed rows" in why


def test_every_proven_kernel_runs_on_its_platform_and_is_in_the_docs():
  docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "attention.md")).read()
  for e in kernel_evidence.PROVEN:
    assert e.kernel in attention.FUSED and e.platform in attention.PLATFORMS[e.kernel]
    assert e.seq_lens and e.jax_minors and e.compiled and e.faster
    assert e.faster in docs, e
  for (platform, _), (kernel, _) in kernel_evidence.CANDIDATES.items():
    assert platform in attention.PLATFORMS[kernel]


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
