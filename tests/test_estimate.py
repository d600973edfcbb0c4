"""The compiler's estimate summed over a compiled program (fit/hlo_cost.py) and the
Pallas kernels priced from Mosaic's dumps (fit/mosaic_cost.py), on program
texts written here in the TPU compiler's format. Compiles for a TPU
topology, where libtpu is installed, are tests/test_fit.py's (marker `tpu`).
"""

import collections
import os

import pytest

from bertjax.fit import estimate as estimate_lib
from bertjax.fit import hlo_cost
from bertjax.fit import mosaic_cost


def _cycles(n: int) -> str:
  return f'backend_config={{"flag_configs":[],"window_config":{{"estimated_cycles":"{n}"}}}}'


PROGRAM = f"""HloModule jit_train_step, entry_computation_layout={{()->f32[]}}

%fused_computation.1 (param_0.1: f32[8,128]) -> f32[8,128] {{
  %param_0.1 = f32[8,128]{{1,0}} parameter(0)
  ROOT %multiply.1 = f32[8,128]{{1,0}} multiply(%param_0.1, %param_0.1)
}}

%body (param.1: (s32[], f32[8,128])) -> (s32[], f32[8,128]) {{
  %param.1 = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %get-tuple-element.1 = s32[] get-tuple-element(%param.1), index=0
  %get-tuple-element.2 = f32[8,128]{{1,0}} get-tuple-element(%param.1), index=1
  %fusion.1 = f32[8,128]{{1,0}} fusion(%get-tuple-element.2), kind=kLoop, calls=%fused_computation.1, metadata={{op_name="jit(train_step)/layer/mul"}}, {_cycles(100)}
  %flash_dropout_forward.1 = (bf16[2,4,128,64]{{3,2,1,0}}, f32[2,4,128,128]{{3,2,1,0}}) custom-call(%fusion.1), custom_call_target="tpu_custom_call", backend_config={{"custom_call_config":{{"body":"xyz"}},"xprof_metadata":"{{\\"block_q\\": 128
}}}}, metadata={{op_name="jit(train_step)/layer/attention/pallas_call"}}
  %fusion.2 = f32[8,128]{{1,0}} fusion(%fusion.1), kind=kLoop, calls=%fused_computation.1, {_cycles(7)}
  %constant.1 = s32[] constant(1)
  %add.1 = s32[] add(%get-tuple-element.1, %constant.1)
  ROOT %tuple.1 = (s32[], f32[8,128]{{1,0}}) tuple(%add.1, %fusion.2)
}}

%condition (param.2: (s32[], f32[8,128])) -> pred[] {{
  %param.2 = (s32[], f32[8,128]{{1,0}}) parameter(0)
  %get-tuple-element.3 = s32[] get-tuple-element(%param.2), index=0
  %constant.2 = s32[] constant(11)
  ROOT %compare.1 = pred[] compare(%get-tuple-element.3, %constant.2), direction=LT
}}

%branch_a (param.3: f32[8,128]) -> f32[8,128] {{
  %param.3 = f32[8,128]{{1,0}} parameter(0)
  ROOT %fusion.3 = f32[8,128]{{1,0}} fusion(%param.3), kind=kLoop, calls=%fused_computation.1, {_cycles(50)}
}}

%branch_b (param.4: f32[8,128]) -> f32[8,128] {{
  %param.4 = f32[8,128]{{1,0}} parameter(0)
  ROOT %copy.1 = f32[8,128]{{1,0}} copy(%param.4), {_cycles(3)}
}}

ENTRY %main (param.0: f32[8,128], param.5: s32[]) -> f32[8,128] {{
  %param.0 = f32[8,128]{{1,0}} parameter(0)
  %param.5 = s32[] parameter(1)
  %constant.0 = s32[] constant(1)
  %tuple.0 = (s32[], f32[8,128]{{1,0}}) tuple(%constant.0, %param.0)
  %while.1 = (s32[], f32[8,128]{{1,0}}) while(%tuple.0), condition=%condition, body=%body, metadata={{op_name="jit(train_step)/encoder/while"}}
  %get-tuple-element.4 = f32[8,128]{{1,0}} get-tuple-element(%while.1), index=1
  %convert.1 = bf16[8,128]{{1,0}} convert(%get-tuple-element.4), {_cycles(1000)}
  %all-reduce-start.1 = f32[1024]{{0}} all-reduce-start(%get-tuple-element.4), replica_groups={{}}
  %all-reduce-done.1 = f32[1024]{{0}} all-reduce-done(%all-reduce-start.1)
  %compare.2 = pred[] compare(%param.5, %constant.0), direction=EQ
  %conditional.1 = f32[8,128]{{1,0}} conditional(%compare.2, %get-tuple-element.4, %get-tuple-element.4), branch_computations={{%branch_a, %branch_b}}
  ROOT %fusion.4 = f32[8,128]{{1,0}} fusion(%conditional.1), kind=kLoop, calls=%fused_computation.1, {_cycles(20)}
}}
"""


def test_loop_bodies_count_their_trips_and_branches_their_dearest():
  cost = hlo_cost.program_cost(PROGRAM)
  # The loop runs from 1 to 11: 10 trips of 100 + 7 cycles.
  assert cost.loop_cycles == 10 * 107
  assert cost.cycles == 10 * 107 + 1000 + 50 + 20
  assert cost.kernels == collections.Counter({"flash_dropout_forward": 10})
  # A call's operands and results: f32[8,128] in; bf16[2,4,128,64], f32[2,4,128,128] out.
  assert cost.kernel_bytes["flash_dropout_forward"] == (8 * 128 * 4 + 2 * 4 * 128 * 64 * 2
                                                        + 2 * 4 * 128 * 128 * 4)
  assert cost.collectives == 1 and cost.collective_bytes == 1024 * 4
  assert cost.unknown_trips == 0
  # A kernel's backend_config over two lines ("}}" starting the second) ends
  # no computation: the loop body's last fusion is still counted.
  assert ("fusion.2", "") in cost.items
  top = cost.outside_loops.most_common(1)[0]
  assert top == (("convert.1", ""), 1000)


def test_a_known_trip_count_wins_and_an_unknown_one_counts_once():
  known = PROGRAM.replace('metadata={op_name="jit(train_step)/encoder/while"}',
                          'backend_config={"known_trip_count":{"n":"4"}}')
  assert hlo_cost.program_cost(known).loop_cycles == 4 * 107
  unknown = PROGRAM.replace("direction=LT", "direction=NE")
  cost = hlo_cost.program_cost(unknown)
  assert cost.unknown_trips == 1 and cost.loop_cycles == 107


def test_a_program_without_entry_is_refused():
  with pytest.raises(ValueError, match="no ENTRY computation"):
    hlo_cost.program_cost("HloModule m\n")


def _write_dump(directory, run: str, name: str, grid: str, valu: int, exp: int, matmul: str):
  original = (f"module {{\n  func.func @{name}(%arg0: i32) {{\n"
              f"    %0 = tpu.matmul %a, %b, %c {{dimension_numbers = #tpu.dot_dimension_numbers"
              f"<[1], [0], [0], [1], [0, 0, 1, 1], [], []>}} : {matmul}\n  }}\n}}\n")
  ops = "\n".join([f"    %{i} = llo.vadd.f32 %x, %y : vector<8x128xf32>" for i in range(valu)]
                  + [f"    %e{i} = llo.vexp %x : vector<8x128xf32>" for i in range(exp)]
                  + ['    %l = "llo.vector_load"(%p) : () -> vector<8x128xf32>'])
  final = (f"module {{\n  func.func @{name}(%arg0: i32) attributes {{dimension_semantics = [], "
           f"iteration_bounds = array<i64: {grid}>}} {{\n{ops}\n  }}\n}}\n")
  for stage, text in (("0001-mosaic-dump-anonymous-original", original),
                      ("0018-mosaic-dump-anonymous-post-finalize-llo", final)):
    with open(os.path.join(directory, f"{run}-{stage}.txt"), "w") as f:
      f.write(text)


def test_mosaic_dumps_give_each_kernels_counts_and_an_issue_bound(tmp_path):
  _write_dump(tmp_path, "111", "flash_dropout_forward", "2, 4, 1, 1", valu=40, exp=4,
              matmul="vector<64x128xbf16>, vector<64x128xbf16>, vector<128x128xf32> -> "
              "vector<128x128xf32>")
  _write_dump(tmp_path, "222", "flash_dropout_dkv", "2, 4, 1, 1", valu=10, exp=0,
              matmul="vector<128x128xbf16>, vector<64x128xbf16>, vector<128x64xf32> -> "
              "vector<128x64xf32>")
  counts = mosaic_cost.read_dumps(str(tmp_path))
  forward = counts["flash_dropout_forward"][0]
  assert (forward.valu, forward.eup, forward.vector_loads, forward.steps) == (40, 4, 1, 8)
  assert forward.matmul_flops == 2 * 128 * 128 * 64
  rates = mosaic_cost.Rates(valu_vreg_ops=2.0, eup_vreg_ops=0.5, matmul_flops=1e4,
                            hbm_bytes=100.0)
  units = mosaic_cost.step_cycles(forward, rates)
  assert units == {"valu": 20.0, "eup": 8.0, "mxu": 2 * 128 * 128 * 64 / 1e4,
                   "step": 2 * 128 * 128 * 64 / 1e4}
  assert mosaic_cost.kernel_cycles(forward, rates) == 8 * units["step"]
  # Where moving the call's bytes once takes longer, that is the price.
  assert mosaic_cost.kernel_cycles(forward, rates, call_bytes=10**6) == 10**4
  # A subset of the files (one compile's) gives that compile's kernels only.
  first = {str(p) for p in tmp_path.iterdir() if p.name.startswith("111")}
  assert set(mosaic_cost.read_dumps(first)) == {"flash_dropout_forward"}


class _Device:
  device_kind = "TPU v5 lite"


def test_the_estimate_adds_the_kernels_and_says_it_is_the_compilers(tmp_path, monkeypatch):
  _write_dump(tmp_path, "111", "flash_dropout_forward", "2, 4, 1, 1", valu=40, exp=4,
              matmul="vector<64x128xbf16>, vector<64x128xbf16>, vector<128x128xf32> -> "
              "vector<128x128xf32>")
  rates = mosaic_cost.Rates(valu_vreg_ops=2.0, eup_vreg_ops=0.5, matmul_flops=1e6,
                            hbm_bytes=1e9)
  monkeypatch.setattr(mosaic_cost, "calibrate", lambda device: rates)
  e = estimate_lib.estimate(PROGRAM, _Device(), estimate_lib.dump_files(str(tmp_path)),
                            step_flops=1.5e6, num_devices=1, peak_tflops_per_device=197.0)
  assert e.compiler_cycles == 10 * 107 + 1070
  calls, per_call, unit = e.kernels["flash_dropout_forward"]
  assert (calls, per_call, unit) == (10, 8 * 20.0, "valu")
  assert e.cycles == e.compiler_cycles + 10 * 160.0
  assert e.seconds == pytest.approx(e.cycles / 1.5e9)
  assert e.mfu == pytest.approx(1.5e6 / (e.seconds * 197e12))
  lines = estimate_lib.describe(e)
  assert lines[0].startswith("compiler's estimate (not a measurement)")
  assert any("flash_dropout_forward: 10 calls" in line for line in lines)
  # Without the kernel's dump it is named unpriced, not priced at zero silently.
  bare = estimate_lib.estimate(PROGRAM, _Device(), set())
  assert bare.unpriced_kernels == ["flash_dropout_forward"]
  assert any("unpriced kernels" in line for line in estimate_lib.describe(bare))


def test_the_dump_directory_is_set_once_for_libtpu(monkeypatch):
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_some_flag=1")
  directory = estimate_lib.mosaic_dump_dir()
  assert os.environ["LIBTPU_INIT_ARGS"] == f"--xla_some_flag=1 --xla_mosaic_dump_to={directory}"
  assert estimate_lib.mosaic_dump_dir() == directory  # Already set: the same.
