"""Splash and flash attention lower and compile for a TPU slice (ahead of
time, on this CPU host).

Needs libtpu (`pip install "jax[tpu]"`); skipped where it is not installed.
A child process with JAX_PLATFORMS=cpu compiles a small model's whole train
step for a v5e 2x2 slice on a data x tensor mesh (heads split over the
tensor axis through shard_map) and reports whether the compiled program
holds the Pallas kernels; also for packed rows, whose packed-example ids are
the kernels' segment ids. With attention dropout (the paper's 0.1) flash's
Mosaic kernels draw the dropout mask themselves.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import jax_child

pytestmark = pytest.mark.tpu

TOPOLOGY = "v5e:2x2"


def _kernel_child(devices) -> dict:
  """flash_tpu's gradient alone, keys in two blocks (dq in a pass of its own)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from bertjax.model import flash_tpu  # pylint: disable=g-import-not-at-top
  b, n, h, length = 2, 2, 64, 256
  blocks = flash_tpu.BlockSizes(block_q=256, block_k=128, block_q_dkv=128, block_k_dkv=128,
                                block_q_dq=128, block_k_dq=128)

  def grads(q, k, v, ids, rows, cols):
    loss = lambda q, k, v: jnp.sum(flash_tpu.flash_attention(
        q, k, v, ids, ids, rows, cols, dropout_rate=0.1, causal=True, sm_scale=0.125,
        block_sizes=blocks).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  on = jax.sharding.SingleDeviceSharding(devices[0])
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=on)
  qkv = spec((b, n, h, length), jnp.bfloat16)
  text = jax.jit(grads).lower(qkv, qkv, qkv, spec((b, length), jnp.int32),
                              spec((b, length), jnp.int32),
                              spec((b, n, length), jnp.int32)).compile().as_text()
  return {"device_kind": devices[0].device_kind, "pallas_calls": text.count("tpu_custom_call")}


def _counts_child(length: int) -> dict:
  from bertjax.fit import mosaic_cost  # pylint: disable=g-import-not-at-top
  return {f"{rate}": {name: [c.valu, c.vector_loads] for name, c in
                      mosaic_cost.flash_counts(length, rate).items()} for rate in (0.0, 0.1)}


def _child(payload) -> dict:
  if "counts" in payload:
    return _counts_child(payload["counts"])
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  from bertjax.input import packing  # pylint: disable=g-import-not-at-top
  from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
  from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  from bertjax.records import schema  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
  import base  # pylint: disable=g-import-not-at-top

  devices = topologies.get_topology_desc(platform="tpu", topology_name=TOPOLOGY).devices
  if payload.get("kernel"):
    return _kernel_child(devices)
  mesh = jax.sharding.Mesh(np.asarray(devices).reshape(2, 1, 2), sharding_lib.MESH_AXES)
  rules = sharding_lib.rules(base.get_config().mesh)
  config = BertConfig(vocab_size=256, hidden_size=256, num_layers=2, num_heads=4,
                      intermediate_size=512, max_position_embeddings=payload["length"],
                      attention_dropout_rate=payload.get("dropout", 0.0), dtype="bfloat16",
                      attention_impl=payload["impl"])
  model = BertForPreTraining(config)
  with sharding_lib.mesh_context(mesh, rules):
    state, shardings = state_lib.abstract_train_state(model, optax.adamw(1e-4), mesh, rules)
    batch_s = sharding_lib.batch_sharding(mesh)
    shapes = (packing.packed_batch_shapes(packing.Packing(
        max_seq_length=payload["length"], max_predictions_per_seq=4, rows=8,
        max_examples_per_row=3, max_predictions_per_row=12)) if payload.get("packed")
              else schema.batch_shapes(8, payload["length"], 4))
    batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_s)
             for k, (shape, dtype) in shapes.items()}
    rng = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                               sharding=sharding_lib.replicated(mesh))
    lowered = step_lib.jit_train_step(shardings, mesh).lower(state, batch, rng)
    compiled = lowered.compile()
  text = compiled.as_text()
  lowered_text = lowered.as_text()
  return {"device_kind": devices[0].device_kind,
          "pallas_calls": text.count("tpu_custom_call"),
          "splash": "splash" in lowered_text, "flash": "flash_dropout" in lowered_text}


def _libtpu_path():
  spec = importlib.util.find_spec("libtpu")
  return None if spec is None else os.path.dirname(os.path.dirname(spec.origin))


def _run_child(payload) -> dict:
  libtpu = _libtpu_path()
  if libtpu is None:
    pytest.skip("libtpu is not installed (pip install 'jax[tpu]')")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([jax_child.REPO, os.path.dirname(__file__), libtpu]),
             # Compiles only: pytest's workers may run two of these at once,
             # and libtpu otherwise lets one process on the machine load it.
             ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  done = subprocess.run([sys.executable, __file__, json.dumps(payload)], env=env,
                        capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-6000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_flash_kernels_compile_with_dq_in_a_pass_of_its_own():
  """Keys in two blocks, causal, dropout 0.1: the forward, dk/dv and dq
  kernels lower through Mosaic for a v5e chip."""
  result = _run_child({"kernel": True})
  assert result["device_kind"].startswith("TPU v5")
  assert result["pallas_calls"] == 3, result


@pytest.mark.parametrize("length", [128, 512])
def test_flash_dropout_costs_at_most_half_again_the_kernels_vector_work(length):
  """Mosaic's final program for a v5e chip: a grid step's vector ALU
  operations with attention dropout 0.1 are at most 1.5x those without it,
  in the forward kernel and in the backward (dq, dk and dv in one pass); the
  words add a few vector loads."""
  counts = _run_child({"counts": length})
  without, with_dropout = counts["0.0"], counts["0.1"]
  assert set(without) == {"flash_dropout_forward", "flash_dropout_dkv"}, counts
  for name, (valu, loads) in with_dropout.items():
    assert valu <= 1.5 * without[name][0], (name, counts)
    assert loads <= without[name][1] + 64, (name, counts)


@pytest.mark.parametrize("impl,length,packed,dropout", [
    ("splash", 128, False, 0.0), ("splash", 512, False, 0.0), ("xla", 128, False, 0.0),
    ("splash", 128, True, 0.0), ("flash", 128, False, 0.1), ("flash", 512, True, 0.1),
    ("flash", 128, False, 0.0)])
def test_train_step_compiles_for_a_tpu_slice(impl, length, packed, dropout):
  result = _run_child({"impl": impl, "length": length, "packed": packed, "dropout": dropout})
  assert result["device_kind"].startswith("TPU v5")
  if impl == "xla":
    assert result["pallas_calls"] == 0 and not result["splash"], result
  elif impl == "flash":
    # Flash's forward and its dk/dv pass (with dq, the keys being one block)
    # in the scanned layer body.
    assert result["pallas_calls"] >= 2 and result["flash"] and not result["splash"], result
  else:
    # Forward, dq and dkv kernels in each scanned layer body.
    assert result["pallas_calls"] >= 3 and result["splash"] and not result["flash"], result


if __name__ == "__main__":
  print(json.dumps(_child(json.loads(sys.argv[1]))))
