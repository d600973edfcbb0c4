"""The paper's pretraining objectives (Table 5): mlm+nsp, mlm (No NSP) and ltr
(LTR & No NSP): causal attention in every kernel, the losses, the records each
is made from, the check of records against the objective, and the export of a
left-to-right model that transformers computes the same."""

import collections
import functools
import os
import re
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import data_utils
from bertjax.convert import hf
from bertjax.convert import hf_files
from bertjax.create import creation
from bertjax.create import documents
from bertjax.model import attention
from bertjax.model.bert import BertForPreTraining, BertModel
from bertjax.model.config import BertConfig
from bertjax.records import schema
from bertjax.train import loop
from bertjax.train import run_config
from bertjax.train import step as step_lib
from bertjax.train import state as state_lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "configs"))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position

TINY = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
            max_position_embeddings=32, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)


def _qkv(L, seed=0, B=2, N=2, H=16):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=(B, L, N, H)), jnp.float32) for _ in range(3))
  mask = jnp.asarray(np.arange(L)[None, :] < np.array([L, L - 9])[:, None])
  return q, k, v, mask


def _reference(q, k, v, mask):
  """Causal attention in numpy: query i sees the real keys j <= i."""
  q, k, v, mask = (np.asarray(x, np.float64) for x in (q, k, v, mask))
  L = q.shape[1]
  logits = np.einsum("blnh,bsnh->bnls", q, k) / np.sqrt(q.shape[-1])
  allowed = (np.tril(np.ones((L, L)))[None, None] * mask[:, None, None, :]) > 0
  logits = np.where(allowed, logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bnls,bsnh->blnh", p, v)


@pytest.mark.slow
def test_every_attention_kernel_honours_causal():
  q, k, v, mask = _qkv(128)
  real = np.asarray(mask)
  ref = _reference(q, k, v, mask)
  xla = np.asarray(attention.xla_attention(q, k, v, mask, causal=True))
  np.testing.assert_allclose(xla[real], ref[real], atol=1e-5)
  # cuDNN's call (is_causal) through jax.nn.dot_product_attention's XLA path.
  cudnn = np.asarray(attention.cudnn_attention(q, k, v, mask, implementation="xla",
                                               causal=True))
  np.testing.assert_allclose(cudnn[real], ref[real], atol=1e-5)
  splash = np.asarray(attention.splash_attention(q, k, v, mask, interpret=True, causal=True))
  np.testing.assert_allclose(splash[real], ref[real], atol=1e-5)
  # The mask is live: bidirectional attention differs.
  full = np.asarray(attention.xla_attention(q, k, v, mask))
  assert np.abs(full[real] - ref[real]).max() > 1e-2
  # Gradients through the causal XLA kernel match autodiff of the reference's jnp twin.
  def loss(fn, q):
    return jnp.sum(fn(q) * jnp.asarray(real, jnp.float32)[:, :, None, None])
  g = jax.grad(lambda q: loss(lambda q: attention.xla_attention(q, k, v, mask, causal=True),
                              q))(q)
  g_cudnn = jax.grad(lambda q: loss(lambda q: attention.cudnn_attention(
      q, k, v, mask, implementation="xla", causal=True), q))(q)
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_cudnn), atol=1e-5)


def test_queries_at_some_positions_are_refused_with_causal():
  q, k, v, mask = _qkv(16)
  with pytest.raises(ValueError, match="model.causal"):
    attention.attend(q[:, :3], k, v, mask, impl="xla", attention_dropout_rate=0.0,
                     dtype="float32", dropout=None, deterministic=True, causal=True)


def _batch(L=16, B=3, seed=0, vocab=97):
  rng = np.random.default_rng(seed)
  lengths = np.array([L, L - 5, 7])[:B]
  mask = (np.arange(L)[None, :] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab, (B, L)).astype(np.int32) * mask
  return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
          "masked_lm_positions": np.tile(np.arange(1, 4, dtype=np.int32), (B, 1)),
          "masked_lm_ids": ids[:, 1:4], "masked_lm_weights": np.ones((B, 3), np.float32),
          "next_sentence_labels": np.zeros(B, np.int32),
          schema.EXAMPLE_WEIGHT_KEY: np.ones(B, np.float32)}


@pytest.mark.slow
def test_causal_model_output_does_not_see_later_tokens():
  config = BertConfig(**TINY, causal=True)
  batch = _batch()
  model = BertModel(config)
  args = lambda ids: (ids, batch["input_mask"], batch["segment_ids"])
  params = model.init(jax.random.key(0), *args(batch["input_ids"]))
  changed = batch["input_ids"].copy()
  changed[:, 5] = 6
  a = np.asarray(model.apply(params, *args(batch["input_ids"]))[0])
  b = np.asarray(model.apply(params, *args(changed))[0])
  np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-6)
  assert np.abs(a[0, 5:] - b[0, 5:]).max() > 1e-3


def test_causal_pooled_output_reads_each_rows_last_real_token():
  config = BertConfig(**TINY, causal=True)
  batch = _batch()  # Rows of 16, 11 and 7 real tokens.
  model = BertModel(config)
  args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
  params = model.init(jax.random.key(0), *args)
  seq, pooled = (np.asarray(x) for x in model.apply(params, *args))
  pooler = jax.tree.map(np.asarray, nn.unbox(params["params"]["pooler"]))
  pool = lambda h_BxD: np.tanh(h_BxD @ pooler["kernel"] + pooler["bias"])
  np.testing.assert_allclose(pooled, pool(seq[np.arange(3), [15, 10, 6]]), atol=1e-5)
  # Not [CLS]'s, which under the causal mask has seen only itself.
  assert np.abs(pooled - pool(seq[:, 0])).max() > 1e-3
  # A change at a row's last real token changes its pooled output; one in the
  # padding past it does not.
  changed = batch["input_ids"].copy()
  changed[1, 10], changed[2, 9] = 6, 6
  _, pooled_changed = model.apply(params, changed, *args[1:])
  diff = np.abs(np.asarray(pooled_changed) - pooled).max(-1)
  assert diff[0] == 0 and diff[1] > 1e-4 and diff[2] < 1e-6
  # Packed rows (several examples per row) are refused by name.
  packed = dict(packed_example_ids=batch["input_mask"], position_ids=np.zeros_like(args[0]),
                cls_positions=np.zeros((3, 1), np.int32))
  with pytest.raises(ValueError, match="model.causal: packed rows"):
    model.apply(params, *args, **packed)


def _state(config):
  model = BertForPreTraining(config)
  import optax  # pylint: disable=g-import-not-at-top
  boxed = state_lib.init_params(model, jax.random.key(0), seq_len=16, num_pred=3)
  params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, boxed,
                        is_leaf=lambda x: hasattr(x, "unbox"))
  tx = optax.sgd(0.1)
  return state_lib.TrainState(step=jnp.zeros([], jnp.int32), params=params,
                              opt_state=tx.init(params), apply_fn=model.apply, tx=tx)


@pytest.mark.slow
def test_ltr_loss_is_next_token_cross_entropy_at_every_real_position():
  config = run_config.validate(_objective_config("ltr"), vocab_size=97)
  assert config.causal and not config.next_sentence_head
  state = _state(config)
  assert "nsp" not in state.params
  batch = _batch()
  sums = step_lib.eval_step(state, batch, objective="ltr")
  logits = np.asarray(state.apply_fn({"params": state.params}, batch["input_ids"],
                                     batch["input_mask"], batch["segment_ids"],
                                     batch["masked_lm_positions"])["lm_logits"], np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                           keepdims=True)) \
      - logits.max(-1, keepdims=True)
  want, count = 0.0, 0
  for b in range(3):
    n = int(batch["input_mask"][b].sum())
    for t in range(n - 1):  # Position t predicts the real token at t + 1.
      want -= logp[b, t, batch["input_ids"][b, t + 1]]
      count += 1
  np.testing.assert_allclose(float(sums["mlm_loss"]), want, rtol=1e-5)
  assert float(sums["mlm_weight"]) == count
  assert float(sums["nsp_weight"]) == 0.0 and float(sums["nsp_loss"]) == 0.0
  # One train step moves the parameters and its loss is the per-token mean,
  # also with the model's apply wrapped: the objective alone decides.
  train = jax.jit(functools.partial(step_lib.train_step, objective="ltr"))
  wrapped = state.replace(apply_fn=lambda *a, **k: state.apply_fn(*a, **k))
  for s in (state, wrapped):
    _, metrics = train(s, batch, jax.random.key(1))
    np.testing.assert_allclose(float(metrics["loss"]), want / count, rtol=1e-5)
    assert float(metrics["nsp_loss"]) == 0.0
  # A model without the objective's logits is a clear error, not another loss.
  with pytest.raises(ValueError, match=r"objective='mlm\+nsp' needs the model's mlm_logits"):
    step_lib.eval_step(state, batch)


def test_mlm_objective_has_no_nsp_head_and_loss():
  config = run_config.validate(_objective_config("mlm"), vocab_size=97)
  assert not config.causal and not config.next_sentence_head
  state = _state(config)
  assert "nsp" not in state.params and "mlm" in state.params
  batch = _batch()
  sums = step_lib.eval_step(state, batch, objective="mlm")
  assert float(sums["mlm_weight"]) == 9.0 and float(sums["mlm_loss"]) > 0
  assert float(sums["nsp_weight"]) == 0.0
  paper = run_config.validate(_objective_config("mlm+nsp"), vocab_size=97)
  assert paper.next_sentence_head and not paper.causal
  with pytest.raises(ValueError, match=r"objective='mlm\+nsp' needs the model's nsp_logits"):
    step_lib.eval_step(state, batch)


def test_ltr_with_dynamic_masking_is_refused_naming_both_fields():
  # configs/modern.py turns dynamic masking on; ltr's targets are the records' tokens.
  config = _objective_config("ltr")
  config.data.dynamic_masking = True
  with pytest.raises(run_config.ConfigError,
                     match=r"--config\.data\.dynamic_masking: objective='ltr'"):
    run_config.validate(config, vocab_size=97)


def _objective_config(objective, **changes):
  config = base.get_config()
  config.objective = objective
  config.model.update(**{k: v for k, v in TINY.items() if k != "vocab_size"}, vocab_size=97,
                      dtype="float32")
  config.data.source = "synthetic"
  config.phases.seq128.update(fraction=1.0, max_seq_length=32, max_predictions_per_seq=6,
                              global_batch_size=4)
  del config.phases["seq512"]
  for k, v in changes.items():
    config[k] = v
  return config


def test_bad_objective_and_contradicting_causal_name_the_field():
  with pytest.raises(run_config.ConfigError, match="--config.objective"):
    run_config.validate(_objective_config("nsp"))
  config = _objective_config("mlm")
  config.model.causal = True
  with pytest.raises(run_config.ConfigError, match="--config.model.causal"):
    run_config.validate(config)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("objectives"))
  paths, vocab = data_utils.write_files_corpus(os.path.join(root, "text"), 3, 12, seed=1)
  spec = creation.TokenizerSpec("wordpiece", vocab, True)
  out = {}
  for objective in schema.OBJECTIVES:
    config = creation.CreationConfig(max_seq_length=32, max_predictions_per_seq=6,
                                     dupe_factor=1, num_output_shards=2, docs_per_chunk=8,
                                     objective=objective)
    out[objective] = os.path.join(root, objective.replace("+", "_"))
    creation.create_pretraining_data(documents.list_input_shards(",".join(paths)), spec,
                                     config, out[objective], num_workers=1, source="test",
                                     show_progress=False)
  return dict(root=root, paths=paths, vocab=vocab, out=out)


def _corpus_tokens(paths, vocab_path):
  with open(vocab_path, encoding="utf-8") as f:
    ids = {t: i for i, t in enumerate(f.read().split("\n"))}
  counts = collections.Counter()
  for p in paths:
    with open(p, encoding="utf-8") as f:
      for word in f.read().replace(".", " . ").split():
        counts[ids[word]] += 1
  return counts


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_full_sentence_records_cover_the_text_in_one_segment(corpus, objective):
  out = corpus["out"][objective]
  md = schema.read_metadata(out)
  assert md.objective == objective
  assert md.masking["premasked"] is (objective == "mlm")
  ex = data_utils.parse_dataset(out)
  ids = data_utils.unmasked_ids(ex)
  lengths = ex["input_mask"].sum(1)
  ids_special = {s: i for i, s in zip(range(5), ("pad", "unk", "cls", "sep", "mask"))}
  assert (ex["segment_ids"] == 0).all() and (ex["next_sentence_labels"] == 0).all()
  assert (ids[:, 0] == ids_special["cls"]).all()
  assert (ids[np.arange(len(ids)), lengths - 1] == ids_special["sep"]).all()
  # Every token of the corpus once (dupe_factor 1), documents joined by [SEP]s.
  text = collections.Counter(int(t) for row, n in zip(ids, lengths) for t in row[1:n - 1]
                             if t != ids_special["sep"])
  assert text == _corpus_tokens(corpus["paths"], corpus["vocab"])
  assert (ids[:, 1:] == ids_special["sep"]).sum() > len(ids)  # Separators inside rows.
  assert np.median(lengths) >= 32 - 13  # Filled up to the length (sentences <= 13 ids).
  if objective == "ltr":
    assert (ex["masked_lm_weights"] == 0).all()
  else:
    k = ex["masked_lm_weights"].sum(1)
    np.testing.assert_array_equal(k, np.minimum(6, np.maximum(1, np.round(lengths * 0.15))))
    rows, cols = np.nonzero(ex["masked_lm_weights"] > 0)
    labels = ex["masked_lm_ids"][rows, cols]
    assert not np.isin(labels, [ids_special["cls"], ids_special["sep"]]).any()


def _pretrain_config(objective, train_dir, workdir_steps=3):
  config = _objective_config(objective)
  config.data.source = "tfrecord"
  config.total_steps = workdir_steps
  config.phases.seq128.train_files = os.path.join(train_dir, "part-*.tfrecord")
  config.model.vocab_size = 0
  config.optimizer.warmup_steps = 1
  config.checkpoint.every_steps = workdir_steps
  config.logging.update(every_steps=1, eval_every_steps=0)
  return config


def test_records_of_another_objective_are_refused_before_compiling(corpus, tmp_path,
                                                                   monkeypatch):
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled"))
  for objective, data in (("mlm", "mlm+nsp"), ("mlm+nsp", "ltr"), ("ltr", "mlm")):
    config = _pretrain_config(objective, corpus["out"][data])
    with pytest.raises(run_config.ConfigError,
                       match=re.escape(f"objective is '{data}' but the config has "
                                       f"objective='{objective}'")):
      loop.train_and_evaluate(config, str(tmp_path / objective))
  # Records without metadata.json are the original release's: mlm+nsp only.
  bare = tmp_path / "bare"
  data_utils.write_dataset(str(bare), 1, 8, 32, 6, 97, 0, with_metadata=False)
  config = _pretrain_config("mlm", str(bare))
  config.model.vocab_size = 97
  with pytest.raises(run_config.ConfigError, match="no metadata.json.*'mlm\\+nsp'"):
    loop.train_and_evaluate(config, str(tmp_path / "bare_run"))


def test_held_out_records_are_checked_against_the_objective_before_compiling(
    corpus, tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled"))
  # An ltr model scored on masked records would predict [MASK]; an mlm+nsp
  # model on mlm rows would score NSP labels that are all 0.
  for objective, data, accepted in (("ltr", "mlm", "'ltr'"), ("ltr", "mlm+nsp", "'ltr'"),
                                    ("mlm+nsp", "mlm", "'mlm\\+nsp'"),
                                    ("mlm", "ltr", "'mlm' or 'mlm\\+nsp'")):
    config = _pretrain_config(objective, corpus["out"][objective])
    config.phases.seq128.eval_files = os.path.join(corpus["out"][data], "part-*.tfrecord")
    with pytest.raises(run_config.ConfigError,
                       match=(r"--config\.phases\.seq128\.eval_files: .*objective is "
                              f"'{re.escape(data)}' but evaluation of an objective="
                              f"'{re.escape(objective)}' model takes records made for "
                              f"{accepted}")):
      loop.train_and_evaluate(config, str(tmp_path / f"{objective}_{data}"))
  # An mlm model is scored on the paper's held-out pairs too (masked LM only).
  from bertjax.input import pipeline  # pylint: disable=g-import-not-at-top
  md = pipeline.check_metadata(os.path.join(corpus["out"]["mlm+nsp"], "part-*.tfrecord"),
                               max_seq_length=32, max_predictions_per_seq=None,
                               objective="mlm", evaluation=True)
  assert md.objective == "mlm+nsp"


@pytest.fixture(scope="module")
def ltr_run(corpus, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("ltr_run"))
  summary = loop.train_and_evaluate(_pretrain_config("ltr", corpus["out"]["ltr"]), workdir)
  return workdir, summary


def test_ltr_pretrains_and_its_checkpoint_fine_tunes_causal(ltr_run):
  from bertjax.convert import weights  # pylint: disable=g-import-not-at-top
  workdir, summary = ltr_run
  assert summary["step"] == 3
  settings = weights.checkpoint_settings(os.path.join(workdir, "checkpoints"))
  assert settings.model["causal"] is True
  # A fine-tuning config takes it (downstream.take_checkpoint_settings) and
  # a bidirectional model is refused the causal weights.
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bertjax import downstream  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"init_from": os.path.join(workdir, "checkpoints"),
                                      "do_lower_case": True, "model": base.get_config().model})
  downstream.take_checkpoint_settings(config)
  assert config.model.causal is True
  source = weights.checkpoint_config(
      __import__("bertjax.train.checkpoint", fromlist=["x"]).read_meta(
          os.path.join(workdir, "checkpoints")), workdir)
  with pytest.raises(ValueError, match="causal=True but --config.model.causal is False"):
    weights.check_architecture(source, source.replace(causal=False), workdir)


@pytest.mark.slow
def test_ltr_export_is_a_decoder_that_transformers_computes_the_same(tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_default_matmul_precision", "highest")
  try:
    config = BertConfig(**TINY, causal=True, next_sentence_head=False, scan_layers=True)
    batch = _batch(seed=3)
    model = BertForPreTraining(config)
    params = model.init(jax.random.key(2), batch["input_ids"], batch["input_mask"],
                        batch["segment_ids"], batch["masked_lm_positions"])
    ours = model.apply(params, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                       batch["masked_lm_positions"])
    hf_files.save_hf_checkpoint(params, config, str(tmp_path), format="flax")
    hf_model = transformers.FlaxBertForCausalLM.from_pretrained(str(tmp_path))
    assert hf_model.config.is_decoder and hf_model.config.architectures == ["BertLMHeadModel"]
    out = hf_model(batch["input_ids"], attention_mask=batch["input_mask"],
                   token_type_ids=batch["segment_ids"], output_hidden_states=True)
    real = batch["input_mask"] > 0
    np.testing.assert_allclose(np.asarray(out.hidden_states[-1])[real],
                               np.asarray(ours["sequence_output"])[real], atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.logits)[real],
                               np.asarray(ours["lm_logits"])[real][:, :config.vocab_size],
                               atol=1e-4)
    # The config reads back as the causal model; the export has no NSP weights.
    assert hf.hf_config_to_bertjax(hf_model.config) == config.replace(
        scan_layers=True, next_sentence_head=True)
    assert "seq_relationship" not in hf_model.params["cls"]
  finally:
    jax.config.update("jax_default_matmul_precision", None)


def test_modern_config_builds_on_base_with_mosaicbert_settings():
  import modern as modern_config  # pylint: disable=g-import-not-at-top
  config = modern_config.get_config()
  paper = base.get_config()
  config.phases.seq128.train_files = "/data/mlm_128/*.tfrecord"
  model = run_config.validate(config, num_devices=1, platform="gpu")
  assert config.objective == "mlm" and not model.next_sentence_head and not model.causal
  for field in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size"):
    assert config.model[field] == paper.model[field]  # BERT-BASE's architecture.
  assert list(config.phases) == ["seq128"] and config.phases.seq128.global_batch_size == 4096
  assert config.data.dynamic_masking and config.data.masked_lm_prob == 0.3
  # 30% of 128 tokens fits the prediction slots.
  assert round(128 * 0.3) <= config.phases.seq128.max_predictions_per_seq
  # Warmup is 6% of the steps and the decay ends at 0.02x, also after overrides.
  assert config.optimizer.warmup_steps == 4200
  config.total_steps = 1000
  config.optimizer.learning_rate = 1e-3
  assert config.optimizer.warmup_steps == 60
  assert config.optimizer.end_learning_rate == pytest.approx(2e-5)
  # No attention dropout: 'auto' weighs the kernels without it in training.
  for platform, fused in (("gpu", "cudnn"), ("tpu", "splash")):
    kernel, why = attention.choose(model.attention_impl,
                                   attention_dropout_rate=model.attention_dropout_rate,
                                   dtype=model.dtype, platform=platform, seq_len=128,
                                   deterministic=False)
    assert kernel == fused or f"{fused} is not proven on {platform}" in why


def test_mlm_export_is_a_masked_lm_without_nsp_weights(tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_default_matmul_precision", "highest")
  try:
    config = BertConfig(**TINY, next_sentence_head=False)
    batch = _batch(seed=4)
    model = BertForPreTraining(config)
    args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"],
            batch["masked_lm_positions"])
    params = model.init(jax.random.key(5), *args)
    assert "nsp" not in params["params"]
    ours = model.apply(params, *args)
    hf_files.save_hf_checkpoint(params, config, str(tmp_path), format="flax")
    hf_model = transformers.FlaxBertForMaskedLM.from_pretrained(str(tmp_path))
    assert hf_model.config.architectures == ["BertForMaskedLM"]
    assert not hf_model.config.is_decoder and "seq_relationship" not in hf_model.params["cls"]
    logits = np.take_along_axis(np.asarray(hf_model(
        batch["input_ids"], attention_mask=batch["input_mask"],
        token_type_ids=batch["segment_ids"]).logits), batch["masked_lm_positions"][..., None],
        axis=1)
    np.testing.assert_allclose(logits, np.asarray(ours["mlm_logits"])[..., :config.vocab_size],
                               atol=1e-4)
  finally:
    jax.config.update("jax_default_matmul_precision", None)


def test_evaluation_reads_the_records_own_prediction_count(corpus):
  # A model trained with more prediction slots (30% masking) scores the paper's records.
  from bertjax.input import evaluation  # pylint: disable=g-import-not-at-top
  batches = evaluation.eval_batches(os.path.join(corpus["out"]["mlm+nsp"], "part-*.tfrecord"), 4,
                                  max_seq_length=32, max_predictions_per_seq=10,
                                  max_batches=1, process_index=0, process_count=1)
  batch = next(iter(batches))
  assert batch["masked_lm_positions"].shape == (4, 6)
