"""Padded vocab rows (model.padded_vocab_size): exports carry exactly
model.vocab_size rows; imports pad with zeros to the target's row count.

The padded trees are built here by appending rows to word_embeddings and the
MLM output_bias, as a model whose vocab is padded to a multiple of 128 holds
them.
"""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.convert import export
from bertjax.convert import hf
from bertjax.convert import tf1
from bertjax.convert import weights
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train.state import TrainState

VOCAB_ROWS = (("bert", "embeddings", "word_embeddings", "embedding"), ("mlm", "output_bias"))


def pad_rows(params, rows: int, fill: float):
  flat = hf.flatten(params)
  for path in VOCAB_ROWS:
    x = np.asarray(flat[path])
    flat[path] = np.concatenate([x, np.full((rows - x.shape[0],) + x.shape[1:], fill,
                                            x.dtype)])
  return hf.unflatten(flat)


def abstract_of(params):
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), params)


def rows_of(params):
  flat = hf.flatten(jax.device_get(params))
  return {p: np.asarray(flat[p]) for p in VOCAB_ROWS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The unpadded run of test_export_hf.make_run, and the same weights padded to
  256 rows (the padding rows hold 7.0, so that an export that kept them, or an
  import that read them, is seen) in a workdir with the same run record."""
  from test_export_hf import make_run  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("padded")
  run = make_run(root, True)
  padded = pad_rows(run["params"], 256, 7.0)
  workdir = root / "padded_run"
  workdir.mkdir()
  shutil.copy(os.path.join(os.path.dirname(run["checkpoints"]), "config.json"), workdir)
  ckpt = ckpt_lib.Checkpointer(str(workdir / "checkpoints"), keep=1, async_save=False)
  ckpt.save(TrainState(step=jnp.array(4), params=padded, opt_state={"count": jnp.zeros(())},
                       apply_fn=None, tx=None), {"model": dataclasses.asdict(run["config"])})
  ckpt.close()
  return run, str(workdir / "checkpoints"), padded


@pytest.mark.slow
def test_exports_carry_exactly_vocab_size_rows(runs, tmp_path):
  run, padded_checkpoints, _ = runs
  vocab_size = run["config"].vocab_size
  want = rows_of(run["params"])
  export.export(padded_checkpoints, str(tmp_path / "hf"), "flax")
  loaded, config = weights_from_hf(str(tmp_path / "hf"))
  assert config.vocab_size == vocab_size
  for path, value in rows_of(loaded).items():
    np.testing.assert_array_equal(value, want[path], err_msg=str(path))
  with open(tmp_path / "hf" / "config.json") as f:
    assert json.load(f)["vocab_size"] == vocab_size

  export.export(padded_checkpoints, str(tmp_path / "tf1"), "tf1")
  variables = tf1.read_checkpoint(str(tmp_path / "tf1" / "bert_model.ckpt"))
  assert variables["bert/embeddings/word_embeddings"].shape[0] == vocab_size
  assert variables["cls/predictions/output_bias"].shape == (vocab_size,)
  loaded, _ = tf1.load_tf1_checkpoint(str(tmp_path / "tf1"))
  assert not [p for p, x in hf.flatten(loaded).items()
              if not np.array_equal(x, hf.flatten(run["params"])[p[1:]])]


def weights_from_hf(directory):
  from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
  params, config = hf_files.load_hf_checkpoint(directory)
  return params["params"], config


def test_imports_pad_with_zeros_to_the_targets_rows(runs, tmp_path):
  run, padded_checkpoints, padded = runs
  config = run["config"]
  vocab_size = config.vocab_size
  export.export(run["checkpoints"], str(tmp_path / "hf"))
  export.export(run["checkpoints"], str(tmp_path / "tf1"), "tf1")
  target = abstract_of(pad_rows(run["params"], 256, 0.0))
  want = rows_of(run["params"])
  sources = {"bertjax": run["checkpoints"], "hugging_face": str(tmp_path / "hf"),
             "tf1": str(tmp_path / "tf1")}
  for name, source in sources.items():
    loaded = weights.load_weights(source, target, config)
    for path, value in rows_of(loaded).items():
      assert value.shape[0] == 256, (name, path)
      np.testing.assert_array_equal(value[:vocab_size], want[path], err_msg=f"{name} {path}")
      assert not value[vocab_size:].any(), (name, path)
    others = {p: x for p, x in hf.flatten(jax.device_get(loaded)).items()
              if p not in VOCAB_ROWS}
    assert not [p for p, x in others.items()
                if not np.array_equal(x, hf.flatten(run["params"])[p])], name

  # A padded checkpoint into a padded target reads as saved; into an unpadded
  # one, its padding rows go.
  same = weights.load_weights(padded_checkpoints, abstract_of(padded), config)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(jax.device_get(same)),
                                                   jax.tree.leaves(padded)))
  unpadded = weights.load_weights(padded_checkpoints, abstract_of(run["params"]), config)
  assert all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(jax.device_get(unpadded)), jax.tree.leaves(run["params"])))


def test_an_import_never_drops_real_rows(runs):
  run, _, _ = runs
  smaller = abstract_of(jax.tree.map(
      lambda x: x[:-1] if x.shape and x.shape[0] == run["config"].vocab_size else x,
      run["params"]))
  config = run["config"].replace(vocab_size=run["config"].vocab_size - 1)
  with pytest.raises(ValueError, match=r"init_from: .* has vocab_size=\d+ but "
                                       r"--config\.model\.vocab_size is"):
    weights.load_weights(run["checkpoints"], smaller, config)


def test_fine_tuning_starts_its_encoder_from_any_source(runs, tmp_path):
  """A BertModel target (the encoder a task model fine-tunes): the heads go."""
  run, padded_checkpoints, _ = runs
  export.export(run["checkpoints"], str(tmp_path / "tf1"), "tf1")
  export.export(run["checkpoints"], str(tmp_path / "hf"))
  target = abstract_of(run["params"]["bert"])
  for source in (run["checkpoints"], padded_checkpoints, str(tmp_path / "tf1"),
                 str(tmp_path / "hf")):
    loaded = jax.device_get(weights.load_weights(source, target, run["config"]))
    assert jax.tree.structure(loaded) == jax.tree.structure(run["params"]["bert"]), source
    assert all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(loaded), jax.tree.leaves(run["params"]["bert"]))), source
