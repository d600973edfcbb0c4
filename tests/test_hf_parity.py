"""bertjax vs Hugging Face's FlaxBertForPreTraining, and the HF converter.

Randomly initialised transformers models (no downloads) are converted to
bertjax; sequence output, pooled output, MLM logits at the masked positions
and NSP logits must agree to 1e-5 in fp32 with matmul precision 'highest'.
Both models compute padded query rows the same way (attending to the
unpadded keys only), so the sequence output is compared at every position,
padded ones included.
"""

import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformers

from bertjax.convert import hf
from bertjax.convert import hf_files
from bertjax.model.bert import BertForPreTraining, BertModel

ATOL = 1e-5
BATCH, LENGTH, PREDICTIONS = 4, 24, 5

# Sizes: (name, transformers.BertConfig fields). "narrow" has intermediate != 4H,
# three segment types and a short position table.
SIZES = {
    "l2_h64_a4": dict(vocab_size=300, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=256),
    "l3_h96_a6_f200": dict(vocab_size=517, hidden_size=96, num_hidden_layers=3,
                           num_attention_heads=6, intermediate_size=200,
                           max_position_embeddings=64, type_vocab_size=3),
    "l1_h32_a2_f48": dict(vocab_size=211, hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=48,
                          max_position_embeddings=40),
}


@pytest.fixture(scope="module", autouse=True)
def highest_precision():
  old = jax.config.jax_default_matmul_precision
  jax.config.update("jax_default_matmul_precision", "highest")
  yield
  jax.config.update("jax_default_matmul_precision", old)


def hf_bert_config(**fields):
  return transformers.BertConfig(**{"hidden_act": "gelu", "layer_norm_eps": 1e-12, **fields})


def random_hf_params(hf_config, seed):
  """Every HF weight random (biases and LayerNorm too), as numpy fp32."""
  shapes = transformers.FlaxBertForPreTraining(hf_config, _do_init=False).params_shape_tree
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    x = rng.normal(0.0, 0.1, leaf.shape).astype(np.float32)
    return x + 1.0 if path[-1].key == "scale" else x
  return jax.tree_util.tree_map_with_path(fill, shapes)


def make_batch(config, padding, seed):
  """Token ids, 0/1 mask, segments and sorted masked positions (within the unpadded part)."""
  rng = np.random.default_rng(seed)
  if padding == "none":
    lengths = np.full(BATCH, LENGTH)
  else:  # ragged: one full row, the others padded by different amounts
    lengths = np.array([LENGTH, 17, 9, 6])
  mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(1, config["vocab_size"], (BATCH, LENGTH)).astype(np.int32) * mask
  types = config.get("type_vocab_size", 2)
  segments = (np.arange(LENGTH)[None, :] >= lengths[:, None] // 2).astype(np.int32)
  segments = np.minimum(segments * rng.integers(1, types, (BATCH, 1)), types - 1) * mask
  positions = np.stack([np.sort(rng.choice(n, PREDICTIONS, replace=False)) for n in lengths])
  return dict(input_ids=ids, input_mask=mask, segment_ids=segments.astype(np.int32),
              masked_lm_positions=positions.astype(np.int32))


def hf_outputs(hf_config, hf_params, batch):
  """FlaxBertForPreTraining's logits plus FlaxBertModel's sequence and pooled outputs."""
  pretraining = transformers.FlaxBertForPreTraining(hf_config, _do_init=False).module
  encoder = transformers.FlaxBertModel(hf_config, _do_init=False).module
  ids, mask, seg = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
  position_ids = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)

  @jax.jit
  def run(params):
    out = pretraining.apply({"params": params}, ids, mask, seg, position_ids, None,
                            deterministic=True)
    base = encoder.apply({"params": params["bert"]}, ids, mask, seg, position_ids, None,
                         deterministic=True)
    return dict(sequence_output=base.last_hidden_state, pooled_output=base.pooler_output,
                prediction_logits=out.prediction_logits,
                nsp_logits=out.seq_relationship_logits)
  out = jax.tree.map(np.asarray, run(hf_params))
  out["mlm_logits"] = np.take_along_axis(
      out.pop("prediction_logits"), batch["masked_lm_positions"][..., None], axis=1)
  return out


@functools.lru_cache(maxsize=None)
def _jitted_apply(config):
  return jax.jit(lambda p, b: BertForPreTraining(config).apply(p, **b, deterministic=True))


def bertjax_outputs(config, params, batch):
  return jax.tree.map(np.asarray, _jitted_apply(config)(params, batch))


def max_diffs(ours, ref):
  return {k: float(np.abs(ours[k].astype(np.float32) - ref[k]).max()) for k in ref}


@pytest.fixture(scope="module")
def references():
  """Per size: HF config, random HF params and HF outputs for both paddings."""
  refs = {}
  for seed, (name, fields) in enumerate(SIZES.items()):
    hf_config = hf_bert_config(**fields)
    params = random_hf_params(hf_config, seed)
    batches = {p: make_batch(fields, p, seed) for p in ("none", "ragged")}
    outputs = {p: hf_outputs(hf_config, params, b) for p, b in batches.items()}
    refs[name] = (hf_config, params, batches, outputs)
  return refs


@pytest.mark.slow
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize(("scan_layers", "layer_loop"),
                         [(True, "scan"), (True, "unroll"), (False, "scan")])
def test_outputs_match_transformers(references, size, scan_layers, layer_loop):
  hf_config, hf_params, batches, outputs = references[size]
  config = hf.hf_config_to_bertjax(hf_config, scan_layers=scan_layers, layer_loop=layer_loop)
  params = hf.hf_to_bertjax(hf_params, config)
  for padding, batch in batches.items():
    ref = outputs[padding]
    # The reference is not degenerate: logits spread well beyond the tolerance.
    assert np.std(ref["mlm_logits"]) > 0.1 and np.std(ref["nsp_logits"]) > 0.01
    diffs = max_diffs(bertjax_outputs(config, params, batch), ref)
    print(f"{size} scan_layers={scan_layers} {layer_loop} padding={padding} "
          f"max|diff|: {diffs}")
    assert all(d <= ATOL for d in diffs.values()), (padding, diffs)


def test_converted_params_match_bertjax_init_tree(references):
  hf_config, hf_params, _, _ = references["l2_h64_a4"]
  for scan_layers in (True, False):
    config = hf.hf_config_to_bertjax(hf_config, scan_layers=scan_layers)
    abstract = jax.eval_shape(
        lambda: nn.unbox(BertForPreTraining(config).init(
            jax.random.key(0), *(jnp.zeros((1, 8), jnp.int32),) * 3,
            jnp.zeros((1, 2), jnp.int32))))
    converted = hf.hf_to_bertjax(hf_params, config)
    assert jax.tree.structure(converted) == jax.tree.structure(abstract)
    jax.tree.map(lambda x, a: np.testing.assert_equal(x.shape, a.shape), converted, abstract)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(converted))


def _equal_trees(a, b):
  a, b = jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b)
  return (jax.tree.structure(a) == jax.tree.structure(b)
          and all(np.array_equal(x, y) and x.dtype == y.dtype
                  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))


def test_round_trips_are_exact(references):
  hf_config, hf_params, _, _ = references["l3_h96_a6_f200"]
  stacked = hf.hf_to_bertjax(hf_params, hf.hf_config_to_bertjax(hf_config, scan_layers=True))
  unrolled = hf.hf_to_bertjax(hf_params, hf.hf_config_to_bertjax(hf_config, scan_layers=False))
  for params, scan in ((stacked, True), (unrolled, False)):
    config = hf.hf_config_to_bertjax(hf_config, scan_layers=scan)
    back = hf.bertjax_to_hf(params, config)
    assert _equal_trees(back, hf_params)
    assert _equal_trees(hf.hf_to_bertjax(back, config), params)
  # Restacking through HF: scanned -> unrolled, and the 'params' level is optional.
  config_unrolled = hf.hf_config_to_bertjax(hf_config, scan_layers=False)
  restacked = hf.hf_to_bertjax(hf.bertjax_to_hf(stacked["params"], config_unrolled),
                               config_unrolled)
  assert _equal_trees(restacked, unrolled)
  np.testing.assert_array_equal(
      stacked["params"]["bert"]["encoder"]["layers"]["attention"]["query"]["kernel"][2],
      unrolled["params"]["bert"]["encoder"]["layer_2"]["attention"]["query"]["kernel"])


def test_boxed_params_from_init_convert(references):
  """bertjax_to_hf accepts init's partitioning boxes and jax arrays."""
  hf_config = references["l1_h32_a2_f48"][0]
  config = hf.hf_config_to_bertjax(hf_config)
  ids = jnp.zeros((1, 8), jnp.int32)
  boxed = jax.jit(lambda: BertForPreTraining(config).init(
      jax.random.key(1), ids, ids, ids, ids[:, :2]))()
  assert isinstance(boxed["params"]["nsp"]["kernel"], nn.Partitioned)
  converted = hf.bertjax_to_hf(boxed, config)
  assert _equal_trees(hf.hf_to_bertjax(converted, config), nn.unbox(boxed))


def test_flax_checkpoint_loads_in_transformers(references, tmp_path):
  hf_config, hf_params, batches, outputs = references["l2_h64_a4"]
  config = hf.hf_config_to_bertjax(hf_config, scan_layers=True)
  params = hf.hf_to_bertjax(hf_params, config)
  hf_files.save_hf_checkpoint(params, config, str(tmp_path), format="flax")
  assert sorted(os.listdir(tmp_path)) == ["config.json", "flax_model.msgpack"]
  model, loaded = transformers.FlaxBertForPreTraining.from_pretrained(
      str(tmp_path), _do_init=False)
  assert model.config.hidden_act == "gelu" and model.config.num_hidden_layers == 2
  assert _equal_trees(loaded, hf_params)
  diffs = max_diffs(bertjax_outputs(config, params, batches["ragged"]),
                    hf_outputs(model.config, loaded, batches["ragged"]))
  assert all(d <= ATOL for d in diffs.values()), diffs
  # And our own loader reads the Flax file back.
  reloaded, reloaded_config = hf_files.load_hf_checkpoint(str(tmp_path))
  assert reloaded_config == config and _equal_trees(reloaded, params)


@pytest.mark.slow
def test_safetensors_checkpoint_round_trip(references, tmp_path):
  hf_config, hf_params, _, _ = references["l1_h32_a2_f48"]
  config = hf.hf_config_to_bertjax(hf_config, scan_layers=False, dtype="bfloat16")
  params = hf.hf_to_bertjax(hf_params, config)
  path = hf_files.save_hf_checkpoint(params, config, str(tmp_path), format="safetensors")
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(path, framework="numpy") as f:
    assert f.metadata() == {"format": "pt"}
    names = set(f.keys())
    # PyTorch layout: Linear weights are [out, in].
    np.testing.assert_array_equal(
        f.get_tensor("bert.encoder.layer.0.intermediate.dense.weight"),
        hf_params["bert"]["encoder"]["layer"]["0"]["intermediate"]["dense"]["kernel"].T)
  assert "bert.encoder.layer.0.attention.self.query.weight" in names
  assert "cls.predictions.bias" in names and "bert.embeddings.LayerNorm.weight" in names
  loaded, loaded_config = hf_files.load_hf_checkpoint(str(tmp_path), scan_layers=False,
                                                dtype="bfloat16")
  assert loaded_config == config and _equal_trees(loaded, params)
  # Read by transformers' own PyTorch-name conversion (safetensors needs no torch).
  model = transformers.FlaxBertForPreTraining.from_pretrained(str(tmp_path))
  assert _equal_trees(model.params, hf_params)


def _torch_state(hf_params):
  return hf_files.hf_flat_to_torch(hf_params)  # pylint: disable=protected-access


def _write_torch_dir(directory, state, hf_config, index_split=None):
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  hf_config.save_pretrained(directory)
  if index_split is None:
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return
  names = sorted(state)
  shards = {"model-00001-of-00002.safetensors": names[:index_split],
            "model-00002-of-00002.safetensors": names[index_split:]}
  for shard, keys in shards.items():
    save_file({k: state[k] for k in keys}, os.path.join(directory, shard),
              metadata={"format": "pt"})
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {k: s for s, ks in shards.items() for k in ks}}, f)


def test_torch_style_checkpoint_variants(references, tmp_path):
  """Original gamma/beta names, tied decoder tensors, buffers, shards."""
  hf_config, hf_params, _, _ = references["l2_h64_a4"]
  config = hf.hf_config_to_bertjax(hf_config)
  want = hf.hf_to_bertjax(hf_params, config)
  state = _torch_state(hf_params)
  old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                  "LayerNorm.beta"): v
         for k, v in state.items()}
  old["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
  old["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
  old["bert.embeddings.position_ids"] = np.arange(512)[None]
  _write_torch_dir(tmp_path / "old", old, hf_config)
  loaded, _ = hf_files.load_hf_checkpoint(str(tmp_path / "old"))
  assert _equal_trees(loaded, want)

  _write_torch_dir(tmp_path / "sharded", state, hf_config, index_split=7)
  loaded, _ = hf_files.load_hf_checkpoint(str(tmp_path / "sharded"))
  assert _equal_trees(loaded, want)

  untied = dict(state)
  untied["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"] + 1
  _write_torch_dir(tmp_path / "untied", untied, hf_config)
  with pytest.raises(ValueError, match="not tied"):
    hf_files.load_hf_checkpoint(str(tmp_path / "untied"))

  # A fine-tuned classifier: the encoder loads with encoder_only; heads are required otherwise.
  classifier = {k: v for k, v in state.items() if not k.startswith("cls.")}
  classifier["classifier.weight"] = np.zeros((3, 64), np.float32)
  _write_torch_dir(tmp_path / "classifier", classifier, hf_config)
  with pytest.raises(ValueError, match="no pretraining heads.*encoder_only=True"):
    hf_files.load_hf_checkpoint(str(tmp_path / "classifier"))
  encoder, _ = hf_files.load_hf_checkpoint(str(tmp_path / "classifier"), encoder_only=True)
  assert _equal_trees(encoder["params"], want["params"]["bert"])

  # Missing weights are named.
  del state["bert.encoder.layer.1.output.dense.bias"]
  _write_torch_dir(tmp_path / "missing", state, hf_config)
  with pytest.raises(ValueError, match="Missing 1: bert/encoder/layer/1/output/dense/bias"):
    hf_files.load_hf_checkpoint(str(tmp_path / "missing"))


def test_pytorch_bin_without_torch_says_what_to_do(references, tmp_path):
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
    pytest.skip("torch is installed; .bin files are read with it")
  except ImportError:
    pass
  references["l1_h32_a2_f48"][0].save_pretrained(str(tmp_path))
  (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
  with pytest.raises(ValueError, match="pip install torch.*safetensors"):
    hf_files.load_hf_checkpoint(str(tmp_path))


def test_encoder_only_export_for_fine_tuning(references, tmp_path):
  hf_config, hf_params, batches, _ = references["l2_h64_a4"]
  config = hf.hf_config_to_bertjax(hf_config)
  params = hf.hf_to_bertjax(hf_params, config)
  batch = batches["ragged"]
  ours = jax.jit(lambda p: BertModel(config).apply(
      {"params": p["params"]["bert"]}, batch["input_ids"], batch["input_mask"],
      batch["segment_ids"]))(params)
  for fmt in ("flax", "safetensors"):
    out_dir = str(tmp_path / fmt)
    hf_files.save_hf_checkpoint(params, config, out_dir, format=fmt, encoder_only=True)
    with open(os.path.join(out_dir, "config.json")) as f:
      assert json.load(f)["architectures"] == ["BertModel"]
    with pytest.raises(ValueError, match="no pretraining heads"):
      hf_files.load_hf_checkpoint(out_dir)
    encoder, _ = hf_files.load_hf_checkpoint(out_dir, encoder_only=True)
    assert set(encoder["params"]) == {"embeddings", "encoder", "pooler"}
    assert _equal_trees(encoder["params"], params["params"]["bert"])
  # transformers' FlaxBertModel reads the Flax export and computes the same encoder.
  model, loaded = transformers.FlaxBertModel.from_pretrained(str(tmp_path / "flax"),
                                                             _do_init=False)
  assert _equal_trees(loaded, hf_params["bert"])
  ids = batch["input_ids"]
  position_ids = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  out = jax.jit(lambda p: model.module.apply(
      {"params": p}, ids, batch["input_mask"], batch["segment_ids"], position_ids, None))(loaded)
  np.testing.assert_allclose(ours[0], out.last_hidden_state, atol=ATOL, rtol=0)
  np.testing.assert_allclose(ours[1], out.pooler_output, atol=ATOL, rtol=0)


def test_save_refuses_to_mix_formats(references, tmp_path):
  hf_config, hf_params, _, _ = references["l1_h32_a2_f48"]
  config = hf.hf_config_to_bertjax(hf_config)
  params = hf.hf_to_bertjax(hf_params, config)
  hf_files.save_hf_checkpoint(params, config, str(tmp_path), format="flax")
  with pytest.raises(ValueError, match="already holds.*flax_model.msgpack"):
    hf_files.save_hf_checkpoint(params, config, str(tmp_path), format="safetensors")
  with pytest.raises(ValueError, match="format='torch'"):
    hf_files.save_hf_checkpoint(params, config, str(tmp_path), format="torch")


def test_config_conversion():
  hf_config = hf_bert_config(vocab_size=123, hidden_size=48, num_hidden_layers=3,
                             num_attention_heads=4, intermediate_size=100,
                             hidden_dropout_prob=0.05, attention_probs_dropout_prob=0.2,
                             max_position_embeddings=77, type_vocab_size=3,
                             initializer_range=0.03, layer_norm_eps=1e-6)
  config = hf.hf_config_to_bertjax(hf_config, scan_layers=False, remat_policy="full")
  assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads,
          config.intermediate_size, config.max_position_embeddings,
          config.type_vocab_size) == (123, 48, 3, 4, 100, 77, 3)
  assert (config.hidden_dropout_rate, config.attention_dropout_rate, config.initializer_range,
          config.layer_norm_eps) == (0.05, 0.2, 0.03, 1e-6)
  assert not config.scan_layers and config.remat_policy == "full"
  back = hf.bertjax_config_to_hf(config)
  assert back.hidden_act == "gelu" and back.layer_norm_eps == 1e-6
  assert hf.hf_config_to_bertjax(back, scan_layers=False, remat_policy="full") == config
  assert hf.hf_config_to_bertjax(hf_config.to_dict()) == hf.hf_config_to_bertjax(hf_config)

  for field, value in (("hidden_act", "gelu_new"), ("hidden_act", "relu"),
                       ("position_embedding_type", "relative_key"),
                       ("tie_word_embeddings", False)):
    bad = hf_config.to_dict()
    bad[field] = value
    with pytest.raises(ValueError, match=f"{field}="):
      hf.hf_config_to_bertjax(bad)
  with pytest.raises(ValueError, match="unknown fields.*not_a_field"):
    hf.hf_config_to_bertjax(hf_config, not_a_field=1)


def test_shape_and_key_mismatches_are_named(references):
  hf_config, hf_params, _, _ = references["l2_h64_a4"]
  wrong_vocab = hf.hf_config_to_bertjax(hf_config).replace(vocab_size=301)
  with pytest.raises(ValueError, match="word_embeddings/embedding has shape"):
    hf.hf_to_bertjax(hf_params, wrong_vocab)
  deeper = hf.hf_config_to_bertjax(hf_config).replace(num_layers=3)
  with pytest.raises(ValueError, match="Missing 16: bert/encoder/layer/2/"):
    hf.hf_to_bertjax(hf_params, deeper)
  shallower = hf.hf_config_to_bertjax(hf_config).replace(num_layers=1)
  with pytest.raises(ValueError, match="Unexpected 16: bert/encoder/layer/1/"):
    hf.hf_to_bertjax(hf_params, shallower)
  untied = jax.tree.map(lambda x: x, hf_params)
  untied["cls"]["predictions"]["decoder"] = {"kernel": np.zeros((64, 300), np.float32)}
  with pytest.raises(ValueError, match="untied MLM decoder"):
    hf.hf_to_bertjax(untied, hf.hf_config_to_bertjax(hf_config))


def _masked_lm_targets(config_fields, batch, seed):
  rng = np.random.default_rng(seed + 100)
  weights = np.ones(batch["masked_lm_positions"].shape, np.float32)
  weights[-1, -2:] = 0.0  # Padding predictions, as records carry them.
  return dict(masked_lm_ids=rng.integers(1, config_fields["vocab_size"],
                                         weights.shape).astype(np.int32),
              masked_lm_weights=weights,
              next_sentence_labels=rng.integers(0, 2, (BATCH,)).astype(np.int32),
              example_weights=np.ones((BATCH,), np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("size", ["l2_h64_a4", "l3_h96_a6_f200"])
@pytest.mark.parametrize("scan_layers", [True, False])
def test_pretraining_loss_gradients_match_transformers(references, size, scan_layers):
  """The gradient of the train step's loss (the last layer at [CLS] and the
  masked positions, the written-out gradients) against autodiff of
  transformers' FlaxBertForPreTraining on the same weights, fp32, no dropout."""
  from bertjax.records.schema import EXAMPLE_WEIGHT_KEY  # pylint: disable=g-import-not-at-top
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  hf_config, hf_params, batches, _ = references[size]
  batch = dict(batches["ragged"])
  targets = _masked_lm_targets(SIZES[size], batch, 0)
  targets[EXAMPLE_WEIGHT_KEY] = targets.pop("example_weights")
  batch.update(targets)
  pretraining = transformers.FlaxBertForPreTraining(hf_config, _do_init=False).module
  position_ids = np.broadcast_to(np.arange(LENGTH), batch["input_ids"].shape)
  mlm_w, nsp_w = batch["masked_lm_weights"], batch[EXAMPLE_WEIGHT_KEY]

  def hf_loss(params):
    out = pretraining.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                            batch["segment_ids"], position_ids, None, deterministic=True)
    logits = jnp.take_along_axis(out.prediction_logits,
                                 batch["masked_lm_positions"][..., None], axis=1)
    mlm = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["masked_lm_ids"][..., None],
                               -1)[..., 0]
    nsp = -jnp.take_along_axis(jax.nn.log_softmax(out.seq_relationship_logits),
                               batch["next_sentence_labels"][:, None], -1)[:, 0]
    return jnp.sum(mlm * mlm_w) / jnp.sum(mlm_w) + jnp.sum(nsp * nsp_w) / jnp.sum(nsp_w)

  config = hf.hf_config_to_bertjax(hf_config, scan_layers=scan_layers)
  params = hf.hf_to_bertjax(hf_params, config)["params"]
  apply_fn = BertForPreTraining(config).apply

  def our_loss(p):
    sums = step_lib.loss_sums(p, apply_fn, batch, None, deterministic=True)
    return sums["mlm_loss"] / sums["mlm_weight"] + sums["nsp_loss"] / sums["nsp_weight"]

  ref_loss, ref_grads = jax.jit(jax.value_and_grad(hf_loss))(hf_params)
  loss, grads = jax.jit(jax.value_and_grad(our_loss))(params)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  # HF's gradients in bertjax's layout: the converter only reshapes, transposes and stacks.
  expected = hf.hf_to_bertjax(jax.tree.map(np.asarray, ref_grads), config)["params"]
  got = jax.tree.map(np.asarray, grads)
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(expected))
  for (path, g), e in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(expected)):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 * scale,
                               err_msg=jax.tree_util.keystr(path))
  # Not vacuous: the last layer's and the word table's gradients are far from zero.
  word = got["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert np.abs(word).max() > 1e-3 * scale
