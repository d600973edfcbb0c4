"""The device suite's profile table (bertjax/benchmarks/trace_summary.py): HLO
ops categorised by opcode, custom-call target and source location, kernels
without an HLO op by name, and the shares of small synthetic GPU and CPU
traces."""

import pytest

from bertjax.benchmarks import trace_summary as ts

HLO = """HloModule jit_train_step, is_scheduled=true

FileNames
1 "/r/bertjax/model/layers.py"
2 "/r/bertjax/model/attention.py"
3 "/r/bertjax/model/dropout.py"
4 "/r/site-packages/optax/_src/transform.py"

FunctionNames
1 "Dense.__call__"
2 "xla_attention"
3 "threefry2x32"
4 "scale_by_adam.<locals>.update_fn"
5 "_apply_keep_mask_fwd"
6 "LayerNorm.__call__"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=9}
2 {file_name_id=2 function_name_id=2 line=20 end_line=20 column=1 end_column=9}
3 {file_name_id=3 function_name_id=3 line=30 end_line=30 column=1 end_column=9}
4 {file_name_id=4 function_name_id=4 line=40 end_line=40 column=1 end_column=9}
5 {file_name_id=3 function_name_id=5 line=50 end_line=50 column=1 end_column=9}
6 {file_name_id=1 function_name_id=6 line=60 end_line=60 column=1 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=0}
2 {file_location_id=2 parent_frame_id=0}
3 {file_location_id=3 parent_frame_id=3}
4 {file_location_id=4 parent_frame_id=0}
5 {file_location_id=5 parent_frame_id=3}
6 {file_location_id=6 parent_frame_id=0}
7 {file_location_id=5 parent_frame_id=7}

%hash_computation (param_0: u32[4,8]) -> f32[4,8] {
  %param_0 = u32[4,8]{1,0} parameter(0)
  %xor.1 = u32[4,8]{1,0} xor(%param_0, %param_0), metadata={op_name="a" stack_frame_id=3}
  ROOT %exponential.1 = f32[4,8]{1,0} exponential(%xor.1), metadata={op_name="a" stack_frame_id=2}
}

%softmax_computation (param_0.1: f32[4,8]) -> f32[4,8] {
  %param_0.1 = f32[4,8]{1,0} parameter(0)
  ROOT %multiply.1 = f32[4,8]{1,0} multiply(%param_0.1, %param_0.1), metadata={op_name="a" stack_frame_id=5}
}

%adam_computation (param_0.2: f32[8]) -> f32[8] {
  %param_0.2 = f32[8]{0} parameter(0)
  ROOT %sqrt.1 = f32[8]{0} sqrt(%param_0.2), metadata={op_name="a" stack_frame_id=4}
}

%norm_computation (param_0.3: f32[4,8]) -> f32[4,8] {
  %param_0.3 = f32[4,8]{1,0} parameter(0)
  ROOT %add.1 = f32[4,8]{1,0} add(%param_0.3, %param_0.3), metadata={op_name="a" stack_frame_id=7}
}

%transpose_computation (param_0.4: f32[4,8]) -> f32[8,4] {
  %param_0.4 = f32[4,8]{1,0} parameter(0)
  ROOT %transpose.1 = f32[8,4]{1,0} transpose(%param_0.4), dimensions={1,0}
}

%gather_computation (param_0.5: f32[4,8], param_1: s32[2]) -> f32[2,8] {
  %param_0.5 = f32[4,8]{1,0} parameter(0)
  %param_1 = s32[2]{0} parameter(1)
  ROOT %gather.1 = f32[2,8]{1,0} gather(%param_0.5, %param_1), offset_dims={1}, metadata={op_name="a" stack_frame_id=6}
}

ENTRY %main.1 (p0: f32[4,8], p1: f32[8,8], p2: u32[4,8], p3: s32[2]) -> (f32[4,8], s32[]) {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  %p2 = u32[4,8]{1,0} parameter(2)
  %p3 = s32[2]{0} parameter(3)
  %dot.1 = f32[4,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="a" stack_frame_id=1}
  %dot.2 = f32[4,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="a" stack_frame_id=2}
  %fusion.1 = f32[4,8]{1,0} fusion(%p2), kind=kLoop, calls=%hash_computation
  %fusion.2 = f32[4,8]{1,0} fusion(%p0), kind=kLoop, calls=%softmax_computation
  %fusion.3 = f32[8]{0} fusion(%p3), kind=kLoop, calls=%adam_computation
  %fusion.4 = f32[4,8]{1,0} fusion(%p0), kind=kLoop, calls=%norm_computation
  %transpose_fusion = f32[8,4]{1,0} fusion(%p0), kind=kLoop, calls=%transpose_computation
  %gather_fusion = f32[2,8]{1,0} fusion(%p0, %p3), kind=kLoop, calls=%gather_computation
  %copy.1 = f32[4,8]{0,1} copy(%p0)
  %custom-call.1 = (f32[4,8]{1,0}, s8[64]{0}) custom-call(%p0, %p1), custom_call_target="__cublas$lt$matmul", metadata={op_name="a" stack_frame_id=1}
  %custom-call.2 = f32[4,8]{1,0} custom-call(%p0, %p0, %p0), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="a" stack_frame_id=2}
  %all-reduce.1 = f32[4,8]{1,0} all-reduce(%p0), replica_groups={}, to_apply=%softmax_computation
  %while.1 = (f32[4,8], s32[]) while(%p0), condition=%adam_computation, body=%norm_computation
  ROOT %tuple.1 = (f32[4,8], s32[]) tuple(%dot.1, %p3)
}
"""

EXPECTED = {
    "dot.1": ts.MATMUL, "dot.2": ts.ATTENTION, "fusion.1": ts.DROPOUT,
    "fusion.2": ts.ATTENTION, "fusion.3": ts.OPTIMIZER, "fusion.4": ts.ELEMENTWISE,
    "transpose_fusion": ts.COPY, "gather_fusion": ts.GATHER, "copy.1": ts.COPY,
    "custom-call.1": ts.MATMUL, "custom-call.2": ts.ATTENTION, "all-reduce.1": ts.COLLECTIVE,
    "while.1": ts.OTHER,
}


def test_hlo_ops_categorised_by_opcode_target_and_source():
  infos = ts.parse_hlo(HLO)
  got = {name: ts.categorise(name, infos[name]) for name in EXPECTED}
  assert got == EXPECTED
  # The hash fused with attention code counts as dropout; applying a mask goes
  # to the code around it (attention for fusion.2, none for fusion.4).
  assert infos["fusion.1"].markers == {ts.DROPOUT, ts.ATTENTION}
  assert infos["fusion.2"].markers == {ts.ATTENTION}
  assert not infos["fusion.4"].markers


@pytest.mark.parametrize("name, category", [
    ("nccl_AllReduce_RING_LL_Sum_float", ts.COLLECTIVE), ("MemcpyDtoD", ts.COPY),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", ts.MATMUL), ("nvjet_hsh_128x256", ts.MATMUL),
    ("flash_dropout_forward", ts.ATTENTION), ("cudnn_generated_fort_native_sdpa", ts.ATTENTION),
    ("loop_add_fusion_3", ts.ELEMENTWISE), ("mystery_kernel", ts.OTHER)])
def test_kernels_without_hlo_op_categorised_by_name(name, category):
  assert ts.categorise(name, None) == category


def _meta(pid, tid, kind, name):
  event = {"ph": "M", "pid": pid, "name": kind, "args": {"name": name}}
  return event if tid is None else {**event, "tid": tid}


def _op(pid, tid, ts0, dur, name, hlo_op=None, **args):
  if hlo_op:
    args = {"hlo_op": hlo_op, "hlo_module": "jit_train_step", **args}
  return {"ph": "X", "pid": pid, "tid": tid, "ts": ts0, "dur": dur, "name": name, "args": args}


def gpu_trace():
  """Two steps on a device: kernels on a compute stream and a copy stream, the
  derived "XLA Ops" line repeating them (left out) and host thunks (ignored)."""
  events = [_meta(1, None, "process_name", "/device:GPU:0"),
            _meta(9, None, "process_name", "/host:CPU"),
            _meta(1, 7, "thread_name", "Stream #7(Compute)"),
            _meta(1, 8, "thread_name", "Stream #8(MemcpyD2D)"),
            _meta(1, 100, "thread_name", "XLA Modules"),
            _meta(1, 101, "thread_name", "XLA Ops"),
            _op(9, 1, 0, 300, "host thunk", "dot.1")]
  for t in (0, 200):  # Per step, in microseconds: 100 with 10 idle.
    events += [_op(1, 100, t, 100, "jit_train_step(1)"),
               _op(1, 7, t, 30, "sm90_xmma_gemm_bf16", "dot.1"),
               _op(1, 101, t, 30, "dot.1", "dot.1"),
               _op(1, 7, t + 30, 20, "loop_xor_fusion", "fusion.1"),
               _op(1, 7, t + 50, 10, "loop_multiply_fusion", "fusion.2"),
               _op(1, 7, t + 70, 20, "loop_sqrt_fusion", "fusion.3"),
               _op(1, 8, t + 80, 20, "MemcpyDtoD")]
  return events


def _ms(summary):
  return {r["category"]: round(r["ms"] * 1e3, 6) for r in summary["categories"]}


def test_gpu_trace_summary_shares_each_instant():
  s = ts.summarise(gpu_trace(), ts.parse_hlo(HLO), steps=5)
  assert (s["steps"], s["ops"]) == (2, "device kernels")  # Steps from "XLA Modules".
  got = {k: v for k, v in _ms(s).items() if v}
  # The copy overlaps the optimizer for 10 us: 5 each.
  assert got == {ts.MATMUL: 30, ts.DROPOUT: 20, ts.ATTENTION: 10, ts.OPTIMIZER: 15,
                 ts.COPY: 15, ts.IDLE: 10}
  assert s["step_ms"] == pytest.approx(0.1)
  assert sum(r["ms"] for r in s["categories"]) == pytest.approx(s["step_ms"])
  busy = {r["category"]: round(r["busy_ms"] * 1e3, 6) for r in s["categories"]}
  assert (busy[ts.OPTIMIZER], busy[ts.COPY]) == (20, 20)
  assert s["top_ops"][0] == {"op": "dot.1", "category": ts.MATMUL, "ms": pytest.approx(0.03)}
  assert "| matmul | 0.030 | 30.0% |" in ts.markdown(s, "t")


def test_cpu_trace_nested_thunks_on_two_threads():
  """Host thunks: a while loop holds two ops on one thread while a copy runs on
  another; the loop keeps the time its body leaves."""
  events = [_meta(1, None, "process_name", "/host:CPU"),
            _op(1, 10, 0, 100, "while.1", "while.1", run_id="a"),
            _op(1, 10, 10, 30, "dot.1", "dot.1", run_id="a"),
            _op(1, 10, 50, 20, "fusion.4", "fusion.4", run_id="a"),
            _op(1, 11, 20, 40, "copy.1", "copy.1", run_id="a"),
            _op(1, 12, 0, 500, "ThunkExecutor::Execute")]  # No hlo_op: not an op.
  s = ts.summarise(events, ts.parse_hlo(HLO), steps=3)
  assert (s["steps"], s["ops"]) == (1, "XLA thunks on the host")  # Steps from run_id.
  got = {k: v for k, v in _ms(s).items() if v}
  assert got == {ts.OTHER: 45, ts.MATMUL: 20, ts.COPY: 20, ts.ELEMENTWISE: 15}
  busy = {r["category"]: round(r["busy_ms"] * 1e3, 6) for r in s["categories"]}
  assert (busy[ts.OTHER], busy[ts.MATMUL], busy[ts.COPY]) == (50, 30, 40)


def test_trace_without_ops_is_an_error():
  with pytest.raises(ValueError, match="no ops"):
    ts.summarise([_meta(1, None, "process_name", "/host:CPU")], {}, steps=1)
