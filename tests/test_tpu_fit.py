"""The fit check of ahead-of-time TPU compiles: available HBM and one device per chip.

The parsing and the decision run everywhere, with fakes for libtpu; the last
test compiles for real TPU topologies in a child process with JAX_PLATFORMS=cpu
and is skipped where libtpu is not installed (`pip install "jax[tpu]"`).
"""

import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest

import jax_child
from bertjax.benchmarks import aot
from bertjax.benchmarks import tpu_topology

GIB = 2**30


@pytest.mark.parametrize("message,expected", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
     "temporaries (15.84G) exceeds available HBM (15.75G).", 15.75 * GIB),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
     "space hbm. Used 31.90G of 30.75G hbm. Exceeded hbm capacity by 1.15G.", 30.75 * GIB),
    ("... exceeds available HBM (512.00M).", 512 * 2**20),
    ("Used 1.00T of 95.74G hbm.", int(95.74 * GIB)),
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17.2G.", None),
    ("INTERNAL: something else", None),
])
def test_available_hbm_is_read_from_libtpus_out_of_memory_message(message, expected):
  assert tpu_topology.parse_available_hbm(message) == (None if expected is None else int(expected))


class _FakeCompile:
  """Stands for jax.jit(...): lower().compile() raises `error` (or returns)."""

  def __init__(self, error):
    self.error = error

  def __call__(self, fn, **kwargs):
    return self

  def lower(self):
    return self

  def compile(self):
    if self.error:
      raise self.error


def test_available_hbm_comes_from_an_oversized_compile(monkeypatch):
  monkeypatch.setattr(tpu_topology, "topology_devices", lambda topology: jax.devices("cpu"))
  monkeypatch.setattr(tpu_topology.jax, "jit", _FakeCompile(jax.errors.JaxRuntimeError(
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
      "temporaries (1.00T) exceeds available HBM (15.75G).")))
  assert tpu_topology.available_hbm_bytes.__wrapped__("v5e:2x4") == int(15.75 * GIB)
  # A compiler that does not stop the program names no figure.
  monkeypatch.setattr(tpu_topology.jax, "jit", _FakeCompile(None))
  assert tpu_topology.available_hbm_bytes.__wrapped__("v5e:2x4") is None
  # Any other failure is a bug to see, not an unknown figure.
  monkeypatch.setattr(tpu_topology.jax, "jit", _FakeCompile(
      jax.errors.JaxRuntimeError("INTERNAL: broken")))
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    tpu_topology.available_hbm_bytes.__wrapped__("v5e:2x4")


def test_fits_means_within_the_available_hbm_not_the_nominal():
  r = aot.AotResult(
      topology="v5e:2x4", devices=8, chips=8, device_kind="TPU v5 lite", mesh={"data": 8},
      phase="seq128", global_batch_size=256, seq_len=128, attention="splash",
      compile_seconds=1.0, argument_bytes=10 * GIB, temp_bytes=int(5.9 * GIB),
      unaliased_output_bytes=0, compiled_flops=None, analytic_flops=1.0, xla_view_flops=1.0,
      hbm_bytes=int(15.75 * GIB))
  assert r.nominal_hbm_bytes == 16 * GIB  # Within the nominal 16 GiB ...
  assert r.fits is False  # ... but not within the 15.75 the compiler allows.
  r.temp_bytes = int(5.7 * GIB)
  assert r.fits is True
  # Unknown available HBM: no answer, whatever the nominal figure says.
  assert aot.AotResult(**{**r.__dict__, "hbm_bytes": None}).fits is None


def test_v4_topologies_are_asked_for_one_megacore_device_per_chip(monkeypatch):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  asked = []

  def fake_desc(**kwargs):
    asked.append(kwargs)
    return topologies.TopologyDescription([])

  monkeypatch.setattr(topologies, "get_topology_desc", fake_desc)
  tpu_topology.topology_devices("v4:2x2x1")
  tpu_topology.topology_devices("v5e:2x4")
  assert asked == [dict(platform="tpu", topology_name="v4:2x2x1", chip_config_name="megacore"),
                   dict(platform="tpu", topology_name="v5e:2x4")]


# The shape of libtpu's multi-slice program text (abridged): cross-slice
# all-reduces lowered to megascale sends, one in the entry computation and
# one in a loop body that runs 11 times.
_MEGASCALE_HLO = """HloModule jit_train_step

%body.1 (p: (s32[], bf16[4,8,128])) -> (s32[], bf16[4,8,128]) {
  %after-all.2 = token[] after-all()
  %send.2 = (bf16[4,8,128]{2,1,0:T(8,128)(2,1)}, u32[], token[]) send(%x, %after-all.2), channel_id=5, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_transfer_type="ALL_REDUCE"}
  %recv.2 = (bf16[4,8,128]{2,1,0}, u32[], token[]) recv(%after-all.2), channel_id=6, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_transfer_type="ALL_REDUCE"}
}

%cond.1 (p: (s32[], bf16[4,8,128])) -> pred[] {
  %constant.9 = s32[]{:T(128)} constant(11)
  %gte.1 = s32[]{:T(128)} get-tuple-element(%p), index=0
  ROOT %lt.1 = pred[]{:T(512)} compare(%gte.1, %constant.9), direction=LT
}

ENTRY %main.1 (a: f32[1024]) -> f32[1024] {
  %after-all.1 = token[] after-all()
  %send.1 = (f32[2,8,128]{2,1,0:T(8,128)}, u32[], token[]) send(%a, %after-all.1), channel_id=3, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_megascale_transfer_type="ALL_REDUCE"}
  %all-reduce.1 = f32[1024]{0} all-reduce(%a), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %while.1 = (s32[], bf16[4,8,128]) while(%t), condition=%cond.1, body=%body.1
  %send.9 = (f32[64]{0}, u32[], token[]) send(%a, %after-all.1), channel_id=9, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="other"}
}
"""


def test_dcn_bytes_are_the_megascale_sends_times_their_loop_trips():
  from bertjax.benchmarks import dcn_traffic  # pylint: disable=g-import-not-at-top
  traffic = dcn_traffic.dcn_traffic(_MEGASCALE_HLO)
  # f32[2,8,128] once, bf16[4,8,128] in a body that runs 11 times; the
  # all-reduce inside the slice and the other handler's send are not DCN.
  once, looped = 4 * 2 * 8 * 128, 2 * 4 * 8 * 128
  assert traffic.sends == 2 and traffic.uncounted_loops == 0
  assert traffic.bytes_per_step == once + 11 * looped
  assert traffic.by_type == {"ALL_REDUCE": once + 11 * looped}
  unknown = _MEGASCALE_HLO.replace("direction=LT", "direction=NE")
  assert dcn_traffic.dcn_traffic(unknown).uncounted_loops == 1
  assert dcn_traffic.dcn_traffic(unknown).bytes_per_step == once + looped
  assert dcn_traffic.gradient_allreduce_bytes(110_000_000, 256) == 110_000_000 * 4 // 256


def _child(payload):
  """Topology devices and available HBM as libtpu gives them, (with "finetune") the
  memory of a small SQuAD fine-tuning step at each grad_accum_steps, or a two-slice
  compile."""
  if "finetune" in payload:
    return _finetune_child(payload["finetune"])
  if "two_slices" in payload:
    return _two_slice_compile()
  if "packed" in payload:
    return _packed_compile()
  return {name: {"devices": len(tpu_topology.topology_devices(name)),
                 "chips": aot._count_chips(tpu_topology.topology_devices(name)),  # pylint: disable=protected-access
                 "available_gib": tpu_topology.available_hbm_bytes(name) / GIB}
          for name in payload["topologies"]}


def _libtpu_child(payload, timeout=600):
  """_child(payload)'s result from this file run with libtpu on JAX_PLATFORMS=cpu;
  skips where libtpu is not installed (`pip install "jax[tpu]"`)."""
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not installed (pip install 'jax[tpu]')")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([jax_child.REPO, os.path.dirname(__file__)]),
             # Compiles only: leave libtpu's one-process lock to tests that
             # may run beside this one.
             ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  done = subprocess.run([sys.executable, __file__, json.dumps(payload)], env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)
  assert done.returncode == 0, done.stderr[-6000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.tpu
def test_libtpu_reports_available_hbm_per_chip():
  result = _libtpu_child({"topologies": ["v4:2x2x1", "v5e:2x4"]}, timeout=300)
  v4, v5e = result["v4:2x2x1"], result["v5e:2x4"]
  assert v4["devices"] == v4["chips"] == 4, v4  # One megacore device per v4 chip.
  # A v4 device has (most of) the chip's 32 GiB, not half of it.
  assert 16 < v4["available_gib"] <= 32, v4
  assert v5e["devices"] == v5e["chips"] == 8, v5e
  assert 15 < v5e["available_gib"] < 16, v5e  # Less than the nominal 16 GiB.


def _finetune_child(accums):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bertjax.benchmarks import finetune_fit  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs", "finetune"))
  import squad  # pylint: disable=g-import-not-at-top
  out = {}
  for accum in accums:
    config = ml_collections.ConfigDict(squad.get_config().to_dict())
    config.version = "2.0"  # The paper's batch of 48.
    # Length 384 and a small vocab: activations outweigh the weight-sized buffers
    # (parameters, Adam moments, the summed gradient), as in BERT-LARGE.
    config.model.update(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256)
    r = finetune_fit.compile_step(config, "v5e:1x1", accum, vocab_size=1024)
    out[accum] = {"batch": r.global_batch_size, "temp": r.temp_bytes, "fits": r.fits,
                  "arguments": r.argument_bytes}
  return out


@pytest.mark.tpu
def test_accumulation_shrinks_a_fine_tuning_steps_temporaries_on_one_v5e_chip():
  """The check behind docs/finetuning-runs.md's BERT-LARGE SQuAD v2.0 figures, on a
  small model: the same step at 1 and 4 micro-batches."""
  result = _libtpu_child({"finetune": [1, 4]})
  one, four = result["1"], result["4"]
  assert one["batch"] == four["batch"] == 48
  assert one["fits"] and four["fits"]
  assert one["arguments"] == four["arguments"]  # The same state and batch...
  assert four["temp"] < 0.5 * one["temp"], result  # ...a quarter of the activations.


def _two_slice_compile():
  """A small BERT's train step compiled for two v5e:2x2 slices, BASE's and LARGE's meshes."""
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
  import base  # pylint: disable=g-import-not-at-top
  import large  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  out = {}
  for name, module in (("base", base), ("large", large)):
    config = module.get_config()
    config.model.update(vocab_size=512, hidden_size=64, num_layers=3, num_heads=4,
                        intermediate_size=128, attention_dropout_rate=0.0)
    for phase in config.phases.values():
      phase.global_batch_size = 32
    devices = tpu_topology.topology_devices("v5e:2x2", 2)
    mesh = sharding_lib.make_mesh(config.mesh, devices)
    two = aot.aot_compile(config, "v5e:2x2", "seq128", num_slices=2)
    out[name] = dict(
        mesh=two.mesh, chips=two.chips, devices=two.devices, fits=two.fits,
        dcn=two.dcn.bytes_per_step, sends=two.dcn.sends, uncounted=two.dcn.uncounted_loops,
        analytic=two.gradient_allreduce_bytes,
        # The slice of the devices in each row of make_mesh's data axis.
        data_rows=[sorted({d.slice_index for d in row.ravel()}) for row in mesh.devices])
  return out


@pytest.mark.tpu
def test_a_two_slice_topology_compiles_with_data_parallelism_across_slices():
  result = _libtpu_child({"two_slices": True})
  base, large = result["base"], result["large"]
  assert base["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
  assert large["mesh"] == {"data": 2, "fsdp": 4, "tensor": 1}
  for r in (base, large):
    assert r["chips"] == r["devices"] == 8 and r["fits"]
    # Gradients cross the DCN: the program's sends are of the order of the
    # hierarchical all-reduce of the fp32 gradients (some go as bf16, some
    # are padded to tiles).
    assert r["sends"] > 0 and r["uncounted"] == 0
    assert 0.3 * r["analytic"] < r["dcn"] < 3 * r["analytic"], r
  # LARGE: each data row (a replica of FSDP shards) lies in one slice.
  assert large["data_rows"] == [[0], [1]]
  assert base["data_rows"] == [[0]] * 4 + [[1]] * 4


def _packed_compile():
  """A small BERT's train step compiled for v5e:2x2 at length 128, unpacked and packed."""
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
  import base  # pylint: disable=g-import-not-at-top
  out = {}
  for packed in (False, True):
    config = base.get_config()
    config.model.update(vocab_size=512, hidden_size=64, num_layers=3, num_heads=4,
                        intermediate_size=128, attention_dropout_rate=0.0)
    config.phases.seq128.global_batch_size = 256
    config.data.update(packing=packed, packing_factor=2.0)
    r = aot.aot_compile(config, "v5e:2x2", "seq128")
    out["packed" if packed else "unpacked"] = dict(
        rows=r.rows, batch=r.global_batch_size, attention=r.attention, fits=r.fits,
        temp=r.temp_bytes, xla=r.compiled_flops * r.devices, xla_view=r.xla_view_flops,
        analytic=r.analytic_flops,
        predictions=r.packing.max_predictions_per_row if r.packing else None)
  return out


@pytest.mark.tpu
def test_the_packed_train_step_compiles_for_a_v5e_slice_with_its_packed_rows():
  """With data.packing the benchmark compiles the packed step (splash with the
  packed example ids): 256 examples at factor 2 are 128 rows, which need less
  memory than 256, and XLA's FLOPs match the packed analytic count as closely
  as the unpacked ones match theirs."""
  result = _libtpu_child({"packed": True})
  plain, packed = result["unpacked"], result["packed"]
  assert (plain["rows"], plain["batch"]) == (256, 256)
  assert (packed["rows"], packed["batch"]) == (128, 256)
  assert packed["predictions"] == 20 + 3  # max_predictions_per_seq + max_examples_per_row.
  assert plain["attention"] == packed["attention"] == "splash"
  assert plain["fits"] and packed["fits"]
  assert packed["temp"] < 0.8 * plain["temp"], result
  # Half the rows, each with 3 [CLS] slots and 23 predictions instead of 1 and 20.
  assert 0.5 * plain["analytic"] < packed["analytic"] < 0.6 * plain["analytic"], result
  ratio = lambda r: r["xla"] / r["xla_view"]
  assert abs(ratio(packed) - ratio(plain)) < 0.05 * ratio(plain), result


if __name__ == "__main__":
  print(json.dumps(_child(json.loads(sys.argv[1]))))
