"""cuDNN and flash attention and the pretraining model on a GPU, against XLA
attention there; packed rows there, against the same examples unpacked.

Skipped where JAX has no GPU (CI has none); on a GPU host:
`python -m pytest tests/test_gpu.py`. test_attention.py checks the same
jax.nn.dot_product_attention call with implementation="xla" on any backend,
and test_flash_attention.py the flash kernels (flash_gpu.py) in Pallas
interpret mode; here cuDNN's own kernel and the Triton-compiled flash
kernels run, and each test first checks that the program calls them.
"""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.benchmarks import flash_gpu_check
from bertjax.input import packing
from bertjax.model import attention
from bertjax.model import dropout
from bertjax.model import flash_gpu
from bertjax.model import kernel_evidence
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.records import schema
from bertjax.train import step as step_lib

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")]

B, L, N, H = 4, 128, 4, 64
LENGTHS = (128, 70, 33, 1)  # Right padding, as BERT's input_mask; one row of [CLS] alone.
TOL = 2e-2  # bf16, relative to the largest magnitude.


def _calls_cudnn(fn, *args) -> bool:
  """Whether the compiled program calls cuDNN's fused attention (its custom calls
  are named __cudnn$fmha...)."""
  return "__cudnn$fmha" in jax.jit(fn).lower(*args).compile().as_text()


def _close(got, want, what):
  np.testing.assert_allclose(got, want, rtol=0, atol=TOL * float(np.abs(want).max()),
                             err_msg=what)


@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_attention_matches_xla_forward_and_gradient(causal):
  rng = np.random.default_rng(0)
  q, k, v, w = (jnp.asarray(rng.normal(size=(B, L, N, H)), jnp.bfloat16) for _ in range(4))
  mask = jnp.asarray(np.arange(L)[None, :] < np.array(LENGTHS)[:, None])
  real = mask[:, :, None, None].astype(jnp.bfloat16)
  cudnn = lambda q, k, v: attention.cudnn_attention(q, k, v, mask, causal=causal)
  xla = lambda q, k, v: attention.xla_attention(q, k, v, mask, causal=causal)
  assert _calls_cudnn(cudnn, q, k, v)

  def value_and_grads(fn):
    loss = lambda q, k, v: jnp.sum((fn(q, k, v) * w * real).astype(jnp.float32))
    out = jax.jit(fn)(q, k, v).astype(jnp.float32)
    return np.asarray(out), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

  out, grads = value_and_grads(cudnn)
  ref, ref_grads = value_and_grads(xla)
  # Padded queries: cuDNN gives 0, XLA attends to the real keys; neither is read.
  keep = np.asarray(mask)
  _close(out[keep], ref[keep], "output")
  for name, g, r in zip("qkv", grads, ref_grads):
    _close(np.asarray(g.astype(jnp.float32)), np.asarray(r.astype(jnp.float32)), f"d{name}")


def _batch(vocab: int, P: int = 20, seed: int = 0, longest: int = L):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(24, longest + 1, 8)
  lengths[0] = longest
  mask = (np.arange(L)[None, :] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab, (8, L)).astype(np.int32) * mask
  positions = np.stack([np.sort(rng.choice(np.arange(1, n - 1), P, replace=False))
                        for n in lengths]).astype(np.int32)
  return {"input_ids": ids, "input_mask": mask,
          "segment_ids": (np.arange(L)[None, :] >= lengths[:, None] // 2).astype(np.int32) * mask,
          "masked_lm_positions": positions,
          "masked_lm_ids": np.take_along_axis(ids, positions, 1),
          "masked_lm_weights": np.ones((8, P), np.float32),
          "next_sentence_labels": rng.integers(0, 2, 8).astype(np.int32),
          schema.EXAMPLE_WEIGHT_KEY: np.ones(8, np.float32)}


def test_pretraining_loss_and_gradients_with_cudnn_attention_match_xla():
  """attention_impl='cudnn' (bf16, no attention dropout) gives the XLA model's
  loss and gradients on the same parameters and batch."""
  dims = dict(vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4,
              intermediate_size=1024, max_position_embeddings=L, hidden_dropout_rate=0.1,
              attention_dropout_rate=0.0, dtype="bfloat16")
  batch = {k: jnp.asarray(v) for k, v in _batch(dims["vocab_size"]).items()}
  models = {impl: BertForPreTraining(BertConfig(**dims, attention_impl=impl))
            for impl in ("cudnn", "xla")}
  params = nn.unbox(models["xla"].init(
      {"params": jax.random.key(0)}, batch["input_ids"], batch["input_mask"],
      batch["segment_ids"], batch["masked_lm_positions"])["params"])

  def loss(params, impl):
    sums = step_lib.loss_sums(params, models[impl].apply, batch, jax.random.key(1),
                              deterministic=False)
    return sums["mlm_loss"] / sums["mlm_weight"] + sums["nsp_loss"] / sums["nsp_weight"]

  assert _calls_cudnn(lambda p: loss(p, "cudnn"), params)
  assert not _calls_cudnn(lambda p: loss(p, "xla"), params)
  got, got_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, "cudnn")
  want, want_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, "xla")
  np.testing.assert_allclose(float(got), float(want), rtol=1e-2)
  # All gradients as one vector (some leaves, the key biases', are zero up to
  # rounding noise, so a per-leaf relative bound says nothing there).
  flat = lambda tree: np.concatenate([np.ravel(np.asarray(x, np.float32))
                                      for x in jax.tree.leaves(tree)])
  g, w = flat(got_grads), flat(want_grads)
  assert np.linalg.norm(g - w) <= TOL * np.linalg.norm(w)


def test_packed_rows_take_xla_attention_and_give_the_unpacked_losses_and_gradients(
    monkeypatch):
  """With attention_impl='auto' where cuDNN is proven, unpacked rows take cuDNN
  and packed rows XLA's block-diagonal mask (cuDNN takes no packed-example
  ids); the same examples give the same summed losses and gradients either
  way (bf16)."""
  monkeypatch.setattr(kernel_evidence, "PROVEN", (kernel_evidence.Evidence(
      kernel="cudnn", platform="gpu", dropout=False, seq_lens=(L,),
      jax_minors=(kernel_evidence.jax_minor(),), compiled="-", faster="-"),))
  dims = dict(vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4,
              intermediate_size=1024, max_position_embeddings=L, hidden_dropout_rate=0.1,
              attention_dropout_rate=0.0, dtype="bfloat16", attention_impl="auto")
  model = BertForPreTraining(BertConfig(**dims))
  unpacked = _batch(dims["vocab_size"], seed=1, longest=L // 2)  # 8 examples, 4 rows.
  p = packing.Packing(max_seq_length=L, max_predictions_per_seq=20, rows=4,
                      max_examples_per_row=4, max_predictions_per_row=80)
  row, offset = packing.first_fit(*packing.example_sizes(unpacked), p)
  assert (row >= 0).all(), "every example fits"
  packed = packing.pack(unpacked, row, offset, p)
  assert len(set(row.tolist())) < len(row), "some row holds two examples"
  params = nn.unbox(model.init(
      {"params": jax.random.key(0)}, jnp.asarray(unpacked["input_ids"]),
      jnp.asarray(unpacked["input_mask"]), jnp.asarray(unpacked["segment_ids"]),
      jnp.asarray(unpacked["masked_lm_positions"]))["params"])

  def total(params, batch):
    sums = step_lib.loss_sums(params, model.apply, batch, None, deterministic=True)
    return sums["mlm_loss"] + sums["nsp_loss"], sums

  results = {}
  for name, batch in (("unpacked", unpacked), ("packed", packed)):
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    calls = _calls_cudnn(lambda p: total(p, batch)[0], params)
    assert calls == (name == "unpacked"), name
    (_, sums), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(params, batch)
    results[name] = jax.tree.map(lambda x: np.asarray(x, np.float32), (sums, grads))
  (sums, grads), (want_sums, want_grads) = results["packed"], results["unpacked"]
  assert float(want_sums["nsp_weight"]) == 8
  for k in ("mlm_loss", "nsp_loss"):
    np.testing.assert_allclose(sums[k], want_sums[k], rtol=TOL, err_msg=k)
  for k in ("mlm_weight", "nsp_weight"):
    assert sums[k] == want_sums[k], k
  # A hit is an argmax: bf16 rounding may flip a near tie or two.
  for k in ("mlm_hits", "nsp_hits"):
    assert abs(sums[k] - want_sums[k]) <= 2, k
  flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
  g, w = flat(grads), flat(want_grads)
  assert np.linalg.norm(g - w) <= TOL * np.linalg.norm(w)


# Flash attention with attention dropout (flash_gpu.py, compiled by Triton).

RATE = 0.1


def _calls_flash(fn, *args) -> bool:
  """Whether the program runs the flash kernels (Triton custom calls named
  flash_dropout_...)."""
  text = jax.jit(fn).lower(*args).as_text()
  return (any(t in text for t in flash_gpu.TRITON_CALL_TARGETS)
          and "flash_dropout_forward" in text)


class _Drawn:
  """What xla_attention asks of a dropout.Dropout, drawing from a fixed key."""

  def __init__(self, key):
    self._key, self.rate = key, RATE

  def key(self):
    return self._key


@pytest.mark.parametrize("row", ["forward", "dkv", "dq", "grad"])
def test_flash_kernels_compile_within_a_minute_at_bert_large_shape(row, tmp_path):
  """Each kernel alone (attention dropout 0.1), and then the whole attention
  gradient, at BERT-LARGE's shape (B=32, L=128, N=16, H=64, bf16) lowers,
  compiles and runs within 60 s in a child process; one that does not dumps
  its Python stack there (faulthandler), and the failure names the stage
  and the innermost frames: jaxlib's Triton lowering, or XLA's compile
  (bertjax/benchmarks/flash_gpu_check.py, which bisects further)."""
  result = flash_gpu_check.check_row(row, timeout_s=60, out_dir=str(tmp_path))
  stderr = tmp_path / f"{row}.stderr.txt"
  assert result["status"] == "ok", json.dumps(result, indent=1) + (
      "\n" + stderr.read_text()[-6000:] if stderr.exists() else "")


def test_flash_kernel_drops_what_attention_keep_mask_drops():
  """Zero logits and identity values make each output row its row's keep-mask."""
  length = 128
  key = jax.random.key(3)
  q = jnp.zeros((B, length, N, length), jnp.float32)
  eye = jnp.broadcast_to(jnp.eye(length, dtype=jnp.float32)[:, None, :], q.shape)
  out = attention.flash_attention(q, q, eye, jnp.ones((B, length), bool), key=key, rate=RATE,
                                  platform="gpu")
  want = dropout.attention_keep_mask(key, (B, N, length, length), RATE)
  np.testing.assert_array_equal(np.asarray(out).transpose(0, 2, 1, 3) > 0, np.asarray(want))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_with_dropout_matches_xla_forward_and_gradient(causal):
  rng = np.random.default_rng(0)
  q, k, v, w = (jnp.asarray(rng.normal(size=(B, L, N, H)), jnp.bfloat16) for _ in range(4))
  mask = jnp.asarray(np.arange(L)[None, :] < np.array(LENGTHS)[:, None])
  real = mask[:, :, None, None].astype(jnp.bfloat16)
  key = jax.random.key(5)
  flash = lambda q, k, v: attention.flash_attention(q, k, v, mask, key=key, rate=RATE,
                                                    causal=causal, platform="gpu")
  xla = lambda q, k, v: attention.xla_attention(q, k, v, mask, _Drawn(key),
                                                deterministic=False, causal=causal)
  assert _calls_flash(flash, q, k, v)

  def value_and_grads(fn):
    loss = lambda q, k, v: jnp.sum((fn(q, k, v) * w * real).astype(jnp.float32))
    out = jax.jit(fn)(q, k, v).astype(jnp.float32)
    return np.asarray(out), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

  out, grads = value_and_grads(flash)
  ref, ref_grads = value_and_grads(xla)
  keep = np.asarray(mask)  # Padded queries attend to padding in flash; none is read.
  _close(out[keep], ref[keep], "output")
  for name, g, r in zip("qkv", grads, ref_grads):
    _close(np.asarray(g.astype(jnp.float32)), np.asarray(r.astype(jnp.float32)), f"d{name}")


@pytest.mark.parametrize("packed", [False, True])
def test_training_with_flash_and_attention_dropout_gives_xlas_loss_and_gradients(packed):
  """attention_impl='flash' with the paper's attention dropout (bf16, packed
  rows too) gives the XLA model's loss and gradients on the same
  parameters, batch and dropout key."""
  dims = dict(vocab_size=1000, hidden_size=256, num_layers=2, num_heads=4,
              intermediate_size=1024, max_position_embeddings=L, hidden_dropout_rate=0.1,
              attention_dropout_rate=RATE, dtype="bfloat16")
  batch = _batch(dims["vocab_size"], seed=2, longest=L // 2 if packed else L)
  if packed:
    p = packing.Packing(max_seq_length=L, max_predictions_per_seq=20, rows=4,
                        max_examples_per_row=4, max_predictions_per_row=80)
    row, offset = packing.first_fit(*packing.example_sizes(batch), p)
    batch = packing.pack(batch, row, offset, p)
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  models = {impl: BertForPreTraining(BertConfig(**dims, attention_impl=impl))
            for impl in ("flash", "xla")}
  params = nn.unbox(models["xla"].init(
      {"params": jax.random.key(0)}, batch["input_ids"], batch["input_mask"],
      batch["segment_ids"], batch["masked_lm_positions"])["params"])

  def loss(params, impl):
    sums = step_lib.loss_sums(params, models[impl].apply, batch, jax.random.key(1),
                              deterministic=False)
    return sums["mlm_loss"] / sums["mlm_weight"] + sums["nsp_loss"] / sums["nsp_weight"]

  assert _calls_flash(lambda p: loss(p, "flash"), params)
  assert not _calls_flash(lambda p: loss(p, "xla"), params)
  got, got_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, "flash")
  want, want_grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, "xla")
  np.testing.assert_allclose(float(got), float(want), rtol=1e-2)
  flat = lambda tree: np.concatenate([np.ravel(np.asarray(x, np.float32))
                                      for x in jax.tree.leaves(tree)])
  g, w = flat(got_grads), flat(want_grads)
  assert np.linalg.norm(g - w) <= TOL * np.linalg.norm(w)
