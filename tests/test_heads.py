"""The fine-tuning heads agree with transformers' Flax models given the same weights.

Every bertjax weight is random (biases and LayerNorm too); the encoder goes
to Hugging Face's layout through bertjax.convert.hf and the head's kernel and
bias are copied as they are (both [in, out]). fp32, matmul precision 'highest'.
"""

import flax.linen as nn
import jax
import numpy as np
import pytest

import cheap_compiles

transformers = pytest.importorskip("transformers")

from bertjax.convert import hf  # pylint: disable=g-import-not-at-top
from bertjax.model import heads  # pylint: disable=g-import-not-at-top
from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top

ATOL = 1e-5
BATCH, CHOICES, LENGTH = 3, 4, 20


@pytest.fixture(scope="module", autouse=True)
def highest_precision():
  old = jax.config.jax_default_matmul_precision
  jax.config.update("jax_default_matmul_precision", "highest")
  yield
  jax.config.update("jax_default_matmul_precision", old)


def _config(scan_layers, layer_loop="scan"):
  return BertConfig(vocab_size=211, hidden_size=48, num_layers=2, num_heads=4,
                    intermediate_size=96, max_position_embeddings=32, type_vocab_size=2,
                    scan_layers=scan_layers, layer_loop=layer_loop)


def _inputs(shape, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(6, shape[-1] + 1, shape[:-1])
  lengths.flat[0] = shape[-1]
  mask = (np.arange(shape[-1]) < lengths[..., None]).astype(np.int32)
  ids = rng.integers(1, 211, shape).astype(np.int32) * mask
  segments = ((np.arange(shape[-1]) >= lengths[..., None] // 2) * mask).astype(np.int32)
  return ids, mask, segments


def _random_params(model, inputs, seed=1):
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs))["params"]
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    x = rng.normal(0.0, 0.1, leaf.shape).astype(np.float32)
    return x + 1.0 if path[-1].key == "scale" else x
  return jax.tree_util.tree_map_with_path(fill, nn.unbox(shapes))


def _hf_params(params, config, head, pooler=True):
  encoder = hf.bertjax_to_hf(params["bert"], config)
  if not pooler:
    encoder.pop("pooler")
  return {"bert": encoder, head: jax.tree.map(np.asarray, params[head])}


CASES = {
    # name: (bertjax model, HF class, head name, HF keeps the pooler, input shape)
    "sequence_classification": (
        lambda c: heads.BertForSequenceClassification(c, num_labels=3),
        "FlaxBertForSequenceClassification", "classifier", True, (BATCH, LENGTH)),
    "regression": (
        lambda c: heads.BertForSequenceClassification(c, num_labels=1),
        "FlaxBertForSequenceClassification", "classifier", True, (BATCH, LENGTH)),
    "token_classification": (
        lambda c: heads.BertForTokenClassification(c, num_labels=9),
        "FlaxBertForTokenClassification", "classifier", False, (BATCH, LENGTH)),
    "multiple_choice": (
        heads.BertForMultipleChoice, "FlaxBertForMultipleChoice", "classifier", True,
        (BATCH, CHOICES, LENGTH)),
    "question_answering": (
        heads.BertForQuestionAnswering, "FlaxBertForQuestionAnswering", "qa_outputs", False,
        (BATCH, LENGTH)),
}


@pytest.mark.slow
@pytest.mark.parametrize(("scan_layers", "layer_loop"),
                         [(True, "scan"), (True, "unroll"), (False, "scan")])
@pytest.mark.parametrize("case", sorted(CASES))
def test_head_matches_transformers(case, scan_layers, layer_loop):
  make, hf_class, head, pooler, shape = CASES[case]
  config = _config(scan_layers, layer_loop)
  model = make(config)
  inputs = _inputs(shape)
  params = _random_params(model, inputs)
  ours = cheap_compiles.jit(
      lambda p: model.apply({"params": p}, *inputs, deterministic=True))(params)

  num_labels = params[head]["kernel"].shape[-1]
  hf_config = hf.bertjax_config_to_hf(config)
  hf_config.num_labels = num_labels
  hf_model = getattr(transformers, hf_class)(hf_config, _do_init=False)
  ids, mask, segments = inputs
  # A tuple (return_dict=False): transformers' output classes check their
  # fields' types, which imports TensorFlow when the fields are tracers.
  out = cheap_compiles.jit(lambda p: hf_model(
      ids, attention_mask=mask, token_type_ids=segments, params=p, return_dict=False))(
          _hf_params(params, config, head, pooler))
  if case == "question_answering":  # (start_logits, end_logits, ...)
    np.testing.assert_allclose(ours[0], out[0], atol=ATOL)
    np.testing.assert_allclose(ours[1], out[1], atol=ATOL)
    assert ours[0].shape == shape
  else:  # (logits, ...)
    np.testing.assert_allclose(ours, out[0], atol=ATOL)
    assert ours.shape == out[0].shape


def test_param_names_and_shapes():
  config = _config(True)
  d = config.hidden_size
  expected = {
      "sequence_classification": ("classifier", (d, 3)),
      "token_classification": ("classifier", (d, 9)),
      "multiple_choice": ("classifier", (d, 1)),
      "question_answering": ("qa_outputs", (d, 2)),
  }
  for case, (head, kernel_shape) in expected.items():
    make, _, _, _, shape = CASES[case]
    model = make(config)
    tree = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), *_inputs(shape)))
                    ["params"])
    assert set(tree) == {"bert", head}, case
    assert tree[head]["kernel"].shape == kernel_shape
    assert tree[head]["bias"].shape == kernel_shape[1:]
    assert set(tree["bert"]) == {"embeddings", "encoder", "pooler"}


@pytest.mark.slow
def test_dropout_changes_training_outputs_only():
  config = _config(True)
  model = heads.BertForSequenceClassification(config, num_labels=2)
  inputs = _inputs((BATCH, LENGTH))
  params = _random_params(model, inputs)
  evaluate = cheap_compiles.jit(
      lambda p: model.apply({"params": p}, *inputs, deterministic=True))
  eval_a, eval_b = evaluate(params), evaluate(params)
  train = cheap_compiles.jit(lambda p: model.apply(
      {"params": p}, *inputs, deterministic=False, rngs={"dropout": jax.random.key(3)}))(params)
  np.testing.assert_array_equal(eval_a, eval_b)
  assert not np.allclose(eval_a, train)


@pytest.mark.slow
def test_head_projection_is_fp32_in_a_bf16_model():
  config = _config(True).replace(dtype="bfloat16")
  model = heads.BertForSequenceClassification(config, num_labels=1)
  inputs = _inputs((64, LENGTH), seed=5)
  params = _random_params(model, inputs)
  scores = np.asarray(cheap_compiles.jit(lambda p: model.apply({"params": p}, *inputs))(params))
  assert scores.dtype == np.float32 and scores.shape == (64, 1)
  assert len(np.unique(scores)) == 64  # bf16 logits would collide.
  # The same projection in fp32 on the model's own (bf16) pooled features.
  _, pooled = cheap_compiles.jit(lambda p: heads.BertModel(config).apply(
      {"params": p}, *inputs, True,
      output_positions=heads.pooled_only_positions(config, 64)))(params["bert"])
  kernel, bias = params["classifier"]["kernel"], params["classifier"]["bias"]
  expected = np.asarray(pooled, np.float32) @ np.asarray(kernel, np.float32) + bias
  np.testing.assert_allclose(scores, expected, rtol=1e-6, atol=1e-6)
  assert params["classifier"]["kernel"].dtype == np.float32


@pytest.mark.parametrize("causal", [False, True])
def test_pooled_heads_run_the_last_layer_at_cls_only(causal):
  """Classification reads only the pooled output, so the last layer computes one
  position of each row (fewer FLOPs than the whole model's sequence output);
  a causal model, whose pooler reads the last real token, runs it everywhere."""
  from bertjax.train import profiling  # pylint: disable=g-import-not-at-top
  config = _config(False).replace(causal=causal)
  model = heads.BertForSequenceClassification(config, num_labels=2)
  inputs = _inputs((BATCH, LENGTH))
  params = _random_params(model, inputs)
  # Code generation's options leave XLA's FLOP count as the default compile has it.
  flops = lambda f: profiling.compiled_flops(
      cheap_compiles.jit(f, which=cheap_compiles.CODEGEN).lower().compile())
  head = flops(lambda: model.apply({"params": params}, *inputs))
  full = flops(lambda: heads.BertModel(config).apply({"params": params["bert"]}, *inputs))
  if causal:
    assert head > 0.95 * full, (head, full)
  else:
    assert head < 0.8 * full, (head, full)
    encode = cheap_compiles.jit(lambda p, positions: heads.BertModel(config).apply(
        {"params": p}, *inputs, output_positions=positions))
    _, pooled = encode(params["bert"], None)
    _, at_cls = encode(params["bert"], heads.pooled_only_positions(config, BATCH))
    np.testing.assert_allclose(at_cls, pooled, rtol=1e-5, atol=1e-6)
