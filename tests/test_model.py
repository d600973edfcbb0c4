"""Unit tests of the BERT model on tiny configs (CPU, fp32 unless stated)."""

import functools
import re

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model import attention
from bertjax.model import decoder
from bertjax.model import layers
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BASE, LARGE, BertConfig

BATCH, LENGTH, PREDICTIONS = 3, 16, 4
TINY = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
            max_position_embeddings=32)
OUTPUT_KEYS = ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits")


def tiny(**changes) -> BertConfig:
  return BertConfig(**{**TINY, **changes})


def make_batch(seed=0, vocab_size=TINY["vocab_size"]):
  rng = np.random.default_rng(seed)
  lengths = np.array([LENGTH, 11, 6])
  mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab_size, (BATCH, LENGTH)).astype(np.int32) * mask
  segments = ((np.arange(LENGTH)[None, :] >= lengths[:, None] // 2) * mask).astype(np.int32)
  positions = np.stack([np.sort(rng.choice(n, PREDICTIONS, replace=False)) for n in lengths])
  return dict(input_ids=ids, input_mask=mask, segment_ids=segments,
              masked_lm_positions=positions.astype(np.int32))


@functools.lru_cache(maxsize=None)
def init_params(config: BertConfig, seed: int = 0):
  """Random params shaped like BertForPreTraining(config).init (values from numpy).

  eval_shape plus numpy avoids compiling init; every weight is random, biases
  and LayerNorm included, so no parameter is trivially inert.
  """
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    x = rng.normal(0.0, 0.05, leaf.shape).astype(leaf.dtype)
    return x + 1 if path[-1].key == "scale" else x
  return jax.tree_util.tree_map_with_path(fill, nn.unbox(_abstract_params(config)))


@functools.lru_cache(maxsize=None)
def _apply_fn(config: BertConfig, deterministic: bool):
  def run(params, batch, rng):
    return BertForPreTraining(config).apply(params, **batch, deterministic=deterministic,
                                            rngs={"dropout": rng})
  return jax.jit(run)


def apply(config, params, batch, *, deterministic=True, rng=0):
  out = _apply_fn(config, deterministic)(params, batch, jax.random.key(rng))
  return jax.tree.map(np.asarray, out)


def unroll(params, num_layers):
  """Scanned params (encoder/layers stacked) -> the unrolled layout (encoder/layer_{i})."""
  encoder = dict(params["params"]["bert"]["encoder"])
  stacked = encoder.pop("layers")
  for i in range(num_layers):
    encoder[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  bert = dict(params["params"]["bert"], encoder=encoder)
  return {"params": dict(params["params"], bert=bert)}


def assert_outputs_close(a, b, atol=1e-6, rtol=1e-6):
  for k in OUTPUT_KEYS:
    np.testing.assert_allclose(a[k], b[k], atol=atol, rtol=rtol, err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [True, False])
def test_output_shapes_dtypes_and_finiteness(scan_layers):
  config = tiny(scan_layers=scan_layers)
  out = apply(config, init_params(config), make_batch())
  d, v = TINY["hidden_size"], TINY["vocab_size"]
  assert out["sequence_output"].shape == (BATCH, LENGTH, d)
  assert out["pooled_output"].shape == (BATCH, d)
  assert out["mlm_logits"].shape == (BATCH, PREDICTIONS, v)
  assert out["nsp_logits"].shape == (BATCH, 2)
  for k in OUTPUT_KEYS:
    assert out[k].dtype == np.float32, k
    assert np.isfinite(out[k]).all(), k
  assert np.all(np.abs(out["pooled_output"]) <= 1.0)  # tanh


def test_padding_does_not_leak():
  """Padded tokens change nothing at unpadded positions nor in the heads."""
  config = tiny()
  params = init_params(config)
  batch = make_batch()
  out = apply(config, params, batch)
  pad = batch["input_mask"] == 0
  assert pad.any()
  changed = dict(batch)
  changed["input_ids"] = np.where(pad, (batch["input_ids"] + 7) % TINY["vocab_size"] + 1,
                                  batch["input_ids"])
  changed["segment_ids"] = np.where(pad, 1, batch["segment_ids"])
  out2 = apply(config, params, changed)
  real = ~pad
  np.testing.assert_array_equal(out["sequence_output"][real], out2["sequence_output"][real])
  for k in ("pooled_output", "mlm_logits", "nsp_logits"):
    np.testing.assert_array_equal(out[k], out2[k], err_msg=k)
  # The check is live: changing an unpadded token does change those outputs.
  live = dict(batch, input_ids=batch["input_ids"].copy())
  live["input_ids"][:, 3] = (live["input_ids"][:, 3] + 1) % TINY["vocab_size"]
  out3 = apply(config, params, live)
  assert np.abs(out3["sequence_output"][real] - out["sequence_output"][real]).max() > 1e-4


def test_encoder_is_bidirectional():
  """Changing the last real token changes every earlier position's output."""
  config = tiny()
  params = init_params(config)
  batch = make_batch()
  out = apply(config, params, batch)
  row, last = 1, int(batch["input_mask"][1].sum()) - 1
  changed = dict(batch, input_ids=batch["input_ids"].copy())
  changed["input_ids"][row, last] = (changed["input_ids"][row, last] + 1) % TINY["vocab_size"]
  out2 = apply(config, params, changed)
  delta_per_position = np.abs(out2["sequence_output"][row, :last]
                              - out["sequence_output"][row, :last]).max(axis=-1)
  assert (delta_per_position > 1e-5).all(), delta_per_position
  # Other rows are untouched.
  np.testing.assert_array_equal(out2["sequence_output"][0], out["sequence_output"][0])


def test_scan_and_unrolled_layers_agree():
  scanned = tiny(scan_layers=True, layer_loop="scan")
  params = init_params(scanned)
  unrolled_params = unroll(params, scanned.num_layers)
  unrolled = tiny(scan_layers=False)
  abstract = jax.eval_shape(lambda: init_params(unrolled))
  assert jax.tree.structure(unrolled_params) == jax.tree.structure(abstract)
  batch = make_batch()
  assert_outputs_close(apply(scanned, params, batch), apply(unrolled, unrolled_params, batch))


def _loss_and_grads(config, params, batch, rng):
  """A scalar touching every output, and its gradients, with dropout on."""
  def loss(p):
    out = BertForPreTraining(config).apply(p, **batch, deterministic=False,
                                           rngs={"dropout": jax.random.key(rng)})
    return sum(jnp.sum(jnp.sin(out[k].astype(jnp.float32))) for k in OUTPUT_KEYS), out
  (value, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return value, out, grads


@pytest.mark.slow
@pytest.mark.parametrize(("scan_layers", "layer_loop"),
                         [(True, "scan"), (True, "unroll"), (False, "scan")])
def test_remat_policies_match_no_remat(scan_layers, layer_loop):
  base_config = tiny(scan_layers=scan_layers, layer_loop=layer_loop)
  params = init_params(base_config)
  batch = make_batch()
  ref_value, ref_out, ref_grads = _loss_and_grads(base_config, params, batch, rng=3)
  policies = layers.REMAT.keys() if scan_layers else ("full",)
  for policy in policies:
    value, out, grads = _loss_and_grads(base_config.replace(remat_policy=policy), params,
                                        batch, rng=3)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6, err_msg=policy)
    assert_outputs_close(out, ref_out)
    # Recomputation may reassociate sums: compare each gradient to its own scale.
    # (The key bias's gradient is zero up to rounding: softmax ignores it.)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
      np.testing.assert_allclose(g, r, rtol=0, atol=1e-5 * float(jnp.abs(r).max()) + 1e-7,
                                 err_msg=policy)
  # Gradients reach every parameter (but the key bias, which softmax ignores).
  for path, g in jax.tree_util.tree_leaves_with_path(ref_grads):
    if "'key']['bias'" not in jax.tree_util.keystr(path):
      assert float(jnp.abs(g).max()) > 1e-6, jax.tree_util.keystr(path)


@pytest.mark.slow
def test_bf16_compute_keeps_fp32_params_and_logits():
  config = tiny(dtype="bfloat16")
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(_abstract_params(config)))
  params = init_params(config)
  out = apply(config, params, make_batch())
  assert out["sequence_output"].dtype == jnp.bfloat16
  assert out["pooled_output"].dtype == np.float32
  assert out["mlm_logits"].dtype == np.float32 and out["nsp_logits"].dtype == np.float32
  # Same weights in fp32: bf16 compute stays close.
  ref = apply(tiny(), params, make_batch())
  for k in OUTPUT_KEYS:
    got = out[k].astype(np.float32)
    assert np.isfinite(got).all(), k
    err = np.abs(got - ref[k]).max() / (np.abs(ref[k]).max() + 1e-6)
    assert err < 0.05, (k, err)


@pytest.mark.slow
def test_dropout_is_active_only_when_not_deterministic():
  config = tiny(hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
  params = init_params(config)
  batch = make_batch()
  a = apply(config, params, batch, deterministic=False, rng=1)
  b = apply(config, params, batch, deterministic=False, rng=2)
  a_again = apply(config, params, batch, deterministic=False, rng=1)
  for k in OUTPUT_KEYS:
    assert np.abs(a[k] - b[k]).max() > 1e-4, k
    np.testing.assert_array_equal(a[k], a_again[k], err_msg=k)
  d1 = apply(config, params, batch, deterministic=True, rng=1)
  d2 = apply(config, params, batch, deterministic=True, rng=2)
  for k in OUTPUT_KEYS:
    np.testing.assert_array_equal(d1[k], d2[k], err_msg=k)
  # Rates of zero: deterministic=False computes the deterministic outputs.
  no_dropout = tiny(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  assert_outputs_close(apply(no_dropout, params, batch, deterministic=False), d1)


@pytest.mark.slow
def test_attention_dropout_applies_on_the_xla_path():
  config = tiny(hidden_dropout_rate=0.0, attention_dropout_rate=0.3)
  params = init_params(config)
  batch = make_batch()
  train = apply(config, params, batch, deterministic=False, rng=5)
  evaluate = apply(config, params, batch, deterministic=True)
  assert np.abs(train["sequence_output"] - evaluate["sequence_output"]).max() > 1e-3


@pytest.mark.slow
def test_auto_attention_runs_xla_on_cpu_and_logs_why(monkeypatch, caplog):
  """On CPU no fused kernel applies: 'auto' computes what 'xla' does, and says so once."""
  monkeypatch.setattr(attention, "_logged", set())
  caplog.set_level("INFO")
  batch = make_batch()
  auto = tiny(attention_impl="auto", attention_dropout_rate=0.0)
  params = init_params(auto)
  out_auto = jax.tree.map(np.asarray, BertForPreTraining(auto).apply(params, **batch))
  out_xla = jax.tree.map(np.asarray, BertForPreTraining(
      auto.replace(attention_impl="xla")).apply(params, **batch))
  for k in OUTPUT_KEYS:
    np.testing.assert_array_equal(out_auto[k], out_xla[k], err_msg=k)
  said = [r.getMessage() for r in caplog.records if "attention kernel" in r.getMessage()]
  assert said.count("attention kernel: xla (no fused attention kernel for cpu)") == 1, said


@pytest.mark.slow
def test_padded_vocab_leaves_the_pretraining_loss_unchanged():
  """Padded rows, whatever their values, change no loss, accuracy or real gradient."""
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  unpadded = tiny()
  padded = tiny(vocab_multiple=128)
  assert (unpadded.padded_vocab_size, padded.padded_vocab_size) == (97, 128)
  params = init_params(unpadded)
  rng = np.random.default_rng(3)

  def pad(path, x):
    name = jax.tree_util.keystr(path)
    if "word_embeddings" in name or "output_bias" in name:
      extra = rng.normal(0.0, 50.0, (31,) + x.shape[1:]).astype(x.dtype)
      return np.concatenate([x, extra])
    return x
  padded_params = jax.tree_util.tree_map_with_path(pad, params)
  batch = make_batch()
  # Half the labels are the unpadded model's own predictions, so accuracy is
  # above zero and a padded column that won the argmax would show.
  ids = rng.integers(0, 97, (BATCH, PREDICTIONS))
  ids[:, ::2] = apply(unpadded, params, batch)["mlm_logits"].argmax(-1)[:, ::2]
  batch.update(masked_lm_ids=ids.astype(np.int32),
               masked_lm_weights=np.ones((BATCH, PREDICTIONS), np.float32),
               next_sentence_labels=np.array([0, 1, 0], np.int32),
               **{step_lib.EXAMPLE_WEIGHT_KEY: np.ones((BATCH,), np.float32)})

  def sums_and_grads(config, p):
    apply_fn = BertForPreTraining(config).apply
    def loss(p):
      sums = step_lib.loss_sums(p, apply_fn, batch, None, deterministic=True)
      return sums["mlm_loss"] + sums["nsp_loss"], sums
    return jax.jit(jax.grad(loss, has_aux=True))(p["params"])
  # The padded columns stay (the vocab axis keeps its shards) at the most
  # negative float, so they never win the argmax.
  inputs = make_batch()
  padded_logits = apply(padded, padded_params, inputs)["mlm_logits"]
  assert padded_logits.shape[-1] == 128
  assert (padded_logits[..., 97:] == decoder.PADDED_LOGIT).all()
  np.testing.assert_allclose(padded_logits[..., :97], apply(unpadded, params, inputs)["mlm_logits"],
                             rtol=1e-5, atol=1e-5)
  grads, sums = sums_and_grads(unpadded, params)
  padded_grads, padded_sums = sums_and_grads(padded, padded_params)
  for k in sums:
    np.testing.assert_allclose(padded_sums[k], sums[k], rtol=1e-6, err_msg=k)
  assert float(sums["mlm_hits"]) > 0  # Accuracy is compared on something.
  word = lambda g: np.asarray(g["bert"]["embeddings"]["word_embeddings"]["embedding"])
  np.testing.assert_allclose(word(padded_grads)[:97], word(grads), atol=1e-6)
  assert not word(padded_grads)[97:].any()
  bias = lambda g: np.asarray(g["mlm"]["output_bias"])
  np.testing.assert_allclose(bias(padded_grads)[:97], bias(grads), atol=1e-6)
  assert not bias(padded_grads)[97:].any()


def _count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def _abstract_params(config: BertConfig):
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.eval_shape(lambda: BertForPreTraining(config).init(
      jax.random.key(0), ids, ids, ids, ids[:, :2]))


def _formula(vocab, hidden, layers_, intermediate, positions=512, types=2) -> int:
  """BERT pretraining parameters counted from the architecture."""
  d, f = hidden, intermediate
  embeddings = (vocab + positions + types) * d + 2 * d
  layer = 4 * (d * d + d) + 2 * d + (d * f + f) + (f * d + d) + 2 * d
  pooler = d * d + d
  heads = (d * d + d) + 2 * d + vocab + (2 * d + 2)  # transform, LayerNorm, bias, NSP
  return embeddings + layers_ * layer + pooler + heads


@pytest.mark.slow
@pytest.mark.parametrize("size,expected", [(BASE, 110_106_428), (LARGE, 336_226_108)])
def test_parameter_counts(size, expected):
  config = BertConfig(vocab_size=30522, **size)
  assert _count(_abstract_params(config)) == expected
  assert _count(_abstract_params(config.replace(scan_layers=False))) == expected
  # Padded to 30,592 rows (239 x 128): the word table and the MLM bias grow.
  padded = config.replace(vocab_multiple=128)
  assert padded.padded_vocab_size == 30592
  assert _count(_abstract_params(padded)) == expected + 70 * (size["hidden_size"] + 1)
  assert _formula(30522, size["hidden_size"], size["num_layers"],
                  size["intermediate_size"]) == expected
  import transformers  # pylint: disable=g-import-not-at-top
  hf_config = transformers.BertConfig(
      vocab_size=30522, hidden_size=size["hidden_size"], num_hidden_layers=size["num_layers"],
      num_attention_heads=size["num_heads"], intermediate_size=size["intermediate_size"])
  hf_model = transformers.FlaxBertForPreTraining(hf_config, _do_init=False)
  assert _count(hf_model.params_shape_tree) == expected


@pytest.mark.parametrize("scan_layers", [True, False])
def test_every_parameter_has_logical_axis_names(scan_layers):
  boxed = _abstract_params(tiny(scan_layers=scan_layers))
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
  for leaf in leaves:
    assert len(leaf.names) == leaf.value.ndim, leaf.names
    assert None not in leaf.names, leaf.names

  def check_layers_axis(path, leaf):
    in_stack = any(getattr(k, "key", None) == "layers" for k in path)
    assert (leaf.names[0] == "layers") == in_stack, (path, leaf.names)
    if in_stack:
      assert leaf.value.shape[0] == TINY["num_layers"]
  jax.tree_util.tree_map_with_path(check_layers_axis, boxed,
                                   is_leaf=lambda x: isinstance(x, nn.Partitioned))
  specs = nn.get_partition_spec(boxed)
  assert all(None not in spec for spec in jax.tree.leaves(
      specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
  p = boxed["params"]["bert"]
  assert p["embeddings"]["word_embeddings"]["embedding"].names == ("vocab", "vocab_embed")
  layer = p["encoder"]["layers"] if scan_layers else p["encoder"]["layer_0"]
  prefix = ("layers",) if scan_layers else ()
  assert layer["attention"]["query"]["kernel"].names == prefix + ("embed", "heads", "kv")
  assert layer["attention"]["output"]["kernel"].names == prefix + ("heads", "kv", "embed")
  assert layer["mlp"]["intermediate"]["kernel"].names == prefix + ("embed", "mlp")


@pytest.mark.parametrize("changes,pattern", [
    (dict(hidden_size=30, num_heads=4), r"model\.hidden_size: 30 is not divisible by "
                                        r"model\.num_heads=4"),
    (dict(vocab_size=0), r"model\.vocab_size"),
    (dict(num_layers=0), r"model\.num_layers"),
    (dict(hidden_dropout_rate=1.0), r"model\.hidden_dropout_rate"),
    (dict(attention_dropout_rate=-0.1), r"model\.attention_dropout_rate"),
    (dict(remat_policy="some"), r"model\.remat_policy: 'some' is not one of"),
    (dict(attention_impl="fused"), r"model\.attention_impl: 'fused' is not one of"),
    (dict(dtype="float33"), r"model\.dtype"),
])
def test_config_validation_names_the_field(changes, pattern):
  with pytest.raises(ValueError, match=pattern):
    tiny(**changes)


def test_config_from_mapping_refuses_unknown_fields():
  assert BertConfig.from_mapping(TINY, num_layers=3).num_layers == 3
  with pytest.raises(ValueError, match=r"unknown fields \['hiden_size'\]"):
    BertConfig.from_mapping(dict(TINY, hiden_size=8))


def test_sequence_longer_than_position_table_names_the_field():
  config = tiny(max_position_embeddings=8)
  ids = jnp.zeros((1, 9), jnp.int32)
  with pytest.raises(ValueError, match="model.max_position_embeddings=8"):
    jax.eval_shape(lambda: BertForPreTraining(config).init(
        jax.random.key(0), ids, ids, ids, ids[:, :2]))


def _scatter_result_types(stablehlo: str) -> list[str]:
  """The result type of every scatter in lowered StableHLO text."""
  types = []
  for op in re.finditer(r'"stablehlo\.scatter"', stablehlo):
    signature = stablehlo.index("}) : (", op.end())
    types.append(re.match(r"\}\) : \(.*?\) -> (tensor<[^>]*>)", stablehlo[signature:]).group(1))
  return types


@pytest.mark.parametrize("packed", [False, True])
def test_embedding_gradients_scatter_only_into_the_word_table_in_fp32(packed):
  """With bf16 compute the lookups' gradients add up in fp32: the word table's
  is the one scatter-add into a table (in fp32), the position table's only
  with packed rows' position ids, and the segment table's none."""
  config = tiny(dtype="bfloat16", hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  params = init_params(config)
  batch = {k: jnp.asarray(v) for k, v in make_batch().items()}
  if packed:
    batch.update(packed_example_ids=batch["input_mask"],
                 position_ids=jnp.broadcast_to(jnp.arange(LENGTH), (BATCH, LENGTH)),
                 next_sentence_positions=jnp.zeros((BATCH, 1), jnp.int32))

  def loss(params):
    out = BertForPreTraining(config).apply(params, **batch, sequence_output=False)
    return jnp.sum(out["mlm_logits"][..., :TINY["vocab_size"]]) + jnp.sum(out["nsp_logits"])
  types = _scatter_result_types(jax.jit(jax.grad(loss)).lower(params).as_text())
  D = TINY["hidden_size"]
  word = f"tensor<{config.padded_vocab_size}x{D}xf32>"
  position = f"tensor<{TINY['max_position_embeddings']}x{D}xf32>"
  tables = (config.padded_vocab_size, TINY["max_position_embeddings"], config.type_vocab_size)
  into_tables = [t for t in types if any(t.startswith(f"tensor<{n}x{D}x") for n in tables)]
  assert sorted(into_tables) == sorted([word] + ([position] if packed else []))
