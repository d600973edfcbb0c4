"""The mesh and the rules table on 8 CPU devices: placement and one-device equality.

XLA fixes the number of CPU devices when JAX starts, so the meshes are built
in a child process with 8 fake CPU devices (this file, run as a script; see
jax_child.py). For each mesh the child builds the sharded train state, reads
where named parameters live, and trains a few steps; it also trains on one
device, and the test compares.
"""

import json
import os
import sys

import numpy as np
import pytest

import jax_child

NUM_DEVICES = 8
STEPS = 3
VOCAB, HIDDEN, HEADS, MLP, LAYERS = 128, 32, 4, 64, 2
BATCH, LENGTH, PREDICTIONS = 16, 16, 3

WORD = "bert/embeddings/word_embeddings/embedding"  # [vocab, embed]
QUERY = "bert/encoder/layers/attention/query/kernel"  # [layers, embed, heads, kv]
MLP_IN = "bert/encoder/layers/mlp/intermediate/kernel"  # [layers, embed, mlp]
NAMED = (WORD, QUERY, MLP_IN)

# The rules table puts heads and mlp on `tensor` and embed on `fsdp`, the
# word table's vocab on both (its embed axis on none), whatever the mesh;
# the per-device shard shapes follow from the axis sizes.
SPECS = {WORD: [["tensor", "fsdp"], None], QUERY: [None, "fsdp", "tensor", None],
         MLP_IN: [None, "fsdp", "tensor"]}
MESHES = {
    "data": dict(
        mesh=(8, 1, 1),
        shards={WORD: [128, 32], QUERY: [2, 32, 4, 8], MLP_IN: [2, 32, 64]}),
    "fsdp": dict(
        mesh=(1, 8, 1),
        shards={WORD: [16, 32], QUERY: [2, 4, 4, 8], MLP_IN: [2, 4, 64]}),
    "data_fsdp_tensor": dict(
        mesh=(2, 2, 2),
        shards={WORD: [32, 32], QUERY: [2, 16, 2, 8], MLP_IN: [2, 16, 32]}),
}


def _child(mesh_names: list[str]) -> dict:
  """Runs in the 8-device child process; returns what the test checks."""
  import jax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top

  from bertjax.input.synthetic import SyntheticSource  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  from bertjax.train import loop  # pylint: disable=g-import-not-at-top,unused-import
  from bertjax.train import optimizer as opt_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
  import base  # pylint: disable=g-import-not-at-top

  config = base.get_config()
  config.optimizer.update(learning_rate=1e-3, warmup_steps=0)
  model = BertForPreTraining(BertConfig(
      vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS,
      intermediate_size=MLP, max_position_embeddings=32))
  tx = opt_lib.make_optimizer(
      config.optimizer, opt_lib.learning_rate_schedule(config.optimizer, 100, [0, 100], [0]))
  source = SyntheticSource(BATCH, max_seq_length=LENGTH, max_predictions_per_seq=PREDICTIONS,
                           vocab_size=VOCAB, seed=1)
  rules = sharding_lib.rules(config.mesh)
  dropout_rng = jax.random.key(7)
  by_name = lambda tree: {"/".join(k.key for k in path): x
                          for path, x in jax.tree_util.tree_leaves_with_path(tree)}

  def train(sizes, devices):
    mesh_config = ml_collections.ConfigDict(
        dict(config.mesh, **dict(zip(("data", "fsdp", "tensor"), sizes))))
    mesh = sharding_lib.make_mesh(mesh_config, devices)
    state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
    params = by_name(state.params)
    mu = by_name(next(s for s in state.opt_state if hasattr(s, "mu")).mu)
    placement = {}
    for name in NAMED:
      x = params[name]
      placement[name] = dict(
          spec=list(x.sharding.spec) + [None] * (x.ndim - len(x.sharding.spec)),
          shards=sorted({tuple(s.data.shape) for s in x.addressable_shards}),
          mu_same=bool(mu[name].sharding.is_equivalent_to(x.sharding, x.ndim)))
    p_train = step_lib.jit_train_step(shardings, mesh)
    losses = []
    with sharding_lib.mesh_context(mesh, rules):
      for i in range(STEPS):
        batch = {k: jax.make_array_from_process_local_data(
            sharding_lib.batch_sharding(mesh), v) for k, v in source.batch(i).items()}
        state, metrics = p_train(state, batch, dropout_rng)
        losses.append(float(metrics["loss"]))
    batch_shards = sorted({tuple(s.data.shape) for s in batch["input_ids"].addressable_shards})
    return dict(losses=losses, placement=placement, batch_shards=batch_shards,
                params=jax.device_get(state.params))

  reference = train((1, 1, 1), jax.devices()[:1])
  results = {}
  for name in mesh_names:
    got = train(MESHES[name]["mesh"], jax.devices())
    params = got.pop("params")
    got["max_param_diff"] = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference["params"])))
    results[name] = got
  return dict(devices=jax.device_count(), reference_losses=reference["losses"],
              meshes=results, tensorflow_imported="tensorflow" in sys.modules)


@pytest.mark.slow
def test_meshes_place_params_by_rules_and_match_one_device(tmp_path_factory):
  # One child for all meshes, so the one-device reference is computed once.
  result, _ = jax_child.run(os.path.abspath(__file__), sorted(MESHES), devices=NUM_DEVICES,
                            cache=jax_child.cache_dir(tmp_path_factory))
  assert result["devices"] == NUM_DEVICES
  # The train step imports no TensorFlow.
  assert not result["tensorflow_imported"]
  reference = result["reference_losses"]
  assert reference[-1] < reference[0]
  for mesh_name, expected in MESHES.items():
    got = result["meshes"][mesh_name]
    for name in NAMED:
      placed = got["placement"][name]
      assert placed["spec"] == SPECS[name], (mesh_name, name)
      # Every device holds a shard of the same shape, the one the mesh implies.
      assert placed["shards"] == [expected["shards"][name]], (mesh_name, name)
      assert placed["mu_same"], f"{mesh_name}: Adam's moment of {name} is placed elsewhere"
    data, fsdp, _ = expected["mesh"]
    assert got["batch_shards"] == [[BATCH // (data * fsdp), LENGTH]], mesh_name
    # Dropout is on: its random bits do not depend on how arrays are split.
    np.testing.assert_allclose(got["losses"], reference, rtol=1e-5, err_msg=mesh_name)
    assert got["max_param_diff"] < 1e-5, mesh_name


def test_mesh_shape_fills_the_one_minus_one():
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  mesh = lambda **kw: ml_collections.ConfigDict(dict(dict(data=-1, fsdp=1, tensor=1), **kw))
  assert sharding_lib.mesh_shape(mesh(), 8) == (8, 1, 1)
  assert sharding_lib.mesh_shape(mesh(data=2, fsdp=-1, tensor=2), 8) == (2, 2, 2)
  assert sharding_lib.mesh_shape(mesh(data=1, fsdp=-1), 16) == (1, 16, 1)
  with pytest.raises(ValueError, match="at most one"):
    sharding_lib.mesh_shape(mesh(fsdp=-1), 8)
  with pytest.raises(ValueError, match="do not divide"):
    sharding_lib.mesh_shape(mesh(tensor=3), 8)
  with pytest.raises(ValueError, match="needs 4 devices"):
    sharding_lib.mesh_shape(mesh(data=2, tensor=2), 8)



def test_make_mesh_warns_when_it_falls_back_to_the_listed_device_order(monkeypatch, caplog):
  import logging  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top

  def no_layout(shape, devices, **kwargs):
    raise NotImplementedError(f"no physical layout for {shape}")
  monkeypatch.setattr(sharding_lib, "mesh_utils",
                      types.SimpleNamespace(create_device_mesh=no_layout))
  caplog.set_level(logging.WARNING)
  devices = jax.devices()
  mesh = sharding_lib.make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1)),
                                devices)
  assert list(mesh.devices.ravel()) == devices
  n, kind = len(devices), devices[0].device_kind
  assert (f"could not lay out the mesh {{'data': {n}, 'fsdp': 1, 'tensor': 1}} over {n} "
          f"{kind} devices (NotImplementedError: no physical layout for ({n}, 1, 1)); using "
          "the devices in their listed order instead") in caplog.text


def _mesh_config(**sizes):
  import ml_collections  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
  import base  # pylint: disable=g-import-not-at-top
  mesh = ml_collections.ConfigDict(base.get_config().mesh)
  mesh.update(**sizes)
  return mesh


def test_slices_multiply_the_mesh_axes_they_split():
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  base = _mesh_config()  # data -1 inside a slice, dcn_data -1: data parallel across slices.
  large = _mesh_config(data=1, fsdp=-1)  # FSDP inside a slice, data parallel across slices.
  assert sharding_lib.hybrid_mesh_shape(base, 512, 2) == ((256, 1, 1), (2, 1, 1))
  assert sharding_lib.mesh_shape(base, 512, 2) == (512, 1, 1)
  assert sharding_lib.hybrid_mesh_shape(large, 512, 2) == ((1, 256, 1), (2, 1, 1))
  assert sharding_lib.mesh_shape(large, 512, 2) == (2, 256, 1)
  # One slice is the mesh of before; a config without DCN fields reads as one.
  assert sharding_lib.hybrid_mesh_shape(large, 16) == ((1, 16, 1), (1, 1, 1))
  import ml_collections  # pylint: disable=g-import-not-at-top
  old = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=2))
  assert sharding_lib.hybrid_mesh_shape(old, 16, 2) == ((1, 4, 2), (2, 1, 1))
  assert sharding_lib.hybrid_mesh_shape(
      _mesh_config(data=1, fsdp=-1, dcn_data=2, dcn_fsdp=-1), 64, 8) == ((1, 8, 1), (2, 4, 1))
  with pytest.raises(ValueError, match="at most one of .*dcn_data.* may be -1"):
    sharding_lib.hybrid_mesh_shape(_mesh_config(dcn_fsdp=-1), 16, 2)
  with pytest.raises(ValueError, match=r"\{'dcn_data': 3, 'dcn_fsdp': 1, 'dcn_tensor': 1\} "
                     "needs 3 slices, but 2 are available"):
    sharding_lib.hybrid_mesh_shape(_mesh_config(dcn_data=3), 16, 2)
  with pytest.raises(ValueError, match="needs 16 devices of a slice, but 8 are available"):
    sharding_lib.hybrid_mesh_shape(_mesh_config(data=16), 16, 2)
  with pytest.raises(ValueError, match="config.mesh.dcn_tensor: must be a positive size"):
    sharding_lib.hybrid_mesh_shape(_mesh_config(dcn_tensor=0), 16, 2)


def test_devices_are_grouped_into_slices_by_slice_process_or_listed_order():
  import types  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  tpu = [types.SimpleNamespace(id=i, slice_index=1 - i // 4) for i in range(8)]
  slices, how = sharding_lib.device_slices(tpu)
  assert how == "slice_index" and [[d.id for d in s] for s in slices] == [[4, 5, 6, 7],
                                                                          [0, 1, 2, 3]]
  # CPU devices of a multi-process run name slice 0.
  cpu = [types.SimpleNamespace(id=i, process_index=i // 2, slice_index=0) for i in range(8)]
  # Devices that name no slice are one slice, unless the config fixes DCN
  # sizes (then each process is one) or num_slices splits them.
  assert sharding_lib.device_slices(cpu, _mesh_config())[1] == "one slice"
  slices, how = sharding_lib.device_slices(cpu, _mesh_config(dcn_data=4))
  assert how == "process_index" and [[d.id for d in s] for s in slices] == [
      [0, 1], [2, 3], [4, 5], [6, 7]]
  slices, how = sharding_lib.device_slices(cpu, _mesh_config(), num_slices=2)
  assert how == "listed" and [[d.id for d in s] for s in slices] == [[0, 1, 2, 3],
                                                                     [4, 5, 6, 7]]
  with pytest.raises(ValueError, match="num_slices=4, but the devices are in 2 slices"):
    sharding_lib.device_slices(tpu, num_slices=4)


def test_each_slice_is_one_block_of_the_mesh_with_the_dcn_part_outermost():
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  slices = [list(range(s * 4, s * 4 + 4)) for s in range(4)]
  # Data parallel across 4 slices, fsdp 2 x tensor 2 inside each.
  grid = sharding_lib.listed_device_array(slices, (1, 2, 2), (4, 1, 1))
  assert grid.shape == (4, 2, 2)
  assert [sorted(grid[i].ravel().tolist()) for i in range(4)] == slices
  # 2 x 2 slices over data and fsdp: each slice is one 2 x 2 block of the
  # data x fsdp plane, at its place in the DCN grid.
  grid = sharding_lib.listed_device_array(slices, (2, 2, 1), (2, 2, 1))
  assert grid.shape == (4, 4, 1)
  for s, (i, j) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
    assert sorted(grid[2 * i:2 * i + 2, 2 * j:2 * j + 2].ravel().tolist()) == slices[s]


if __name__ == "__main__":
  print(json.dumps(_child(json.loads(sys.argv[1]))))


def test_a_vocab_the_mesh_does_not_divide_is_refused_naming_vocab_multiple():
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
  import base  # pylint: disable=g-import-not-at-top
  mesh_config = ml_collections.ConfigDict(base.get_config().mesh)
  rules = sharding_lib.rules(mesh_config)
  mesh = jax.sharding.AbstractMesh((1, 4, 2), sharding_lib.MESH_AXES)
  config = BertConfig(vocab_size=97, hidden_size=HIDDEN, num_layers=1, num_heads=HEADS,
                      intermediate_size=MLP, max_position_embeddings=32)
  with pytest.raises(ValueError, match=r"word_embeddings.*'vocab'.*8 shards.*vocab_multiple"):
    state_lib.abstract_train_state(BertForPreTraining(config), optax.sgd(0.1), mesh, rules)
  padded = config.replace(vocab_multiple=8)
  abstract, _ = state_lib.abstract_train_state(BertForPreTraining(padded), optax.sgd(0.1), mesh,
                                               rules)
  assert abstract.params["bert"]["embeddings"]["word_embeddings"]["embedding"].shape[0] == 104
