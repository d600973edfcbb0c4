"""The fit check (bertjax/fit): available HBM, one device per chip, DCN bytes, and the
command's lines and exit status.

The parsing and the decision run everywhere, with fakes for libtpu, and the
command runs on this machine's CPU devices; the tests marked `tpu` compile for
real TPU topologies in a child process with JAX_PLATFORMS=cpu and are skipped
where libtpu is not installed (`pip install "jax[tpu]"`).
"""

import importlib.util
import json
import os
import re
import subprocess
import sys

import jax
import pytest

import jax_child
from bertjax.fit import aot
from bertjax.fit import check
from bertjax.fit import topology

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
  assert topology.parse_available_hbm(message) == (None if expected is None else int(expected))


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
  monkeypatch.setattr(topology, "topology_devices", lambda name: jax.devices("cpu"))
  monkeypatch.setattr(topology.jax, "jit", _FakeCompile(jax.errors.JaxRuntimeError(
      "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
      "temporaries (1.00T) exceeds available HBM (15.75G).")))
  assert topology.available_hbm_bytes.__wrapped__("v5e:2x4") == int(15.75 * GIB)
  # A compiler that does not stop the program names no figure.
  monkeypatch.setattr(topology.jax, "jit", _FakeCompile(None))
  assert topology.available_hbm_bytes.__wrapped__("v5e:2x4") is None
  # Any other failure is a bug to see, not an unknown figure.
  monkeypatch.setattr(topology.jax, "jit", _FakeCompile(
      jax.errors.JaxRuntimeError("INTERNAL: broken")))
  with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
    topology.available_hbm_bytes.__wrapped__("v5e:2x4")


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
  topology.topology_devices("v4:2x2x1")
  topology.topology_devices("v5e:2x4")
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
  from bertjax.fit import dcn_traffic  # pylint: disable=g-import-not-at-top
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


def test_a_verdict_is_one_line_that_says_what_to_change():
  ways = "split each step's batch with --config.optimizer.grad_accum_steps=2 (or more)"
  fits = check.Verdict("seq128", 3 * GIB, 4 * GIB, "arguments 1.00 GiB", ways)
  assert fits.fits and fits.line() == (
      "seq128: fits: 3.00 GiB per device (arguments 1.00 GiB) of 4.00 GiB available")
  too_big = check.Verdict("seq512", 5 * GIB, 4 * GIB, "arguments 1.00 GiB", ways)
  assert too_big.fits is False and too_big.line() == (
      "seq512: does not fit: 5.00 GiB per device (arguments 1.00 GiB) of 4.00 GiB "
      f"available; to fit, {ways}")
  unknown = check.Verdict("seq128", 3 * GIB, None, "arguments 1.00 GiB", ways)
  assert unknown.fits is None and "--available_gib" in unknown.line()
  stopped = check.Verdict("squad step", 30 * GIB, int(15.75 * GIB), "temporaries alone "
                          "30.00 GiB", ways, "RESOURCE_EXHAUSTED: Ran out of memory")
  assert stopped.fits is False and stopped.line().startswith(
      "squad step: does not fit: the compiler ran out of HBM (temporaries alone 30.00 GiB), "
      "15.75 GiB available (RESOURCE_EXHAUSTED")
  for verdict in (fits, too_big, unknown, stopped):
    assert "\n" not in verdict.line()


def _fit_command(tmp_path_factory, *flags):
  """`python -m bertjax.fit` on this machine's CPU (cheap compiles, a shared cache)."""
  env = dict(os.environ, **jax_child.child_env(1, jax_child.cache_dir(tmp_path_factory)))
  return subprocess.run([sys.executable, "-m", "bertjax.fit", *flags], cwd=jax_child.REPO,
                        env=env, capture_output=True, text=True, timeout=600, check=False)


# The demo's model with a small vocab: a compile of a few seconds.
_TINY = ["--config=configs/tiny.py", "--vocab_size=512"]


@pytest.mark.slow
def test_the_command_says_in_one_line_that_a_phase_does_not_fit(tmp_path_factory):
  done = _fit_command(tmp_path_factory, *_TINY, "--phase=seq128", "--available_gib=0.001")
  assert done.returncode == 1, done.stderr[-3000:]
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  lines = [l for l in done.stdout.splitlines() if l.startswith("seq128:")]
  assert len(lines) == 1, done.stdout
  assert lines[0].startswith("seq128: does not fit: ") and "of 0.00 GiB available" in lines[0]
  for field in ("--config.optimizer.grad_accum_steps=2", "--config.model.remat_policy",
                "--config.phases.seq128.global_batch_size"):
    assert field in lines[0]
  assert "topology        this machine (1 chips, 1 devices, cpu)" in done.stdout
  assert not any(l.startswith("seq512") for l in done.stdout.splitlines())


@pytest.mark.slow
def test_the_command_checks_every_phase_searches_the_largest_batch_and_fine_tuning(
    tmp_path_factory):
  done = _fit_command(tmp_path_factory, *_TINY, "--available_gib=100")
  assert done.returncode == 0, done.stderr[-3000:]
  verdicts = [l for l in done.stdout.splitlines() if l.startswith("seq")]
  assert [l.split(":")[:2] for l in verdicts] == [["seq128", " fits"], ["seq512", " fits"]]
  # Where the CPU reports no limit, the line says so and the check does not fail.
  unknown = _fit_command(tmp_path_factory, *_TINY, "--phase=seq512")
  assert unknown.returncode == 0, unknown.stderr[-3000:]
  assert "seq512: " in unknown.stdout and "--available_gib" in unknown.stdout
  # The largest per-device batch under twice the memory of batch 8: a multiple of 8
  # that fits, beside a compile 8 larger that does not.
  limit = 2 * float(verdicts[0].split(": fits: ")[1].split(" GiB")[0])
  search = _fit_command(tmp_path_factory, *_TINY, "--phase=seq128", "--find_max_batch",
                        f"--available_gib={limit}")
  assert search.returncode == 0, search.stderr[-3000:]
  found = re.search(r"^seq128: largest per-device batch that fits: (\d+) \(global batch "
                    r"\1, ([0-9.]+) GiB per device", search.stdout, re.MULTILINE)
  assert found, search.stdout
  best = int(found[1])
  assert best % 8 == 0 and best >= 8 and float(found[2]) <= limit
  assert f"per-device batch {best + 8}: " in search.stdout
  finetuning = _fit_command(
      tmp_path_factory, "--config=configs/finetune/glue.py", "--config.task=MRPC",
      "--config.model.num_layers=2", "--config.model.hidden_size=64",
      "--config.model.num_heads=2", "--config.model.intermediate_size=128",
      "--vocab_size=512", "--grad_accum_steps=1,2", "--available_gib=100")
  assert finetuning.returncode == 0, finetuning.stderr[-3000:]
  lines = [l for l in finetuning.stdout.splitlines() if l.startswith("MRPC step")]
  assert [l.split(": ")[1] for l in lines] == ["fits", "fits"], finetuning.stdout
  assert "grad_accum_steps=1: " in lines[0] and "grad_accum_steps=2: " in lines[1]


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
  return {name: {"devices": len(topology.topology_devices(name)),
                 "chips": aot._count_chips(topology.topology_devices(name)),  # pylint: disable=protected-access
                 "available_gib": topology.available_hbm_bytes(name) / GIB}
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
  from bertjax.fit import finetune  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(jax_child.REPO, "configs", "finetune"))
  import squad  # pylint: disable=g-import-not-at-top
  out = {}
  for accum in accums:
    config = ml_collections.ConfigDict(squad.get_config().to_dict())
    config.version = "2.0"  # The paper's batch of 48.
    # Length 384 and a small vocab: activations outweigh the weight-sized buffers
    # (parameters, Adam moments, the summed gradient), as in BERT-LARGE.
    config.model.update(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256)
    r = finetune.compile_step(config, "v5e:1x1", accum, vocab_size=1024)
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
    devices = topology.topology_devices("v5e:2x2", 2)
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
                        intermediate_size=128, attention_dropout_rate=0.0,
                        attention_impl="splash")
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
  """With data.packing the fit check compiles the packed step (splash with the
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
