"""Segment B's token-type row when fine-tuning starts from a checkpoint pretrained on
one segment (objective mlm or ltr: FULL-SENTENCES rows, every segment id 0), whose
row B pretraining never trained; a checkpoint pretrained on pairs is left as it is."""

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax import downstream
from bertjax.convert import hf
from bertjax.convert import weights
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import state as state_lib
from bertjax.train.state import TrainState

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "configs", "finetune"))
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import glue as glue_config  # pylint: disable=g-import-not-at-top,wrong-import-position

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
             max_position_embeddings=64, dtype="float32")
ROW_A, ROW_B = 1.0, 7.0  # The saved token-type rows, told apart by their values.
TABLE = ("embeddings", "token_type_embeddings", "embedding")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("data")
  return {"mrpc": finetune_data.write_mrpc(str(d / "mrpc"), num_train=16, num_dev=8),
          "vocab": finetune_data.write_vocab(str(d / "vocab.txt"))}


def _model_config(data, objective):
  with open(data["vocab"], encoding="utf-8") as f:
    vocab_size = len(f.read().split())
  return BertConfig(vocab_size=vocab_size, next_sentence_head=objective == "mlm+nsp",
                    causal=objective == "ltr", **SMALL)


def _params(config):
  """BertForPreTraining's parameters (with the NSP head) whose token-type rows hold
  ROW_A and ROW_B."""
  boxed = state_lib.init_params(BertForPreTraining(config), jax.random.key(3))
  flat = {p: np.asarray(x) for p, x in hf.flatten(boxed).items()}
  table = flat[("bert",) + TABLE]
  flat[("bert",) + TABLE] = np.stack([np.full_like(table[0], ROW_A),
                                      np.full_like(table[1], ROW_B)])
  return hf.unflatten(flat)


def _pretraining_run(workdir, params, config, objective, init_from=""):
  """A pretraining workdir as bertjax.main leaves it: checkpoints/ and the run record
  naming the objective (an objective without NSP saves no NSP head)."""
  config = config.replace(next_sentence_head=objective == "mlm+nsp",
                          causal=objective == "ltr")
  if not config.next_sentence_head:
    params = {k: v for k, v in params.items() if k != "nsp"}
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps({"objective": objective,
                                                   "init_from": init_from}))
  ckpt = ckpt_lib.Checkpointer(str(workdir / "checkpoints"), keep=1, async_save=False)
  ckpt.save(TrainState(step=jnp.array(10), params=params, opt_state={"count": jnp.zeros(())},
                       apply_fn=None, tx=None), {"model": dataclasses.asdict(config)})
  ckpt.close()
  return str(workdir / "checkpoints")


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
  root = tmp_path_factory.mktemp("pretraining")
  config = _model_config(data, "mlm+nsp")
  params = _params(config)
  runs = {o: _pretraining_run(root / o.replace("+", "_"), params, config, o)
          for o in ("mlm", "ltr", "mlm+nsp")}
  # Pretraining on one segment that started from a pair checkpoint: row B was trained.
  runs["mlm from mlm+nsp"] = _pretraining_run(root / "continued", params, config, "mlm",
                                              init_from=runs["mlm+nsp"])
  return runs


def _loaded_rows(path, config, segment_b_init):
  """Token-type rows of the encoder that fine-tuning's loader reads from `path`."""
  saved = weights.read_checkpoint_params(path)["bert"]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          saved)
  loader = weights.finetuning_loader(segment_b_init)
  return np.asarray(hf.flatten(loader(path, abstract, config))[TABLE])


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_one_segment_checkpoints_get_the_chosen_segment_b_row(data, runs, objective):
  config = _model_config(data, objective)
  path = runs[objective]
  assert weights.one_segment_objective(path) == objective
  copied = _loaded_rows(path, config, "copy_a")
  np.testing.assert_array_equal(copied, np.full_like(copied, ROW_A))
  zeros = _loaded_rows(path, config, "zeros")
  np.testing.assert_array_equal(zeros[0], np.full_like(zeros[0], ROW_A))
  np.testing.assert_array_equal(zeros[1], np.zeros_like(zeros[1]))
  kept = _loaded_rows(path, config, "keep")
  np.testing.assert_array_equal(kept[1], np.full_like(kept[1], ROW_B))


def test_checkpoints_whose_segment_b_row_was_trained_are_left_as_they_are(data, runs):
  for name in ("mlm+nsp", "mlm from mlm+nsp"):
    assert weights.one_segment_objective(runs[name]) is None, name
    config = _model_config(data, "mlm+nsp" if name == "mlm+nsp" else "mlm")
    rows = _loaded_rows(runs[name], config, "copy_a")
    np.testing.assert_array_equal(rows[1], np.full_like(rows[1], ROW_B), err_msg=name)
  with pytest.raises(ValueError, match=r"--config.segment_b_init='ones': must be one of"):
    weights.finetuning_loader("ones")


def _fine_tuned_rows(workdir):
  checkpoints = os.path.join(workdir, "checkpoints")
  step = max(int(s) for s in os.listdir(checkpoints) if s.isdigit())
  with ocp.StandardCheckpointer() as ckptr:
    params = ckptr.restore(os.path.join(checkpoints, str(step), "params"))
  return np.asarray(params["bert"]["embeddings"]["token_type_embeddings"]["embedding"])


def test_a_pair_task_fine_tuned_from_an_mlm_checkpoint_starts_from_the_default(
    data, runs, tmp_path):
  """Through bertjax.finetune's path with the config's default (copy_a); learning
  rate 0 keeps the starting weights, so the run's checkpoint holds them."""
  config = glue_config.get_config()
  assert config.segment_b_init == "copy_a"
  config.update(task="mrpc", data_dir=data["mrpc"], vocab_file=data["vocab"],
                init_from=runs["mlm"], max_seq_length=32, global_batch_size=8,
                eval_batch_size=8, num_epochs=1.0)
  config.optimizer.learning_rate = 0.0
  config.checkpoint.async_save = False
  config.model.dtype = "float32"
  downstream.finetune(config, str(tmp_path / "run"))
  rows = _fine_tuned_rows(str(tmp_path / "run"))
  np.testing.assert_array_equal(rows, np.full_like(rows, ROW_A))
