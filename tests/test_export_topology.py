"""A checkpoint saved on one mesh exports and starts runs on any other.

A child process with 8 fake CPU devices saves a training state laid out on
an fsdp=2 x tensor=4 mesh; other children read it on 1 device and on a
data=2 x fsdp=4 mesh (through the export's reader and through init_from's
loader, into scanned and unrolled targets): every parameter must equal the
saved one exactly. A whole training state (parameters and Adam's moments)
saved on two slices (the 8 devices split in two, data parallel across them,
FSDP inside) resumes exactly on four slices and on one device.
"""

import json
import os
import sys

import numpy as np
import pytest

import jax_child

pytestmark = pytest.mark.slow

MODEL = dict(vocab_size=120, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
             max_position_embeddings=32, dtype="float32")


def _mesh_config(data, fsdp, tensor, **dcn):
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
  import base  # pylint: disable=g-import-not-at-top
  mesh = base.get_config().mesh
  mesh.update(data=data, fsdp=fsdp, tensor=tensor, **dcn)
  return mesh


def _sliced_state(slices: int):
  """(model, optimizer, mesh, rules) with LARGE's layout on `slices` slices of the devices."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  mesh_config = _mesh_config(1, -1, 1)  # FSDP inside a slice, dcn_data -1: across slices.
  mesh = sharding_lib.make_mesh(mesh_config, num_slices=slices) if jax.device_count() > 1 \
      else sharding_lib.make_mesh(mesh_config)
  return (BertForPreTraining(BertConfig(**MODEL)), optax.adam(1e-3), mesh,
          sharding_lib.rules(mesh_config))


def _state_leaves(state) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in
          jax.tree_util.tree_leaves_with_path(jax.device_get(state))}


def _save_sliced(payload):
  """Trains a random state one Adam step on two slices, saves it; writes its leaves to an npz."""
  import jax  # pylint: disable=g-import-not-at-top
  from bertjax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  model, tx, mesh, rules = _sliced_state(2)
  state, _ = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(3))
  grads = jax.tree.map(lambda p: 0.1 * p + 0.01, state.params)  # Moments that are not zero.
  updates, opt_state = jax.jit(tx.update)(grads, state.opt_state, state.params)
  state = state.replace(step=state.step + 7, opt_state=opt_state,
                        params=jax.jit(lambda p, u: jax.tree.map(lambda a, b: a + b, p, u))(
                            state.params, updates))
  ckpt = ckpt_lib.Checkpointer(payload["dir"], keep=2, async_save=False)
  ckpt.save(state, {"phase": "seq128", "data_step": 7})
  ckpt.close()
  np.savez(payload["npz"], **_state_leaves(state))
  return {"mesh": dict(mesh.shape),
          "slice_rows": [sorted(int(d.id) // 4 for d in row.ravel()) for row in mesh.devices]}


def _restore_sliced(payload):
  """Restores the two-slice checkpoint on `slices` slices; names the leaves that differ."""
  import jax  # pylint: disable=g-import-not-at-top
  from bertjax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  model, tx, mesh, rules = _sliced_state(payload["slices"])
  abstract, shardings = state_lib.abstract_train_state(model, tx, mesh, rules)
  ckpt = ckpt_lib.Checkpointer(payload["dir"], keep=2, async_save=False)
  state, meta = ckpt.restore(abstract, shardings)
  ckpt.close()
  saved, got = dict(np.load(payload["npz"])), _state_leaves(state)
  placed = all(x.sharding.is_equivalent_to(s, x.ndim) for x, s in
               zip(jax.tree.leaves(state), jax.tree.leaves(shardings)))
  return {"mesh": dict(mesh.shape), "step": int(state.step), "meta_step": meta["step"],
          "placed": placed, "leaves": len(saved),
          "differ": sorted(k for k in saved if not np.array_equal(saved[k], got.get(k)))}


def _flat(params) -> dict:
  from bertjax.convert import hf  # pylint: disable=g-import-not-at-top
  return {"/".join(p): np.asarray(x) for p, x in hf.flatten(params).items()}


def _save(payload):
  """Saves a random state sharded fsdp x tensor; writes its params to an npz."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  from bertjax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top
  config = BertConfig(**MODEL)
  mesh_config = _mesh_config(1, 2, 4)
  mesh = sharding_lib.make_mesh(mesh_config)
  rules = sharding_lib.rules(mesh_config)
  state, _ = state_lib.create_train_state(BertForPreTraining(config), optax.adam(1e-3), mesh,
                                          rules, jax.random.key(7))
  specs = {k: str(x.sharding.spec) for k, x in _flat_arrays(state.params).items()}
  ckpt = ckpt_lib.Checkpointer(payload["dir"], keep=2, async_save=False)
  ckpt.save(state.replace(step=state.step + 5), {"model": dataclasses.asdict(config)})
  ckpt.close()
  np.savez(payload["npz"], **_flat(jax.device_get(state.params)))
  return {"specs": specs}


def _flat_arrays(params):
  from bertjax.convert import hf  # pylint: disable=g-import-not-at-top
  return {"/".join(p): x for p, x in hf.flatten(params).items()}


def _read(payload):
  """Reads the checkpoint with the export's reader and with init_from's loader."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from bertjax.convert import export  # pylint: disable=g-import-not-at-top
  from bertjax.convert import weights  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  saved = dict(np.load(payload["npz"]))
  mesh_config = _mesh_config(*payload["mesh"])
  mesh = sharding_lib.make_mesh(mesh_config)
  rules = sharding_lib.rules(mesh_config)
  out = {"devices": jax.device_count()}

  def same(got: dict, name: str):
    out[name] = sorted(k for k in saved if k not in got or not np.array_equal(got[k], saved[k]))
    out[name] += sorted(set(got) - set(saved))

  sharding = None if payload["mesh"] == [1, 1, 1] else NamedSharding(mesh, PartitionSpec())
  params, config, meta = export.read_checkpoint(payload["dir"], sharding)
  same(_flat(params), "export")
  out["step"], out["config_equal"] = meta["step"], config == BertConfig(**MODEL)

  for scan in (True, False):
    target = BertConfig(**MODEL, scan_layers=scan)
    abstract, _ = state_lib.abstract_train_state(BertForPreTraining(target), optax.adam(1e-3),
                                                 mesh, rules)
    loaded = weights.load_weights(payload["dir"], abstract.params, target)
    shardings_ok = all(
        x.sharding == a.sharding for x, a in zip(jax.tree.leaves(loaded),
                                                 jax.tree.leaves(abstract.params)))
    out[f"shardings_ok_scan_{scan}"] = shardings_ok
    flat = _flat(jax.device_get(loaded))
    if not scan:  # Compare layer by layer with the scanned (saved) layout.
      from bertjax.convert import hf  # pylint: disable=g-import-not-at-top
      flat = _flat(hf.hf_to_bertjax(hf.bertjax_to_hf(jax.device_get(loaded), target),
                                    BertConfig(**MODEL))["params"])
    same(flat, f"init_from_scan_{scan}")
  return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  base = tmp_path_factory.mktemp("topology")
  payload = {"dir": str(base / "checkpoints"), "npz": str(base / "params.npz")}
  result, _ = jax_child.run(__file__, dict(payload, command="save"),
                            cache=jax_child.cache_dir(tmp_path_factory), devices=8)
  # The saved arrays really were split over both mesh axes.
  assert result["specs"]["bert/encoder/layers/attention/query/kernel"] == (
      "P(None, 'fsdp', 'tensor', None)")
  return payload


@pytest.mark.parametrize("devices,mesh", [(1, [1, 1, 1]), (8, [2, 4, 1])],
                         ids=["one_device", "data2_fsdp4"])
def test_checkpoint_from_an_8_device_mesh_reads_exactly_elsewhere(
    saved, tmp_path_factory, devices, mesh):
  result, _ = jax_child.run(__file__, dict(saved, command="read", mesh=mesh),
                            cache=jax_child.cache_dir(tmp_path_factory), devices=devices)
  assert result["devices"] == devices
  assert result["step"] == 5 and result["config_equal"]
  for name in ("export", "init_from_scan_True", "init_from_scan_False"):
    assert result[name] == [], (name, result[name])
  assert result["shardings_ok_scan_True"] and result["shardings_ok_scan_False"]


def test_a_state_saved_on_two_slices_resumes_exactly_on_four_and_on_one_device(
    tmp_path, tmp_path_factory):
  payload = {"dir": str(tmp_path / "checkpoints"), "npz": str(tmp_path / "state.npz")}
  cache = jax_child.cache_dir(tmp_path_factory)
  saved, _ = jax_child.run(__file__, dict(payload, command="save_sliced"), cache=cache,
                           devices=8)
  assert saved["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
  assert saved["slice_rows"] == [[0, 0, 0, 0], [1, 1, 1, 1]]  # One slice per data row.
  for devices, slices, mesh in ((8, 4, {"data": 4, "fsdp": 2, "tensor": 1}),
                                (1, 1, {"data": 1, "fsdp": 1, "tensor": 1})):
    got, _ = jax_child.run(__file__, dict(payload, command="restore_sliced", slices=slices),
                           cache=cache, devices=devices)
    assert got["mesh"] == mesh
    assert got["step"] == got["meta_step"] == 7 and got["placed"]
    assert got["leaves"] > 20 and got["differ"] == [], got


if __name__ == "__main__":
  _payload = json.loads(sys.argv[1])
  print(json.dumps({"save": _save, "read": _read, "save_sliced": _save_sliced,
                    "restore_sliced": _restore_sliced}[_payload["command"]](_payload)))
