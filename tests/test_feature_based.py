"""The feature-based CoNLL-2003 task (frozen BERT, BiLSTM tagger): BERT's
parameters never change, gradients reach only the tagger, and it learns."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.convert import hf
from bertjax.convert import hf_files
from bertjax.convert import pretrained_model
from bertjax.convert import weights
from bertjax.model.config import BertConfig
from bertjax.tasks import loop
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.train import optimizer as opt_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "configs", "finetune"))
import cheap_compiles  # pylint: disable=g-import-not-at-top,wrong-import-position
import conll_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import ner_features  # pylint: disable=g-import-not-at-top,wrong-import-position
import test_hf_parity as parity  # pylint: disable=g-import-not-at-top,wrong-import-position

TINY = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
            max_position_embeddings=32)


def tiny_config(tmp_path):
  config = ner_features.get_config()
  config.data_dir = conll_data.write(tmp_path / "data")
  config.vocab_file = finetune_data.write_vocab(str(tmp_path / "vocab.txt"))
  config.model.update(dtype="float32", **TINY)
  config.max_seq_length = 32
  config.feature_based.lstm_units = 16
  config.feature_based.layers = (-1, -2)
  config.global_batch_size = 16
  config.eval_batch_size = 32
  config.logging.every_steps = 20
  config.checkpoint.async_save = False
  return config


@pytest.mark.slow
def test_gradients_reach_only_the_tagger_and_the_optimizer_leaves_bert_alone():
  task = registry.get_task("conll2003_features")
  bert_config = BertConfig(vocab_size=60, **TINY)
  config = ner_features.get_config()
  config.feature_based.lstm_units = 8
  config.feature_based.layers = (-1, -2)
  model = registry.model_for(task, bert_config, config)
  params = cheap_compiles.jit(lambda r: jax.tree.map(
      lambda x: x.unbox() if hasattr(x, "unbox") else x, registry.init_fn(task, 12)(model, r),
      is_leaf=lambda x: hasattr(x, "unbox")))(jax.random.key(0))
  assert set(params) == {"bert", "lstm_0", "lstm_1", "tagger"}
  assert set(params["bert"]) == {"embeddings", "encoder", "pooler"}
  rng = np.random.default_rng(0)
  batch = {"input_ids": rng.integers(5, 60, (4, 12)).astype(np.int32),
           "input_mask": (np.arange(12) < np.array([[12], [7], [3], [9]])).astype(np.int32),
           "segment_ids": np.zeros((4, 12), np.int32),
           "labels": rng.integers(0, 9, (4, 12)).astype(np.int32),
           "label_weights": np.ones((4, 12), np.float32), "weights": np.ones(4, np.float32)}

  def loss(p):
    outputs = step_lib.forward(p, model.apply, batch, jax.random.key(1), deterministic=False)
    return step_lib.loss_and_hits("token", outputs, batch)[0]
  grads = cheap_compiles.jit(jax.grad(loss))(params)
  assert all(not np.asarray(g).any() for g in jax.tree.leaves(grads["bert"]))
  for name in ("lstm_0", "lstm_1", "tagger"):
    assert all(np.asarray(g).any() for g in jax.tree.leaves(grads[name])), name
  # With weight decay and gradients given for every parameter, BERT's updates are zero.
  tx = opt_lib.make_optimizer(config.optimizer, optax.constant_schedule(1e-2),
                              frozen=task.frozen)
  state = cheap_compiles.jit(tx.init)(params)
  some_grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = cheap_compiles.jit(tx.update)(some_grads, state, params)
  assert all(not np.asarray(u).any() for u in jax.tree.leaves(updates["bert"]))
  assert all(np.asarray(u).any() for u in jax.tree.leaves(updates["tagger"]))
  # Adam's two moments for the tagger only (and a few counters): none for BERT.
  size = lambda tree: sum(np.size(x) for x in jax.tree.leaves(tree))
  trained = size({k: v for k, v in params.items() if k != "bert"})
  assert 2 * trained <= size(state) <= 2 * trained + 8


@pytest.mark.slow
def test_bert_stays_bitwise_equal_and_the_tagger_learns(tmp_path, tmp_path_factory):
  config = tiny_config(tmp_path)
  # A random encoder saved as a Hugging Face directory is the starting point.
  hf_config = parity.hf_bert_config(
      vocab_size=len(open(config.vocab_file).read().split()), hidden_size=32,
      num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=32)
  hf_params = parity.random_hf_params(hf_config, seed=5)
  bert_config = hf.hf_config_to_bertjax(hf_config)
  start = hf.hf_to_bertjax(hf_params, bert_config)
  config.init_from = str(tmp_path / "encoder")
  hf_files.save_hf_checkpoint(start, bert_config, config.init_from, format="safetensors",
                              encoder_only=True)
  config.num_epochs = 20.0
  config.optimizer.learning_rate = 2e-2
  config.feature_based.dropout_rate = 0.0
  with cheap_compiles.in_process(cheap_compiles.cache_dir(tmp_path_factory)):
    results = loop.finetune_and_evaluate(config, str(tmp_path / "run"),
                                         weights_loader=weights.load_weights)
  dev = results["dev"]["dev"]
  assert dev["f1"] >= 0.9, results
  trained = weights.read_checkpoint_params(str(tmp_path / "run" / "checkpoints"))
  assert set(trained) == {"bert", "lstm_0", "lstm_1", "tagger"}
  flat_start = hf.flatten(start["params"]["bert"])
  flat_trained = hf.flatten(jax.tree.map(np.asarray, trained["bert"]))
  assert set(flat_start) == set(flat_trained)
  for path, x in flat_start.items():
    # The word table has zero rows past the vocab (model.vocab_multiple).
    np.testing.assert_array_equal(flat_trained[path][:len(x)], x, err_msg="/".join(path))
    assert not flat_trained[path][len(x):].any()
  # The run's checkpoint serves feature extraction: its encoder, vocab and casing.
  params, loaded_config, tokenizer = pretrained_model.load_encoder(
      str(tmp_path / "run" / "checkpoints"))
  assert loaded_config.num_layers == 2 and not tokenizer.do_lower_case
  assert tokenizer.path == config.vocab_file
  flat_loaded = hf.flatten(jax.tree.map(np.asarray, params))
  for path, x in flat_trained.items():
    np.testing.assert_array_equal(flat_loaded[path], x, err_msg="/".join(path))


def test_a_config_without_the_feature_group_is_refused(tmp_path):
  import ner  # pylint: disable=g-import-not-at-top
  config = ner.get_config()
  config.task = "conll2003_features"
  with pytest.raises(ValueError, match="no feature_based.layers.*ner_features.py"):
    registry.get_task(config.task).configure(config)
  config = ner_features.get_config()
  config.feature_based.layers = (-1, 12)
  with pytest.raises(ValueError, match="feature_based.layers: 12 is not a layer of a "
                     "2-layer model"):
    registry.model_for(registry.get_task("conll2003_features"),
                       BertConfig(vocab_size=60, **TINY), config)
