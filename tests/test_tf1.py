"""TF1 checkpoints in the original release's layout: export, import, and the
original code and Hugging Face's converter reading them.

The oracle is the release itself (PyPI's bert-tensorflow): a child process
builds its graph with tf.compat.v1 (modeling.BertModel plus
run_pretraining's get_masked_lm_output / get_next_sentence_output, or
run_classifier's / run_squad's create_model). The release needs TF1's
tf.contrib.layers.layer_norm and tf.layers.dense, which TF2 lacks; the child
provides stand-ins that create the same variables (scope/LayerNorm/beta and
gamma; name/kernel and bias, kernels [in, out]) and compute the same thing.
For the numerical comparisons the child also swaps the release's tanh GELU
for the exact one bertjax computes, so that outputs agree to float32
rounding; the variable names and shapes are the release's own.
"""

import ast
import json
import logging
import os
import sys
import types

import jax
import numpy as np
import pytest

import jax_child

pytestmark = pytest.mark.slow

B, L, P = 2, 12, 3


def _stand_in_tensorflow():
  """tensorflow.contrib.layers.layer_norm and tf.compat.v1.layers.dense for the release."""
  import tensorflow as real_tf  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as v1  # pylint: disable=g-import-not-at-top  # The release's `tf`.

  def layer_norm(inputs, begin_norm_axis=-1, begin_params_axis=-1, scope=None):
    assert begin_norm_axis == -1 and begin_params_axis == -1
    with v1.variable_scope(scope, default_name="LayerNorm"):
      depth = inputs.shape.as_list()[-1]
      beta = v1.get_variable("beta", [depth], initializer=v1.zeros_initializer())
      gamma = v1.get_variable("gamma", [depth], initializer=v1.ones_initializer())
      mean, variance = v1.nn.moments(inputs, [-1], keep_dims=True)
      return (inputs - mean) * v1.rsqrt(variance + 1e-12) * gamma + beta

  def dense(inputs, units, activation=None, name=None, kernel_initializer=None):
    with v1.variable_scope(name, default_name="dense"):
      kernel = v1.get_variable("kernel", [inputs.shape.as_list()[-1], units],
                               initializer=kernel_initializer)
      bias = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
      y = v1.nn.bias_add(v1.matmul(inputs, kernel), bias)
      return activation(y) if activation is not None else y

  v1.disable_v2_tensorshape()  # TF1's shapes of Dimensions (run_classifier reads .value).
  contrib = types.ModuleType("tensorflow.contrib")
  contrib.layers = types.SimpleNamespace(layer_norm=layer_norm)
  sys.modules["tensorflow.contrib"] = contrib
  v1.layers = types.SimpleNamespace(dense=dense)
  return real_tf, v1


def _original_graph(payload):
  """Builds the release's graph; reports its variables and, if asked, its outputs."""
  real_tf, v1 = _stand_in_tensorflow()
  from bert import modeling  # pylint: disable=g-import-not-at-top
  kind = payload["kind"]
  if payload.get("exact_gelu"):
    modeling.gelu = lambda x: 0.5 * x * (1.0 + v1.math.erf(x / np.sqrt(2.0)))
  config = modeling.BertConfig(**payload["config"])
  feed_arrays = {k: np.asarray(v, np.int32) for k, v in payload.get("inputs", {}).items()}
  with real_tf.Graph().as_default():
    ids, mask, segments = (v1.placeholder(v1.int32, [B, L]) for _ in range(3))
    outputs = {}
    if kind == "pretraining":
      from bert import run_pretraining  # pylint: disable=g-import-not-at-top
      positions = v1.placeholder(v1.int32, [B, P])
      model = modeling.BertModel(config, False, ids, mask, segments,
                                 use_one_hot_embeddings=False)
      _, _, mlm = run_pretraining.get_masked_lm_output(
          config, model.get_sequence_output(), model.get_embedding_table(), positions,
          v1.zeros([B, P], v1.int32), v1.ones([B, P]))
      _, _, nsp = run_pretraining.get_next_sentence_output(
          config, model.get_pooled_output(), v1.zeros([B], v1.int32))
      outputs = dict(sequence_output=model.get_sequence_output(),
                     pooled_output=model.get_pooled_output(),
                     mlm_log_probs=v1.reshape(mlm, [B, P, -1]), nsp_log_probs=nsp)
    elif kind == "classifier":
      from bert import run_classifier  # pylint: disable=g-import-not-at-top
      _, _, logits, _ = run_classifier.create_model(
          config, False, ids, mask, segments, v1.zeros([B], v1.int32),
          payload["num_labels"], False)
      outputs = dict(logits=logits)
    else:
      from bert import run_squad  # pylint: disable=g-import-not-at-top
      start, end = run_squad.create_model(config, False, ids, mask, segments, False)
      outputs = dict(start_logits=start, end_logits=end)
    variables = {v.op.name: v.shape.as_list() for v in v1.global_variables()}
    if payload.get("init_checkpoint"):
      # What run_classifier.py / run_squad.py do with --init_checkpoint.
      assignment, _ = modeling.get_assignment_map_from_checkpoint(
          v1.trainable_variables(), payload["init_checkpoint"])
      v1.train.init_from_checkpoint(payload["init_checkpoint"], assignment)
      variables_loaded = sorted(assignment)
    else:
      variables_loaded = []
    result = {"variables": variables, "loaded": variables_loaded}
    with v1.Session() as sess:
      sess.run(v1.global_variables_initializer())
      if payload.get("save_to"):  # A checkpoint as the release's own code saves them.
        v1.train.Saver().save(sess, payload["save_to"])
      if feed_arrays:
        feed = {ids: feed_arrays["input_ids"], mask: feed_arrays["input_mask"],
                segments: feed_arrays["segment_ids"]}
        if kind == "pretraining":
          feed[positions] = feed_arrays["masked_lm_positions"]
        result["outputs"] = {k: v.tolist() for k, v in sess.run(outputs, feed).items()}
  return result


def original(tmp_path_factory, **payload):
  result, _ = jax_child.run(__file__, payload, cache=jax_child.cache_dir(tmp_path_factory))
  return result


def release_config(config):
  from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
  return tf1.config_dict(config)


def inputs(vocab_size, seed=0):
  rng = np.random.default_rng(seed)
  mask = np.ones((B, L), np.int32)
  mask[1, 8:] = 0
  return dict(input_ids=(rng.integers(5, vocab_size, (B, L)) * mask).astype(np.int32),
              input_mask=mask, segment_ids=(np.arange(L)[None] >= 5).astype(np.int32) * mask,
              masked_lm_positions=np.array([[1, 4, 9], [0, 2, 7]], np.int32))


def bertjax_outputs(params, config, x):
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  with jax.default_matmul_precision("highest"):
    out = BertForPreTraining(config).apply(
        {"params": params}, x["input_ids"], x["input_mask"], x["segment_ids"],
        x["masked_lm_positions"], deterministic=True)
  return dict(sequence_output=out["sequence_output"], pooled_output=out["pooled_output"],
              mlm_log_probs=jax.nn.log_softmax(out["mlm_logits"]),
              nsp_log_probs=jax.nn.log_softmax(out["nsp_logits"]))


def flat_equal(a, b) -> list[str]:
  from bertjax.convert import hf  # pylint: disable=g-import-not-at-top
  fa, fb = hf.flatten(hf.unwrap(a)), hf.flatten(hf.unwrap(b))
  return sorted("/".join(k) for k in set(fa) | set(fb)
                if k not in fa or k not in fb or not np.array_equal(fa[k], fb[k]))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  from bertjax.convert import export  # pylint: disable=g-import-not-at-top
  from test_export_hf import make_run  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("tf1_export")
  run = make_run(root, True)
  out = str(root / "tf1")
  export.export(run["checkpoints"], out, "tf1")
  return run, out


def test_export_writes_the_release_layout_and_round_trips_exactly(exported):
  from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
  run, out = exported
  assert sorted(os.listdir(out)) == ["bert_config.json", "bert_model.ckpt.data-00000-of-00001",
                                     "bert_model.ckpt.index", "vocab.txt"]
  with open(os.path.join(out, "vocab.txt")) as f, open(run["vocab"]) as g:
    assert f.read() == g.read()
  params, config = tf1.load_tf1_checkpoint(out)
  assert config == run["config"]
  assert flat_equal(params, run["params"]) == []


def test_names_and_shapes_are_the_releases_and_its_code_loads_them(exported, tmp_path_factory):
  from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
  run, out = exported
  config = run["config"]
  x = inputs(config.vocab_size)
  prefix = os.path.join(out, "bert_model.ckpt")
  result = original(tmp_path_factory, kind="pretraining", config=release_config(config),
                    init_checkpoint=prefix, exact_gelu=True,
                    inputs={k: v.tolist() for k, v in x.items()})
  ours = {k: list(v.shape) for k, v in tf1.read_checkpoint(prefix).items()}
  assert ours == result["variables"]
  assert result["loaded"] == sorted(ours)  # init_from_checkpoint assigns every variable.
  ref = bertjax_outputs(run["params"], config, x)
  for name, value in result["outputs"].items():
    np.testing.assert_allclose(np.asarray(value), ref[name], atol=2e-5, err_msg=name)


def test_init_from_a_checkpoint_the_release_wrote(tmp_path_factory):
  """The format Google's published checkpoints come in: written by the release's
  own graph and Saver from its random initialisation, with bert_config.json."""
  from bertjax.convert import weights  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  directory = tmp_path_factory.mktemp("google_format")
  config = BertConfig(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=48, max_position_embeddings=40, type_vocab_size=3)
  (directory / "bert_config.json").write_text(json.dumps(release_config(config)))
  x = inputs(config.vocab_size, seed=1)
  result = original(tmp_path_factory, kind="pretraining", config=release_config(config),
                    save_to=str(directory / "bert_model.ckpt"), exact_gelu=True,
                    inputs={k: v.tolist() for k, v in x.items()})
  assert os.path.exists(directory / "bert_model.ckpt.meta")  # Saver's own layout.
  for scan in (True, False):
    target = config.replace(scan_layers=scan)
    abstract = jax.eval_shape(lambda t=target: state_lib.init_params(
        BertForPreTraining(t), jax.random.key(0)))
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.value.shape if hasattr(a, "value") else a.shape,
                                       np.float32, sharding=jax.sharding.SingleDeviceSharding(
                                           jax.devices()[0])),
        abstract, is_leaf=lambda a: hasattr(a, "value"))
    params = weights.load_weights(str(directory), abstract, target)
    ref = bertjax_outputs(params, target, x)
    for name, value in result["outputs"].items():
      np.testing.assert_allclose(np.asarray(value), ref[name], atol=2e-5, err_msg=(scan, name))


def _hf_converter():
  """transformers' load_tf_weights_in_bert, run without PyTorch.

  Its module imports torch, which the test environment lacks, so the
  function's own source is taken from the installed file and given a torch
  whose from_numpy returns the array: the name mapping, the transposes and the
  shape checks are transformers' own.
  """
  import transformers  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(transformers.__file__), "models", "bert",
                      "modeling_bert.py")
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
            and n.name == "load_tf_weights_in_bert")
  namespace = {"os": os, "logger": logging.getLogger("hf"),
               "torch": types.SimpleNamespace(from_numpy=lambda a: a)}
  exec(compile(ast.Module([fn], []), path, "exec"), namespace)  # pylint: disable=exec-used
  return namespace["load_tf_weights_in_bert"]


class _Weight:
  def __init__(self, shape):
    self.shape, self.data = tuple(shape), None


class _Module(dict):
  """A stand-in PyTorch module: attributes are children, integer keys index lists."""

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError:
      raise AttributeError(name) from None

  def __getitem__(self, key):
    return dict.__getitem__(self, str(key))


def _torch_model(state_shapes):
  root = _Module()
  for name, shape in state_shapes.items():
    node = root
    *parents, leaf = name.split(".")
    for p in parents:
      node = dict.setdefault(node, p, _Module())
    dict.__setitem__(node, leaf, _Weight(shape))
  return root


def test_hugging_faces_tf_converter_maps_every_weight(exported):
  """load_tf_weights_in_bert (what transformers' TF-checkpoint conversion calls)."""
  from bertjax.convert import hf  # pylint: disable=g-import-not-at-top
  from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
  run, out = exported
  expected = hf_files.hf_flat_to_torch(hf.bertjax_to_hf(run["params"], run["config"]))
  model = _torch_model({k: v.shape for k, v in expected.items()})
  _hf_converter()(model, None, os.path.join(out, "bert_model.ckpt"))
  flat = {}

  def collect(node, prefix):
    for k, v in dict.items(node):
      if isinstance(v, _Weight):
        flat[prefix + k] = v.data
      else:
        collect(v, prefix + k + ".")
  collect(model, "")
  assert sorted(k for k, v in flat.items() if v is None) == []
  for name, value in expected.items():
    np.testing.assert_array_equal(flat[name], value, err_msg=name)


if __name__ == "__main__":
  print(json.dumps(_original_graph(json.loads(sys.argv[1]))))
