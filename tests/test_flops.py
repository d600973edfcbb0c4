"""Analytic FLOPs against XLA's count, utilisation, the compilation cache and profiler traces."""

import glob
import json
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cheap_compiles
import jax_child
from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.records import schema
from bertjax.train import flops
from bertjax.train import profiling
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib

BATCH, SEQ, PRED = 4, 64, 8


def _config(**changes):
  return BertConfig(**{**dict(vocab_size=250, vocab_multiple=128, hidden_size=128,
                                num_layers=3, num_heads=2, intermediate_size=512,
                                max_position_embeddings=SEQ), **changes})


def _abstract_state(model, tx):
  params = jax.eval_shape(lambda: nn.unbox(state_lib.init_params(model, jax.random.key(0))))
  return state_lib.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                              opt_state=jax.eval_shape(tx.init, params),
                              apply_fn=model.apply, tx=tx)


def _compiled_step_flops(config):
  state = _abstract_state(BertForPreTraining(config), optax.adamw(1e-4))
  batch = {k: jax.ShapeDtypeStruct(s, d)
           for k, (s, d) in schema.batch_shapes(BATCH, SEQ, PRED).items()}
  rng = jax.eval_shape(lambda: jax.random.key(0))
  # Code generation's options leave XLA's FLOP count as the default compile has it.
  compiled = cheap_compiles.jit(step_lib.train_step, which=cheap_compiles.CODEGEN).lower(
      state, batch, rng).compile()
  return profiling.compiled_flops(compiled)


@pytest.mark.slow
def test_analytic_flops_agree_with_xla_and_scan_is_counted_once():
  unrolled = _config(scan_layers=False)
  analytic = flops.train_flops_per_sequence(unrolled, SEQ, PRED) * BATCH
  counted = _compiled_step_flops(unrolled)
  # XLA also counts softmax, LayerNorm, GELU, the loss, the optimizer and
  # the dropout masks' Threefry rounds (elementwise integer operations): 14%
  # on top of the matmuls at this small width.
  assert analytic < counted < 1.20 * analytic, (counted, analytic)
  # Scanned in a loop, XLA counts the loop body once: the first two layers
  # are the loop (the last runs apart, at [CLS] and the masked positions), so
  # one whole layer goes missing.
  one_layer = analytic - flops.train_flops_per_sequence(
      unrolled.replace(num_layers=2), SEQ, PRED) * BATCH
  scanned = _compiled_step_flops(_config(scan_layers=True, layer_loop="scan"))
  assert abs((counted - scanned) - one_layer) < 0.1 * one_layer, (counted, scanned)
  assert profiling.complete_count(unrolled, 1)
  assert not profiling.complete_count(unrolled.replace(scan_layers=True, layer_loop="scan"), 1)
  assert not profiling.complete_count(unrolled, 2)


def test_mfu_is_always_analytic_and_hfu_takes_xla_flops_only_where_they_are_complete():
  config = _config(scan_layers=False)
  common = dict(step_seconds=0.5, num_chips=4, peak_tflops_per_chip=100.0,
                model_config=config, seq_len=SEQ, num_predictions=PRED, global_batch_size=64)
  mfu = flops.train_flops_per_sequence(config, SEQ, PRED) * 128 / 4e14
  util = profiling.utilisation(compiled_step_flops=2e13, **common)
  assert util == pytest.approx({"mfu": mfu, "hfu": 2e13 / 0.5 / 1e14})
  # XLA counts one micro-batch of two: no hfu, the same mfu.
  util = profiling.utilisation(compiled_step_flops=2e13, grad_accum_steps=2, **common)
  assert util == pytest.approx({"mfu": mfu})
  assert profiling.utilisation(**common) == pytest.approx({"mfu": mfu})
  assert profiling.utilisation(**dict(common, peak_tflops_per_chip=None)) == {}


def test_profile_window_traces_exactly_its_steps(tmp_path):
  window = profiling.ProfileWindow(2, 2, str(tmp_path))
  f = jax.jit(lambda x: jnp.tanh(x @ x))
  x = jnp.ones((64, 64))
  started = []
  for step in range(6):
    window.before_step(step)
    started.append(window.active)
    x = f(x)
    window.after_step(step, x)
  assert started == [False, False, True, True, False, False] and window.done
  traces = glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0
  never = profiling.ProfileWindow(0, 0, str(tmp_path / "none"))
  never.before_step(0)
  assert not never.active and not os.path.exists(tmp_path / "none")
  with pytest.raises(ValueError, match=r"logging\.profile_steps"):
    profiling.ProfileWindow(-1, 2, str(tmp_path))


@pytest.mark.slow
def test_second_start_loads_the_step_from_the_compilation_cache(tmp_path, tmp_path_factory):
  cache = str(tmp_path / "cache")
  shared = jax_child.cache_dir(tmp_path_factory)
  first, _ = jax_child.run(__file__, {"cache": cache}, cache=shared)
  second, _ = jax_child.run(__file__, {"cache": cache}, cache=shared)
  assert (first["hits"], first["misses"]) == (0, 1), first
  assert (second["hits"], second["misses"]) == (1, 0), second
  assert second["loss"] == first["loss"]


def _child(payload):
  """A fresh process: the cache on, one tiny train step compiled and run."""
  profiling.enable_compilation_cache(payload["cache"], min_compile_seconds=0.0)
  model = BertForPreTraining(_config(num_layers=1))
  tx = optax.adamw(1e-3)
  params = cheap_compiles.jit(lambda r: nn.unbox(state_lib.init_params(model, r)))(
      jax.random.key(0))
  state = state_lib.TrainState(step=jnp.zeros([], jnp.int32), params=params,
                               opt_state=tx.init(params), apply_fn=model.apply, tx=tx)
  batch = {k: np.ones(s, d) for k, (s, d) in schema.batch_shapes(BATCH, SEQ, PRED).items()}
  rng = jax.random.key(1)
  counter = profiling.CacheCounter()  # Counts the train step's compile alone.
  step_fn = cheap_compiles.jit(step_lib.train_step).lower(state, batch, rng).compile()
  hits, misses = counter.hits, counter.misses
  _, metrics = step_fn(state, batch, rng)
  return {"hits": hits, "misses": misses, "loss": float(metrics["loss"])}


if __name__ == "__main__":
  print(json.dumps(_child(json.loads(sys.argv[1]))))


def test_aot_result_splits_a_chips_nominal_hbm_between_its_devices():
  from bertjax.fit import aot  # pylint: disable=g-import-not-at-top
  r = aot.AotResult(
      topology="v4:2x2x1", devices=8, chips=4, device_kind="TPU v4", mesh={"data": 8},
      phase="seq128", global_batch_size=256, seq_len=128, attention="splash",
      compile_seconds=1.0, argument_bytes=10 * 2**30, temp_bytes=7 * 2**30,
      unaliased_output_bytes=0, compiled_flops=None, analytic_flops=1.0, xla_view_flops=1.0)
  assert r.nominal_hbm_bytes == 16 * 2**30 and r.total_bytes == 17 * 2**30
  assert r.fits is None  # The fit needs the compiler's available HBM (tests/test_fit.py).
  assert aot.AotResult(**{**r.__dict__, "device_kind": "cpu"}).nominal_hbm_bytes is None


def test_a_step_larger_than_the_devices_memory_is_refused_naming_the_fields():
  """bertjax.benchmarks.step_bench checks a compiled step's memory against the device's
  bytes_limit before running it (a GPU reports one; the CPU none)."""
  from bertjax.train import step_setup  # pylint: disable=g-import-not-at-top
  compiled = jax.jit(lambda x: jnp.sin(x) @ x).lower(jnp.ones((256, 256))).compile()
  mem = compiled.memory_analysis()
  needed = (mem.argument_size_in_bytes + mem.temp_size_in_bytes
            + mem.output_size_in_bytes - mem.alias_size_in_bytes)
  assert needed >= 256 * 256 * 4 * 2  # The argument and the output at least.
  assert step_setup.needed_bytes(mem) == needed
  assert step_setup.device_memory_problem(mem, None, "cpu", "seq512") is None
  assert step_setup.device_memory_problem(mem, needed, "H100", "seq512") is None
  problem = step_setup.device_memory_problem(mem, needed - 1, "NVIDIA H100", "seq512")
  for part in ("the seq512 train step needs", "one NVIDIA H100 lets it use",
               "--config.optimizer.grad_accum_steps", "--config.model.remat_policy",
               "--config.phases.seq512.global_batch_size"):
    assert part in problem
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in problem
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in step_setup.device_memory_problem(
      mem, needed - 1, "NVIDIA H100", "seq512", "gpu")


def test_xla_view_of_flops_drops_scanned_layers_and_pallas_attention():
  from bertjax.fit import aot  # pylint: disable=g-import-not-at-top
  config = _config(scan_layers=True)
  # One layer of the loop plus the last layer, which runs outside it.
  seen = config.replace(num_layers=2)
  assert aot.flops_as_xla_counts(config, SEQ, PRED, 8, "xla") == pytest.approx(
      8 * flops.train_flops_per_sequence(seen, SEQ, PRED))
  # Splash runs in the loop's layer only; the last layer attends with XLA.
  attention_matmuls = 3 * SEQ * 2 * 2 * SEQ * config.hidden_size * 8
  assert aot.flops_as_xla_counts(config, SEQ, PRED, 8, "splash") == pytest.approx(
      8 * flops.train_flops_per_sequence(seen, SEQ, PRED) - attention_matmuls)
  unrolled = config.replace(scan_layers=False)
  assert aot.flops_as_xla_counts(unrolled, SEQ, PRED, 8, "xla", 2) == pytest.approx(
      4 * flops.train_flops_per_sequence(unrolled, SEQ, PRED))


def test_loops_in_the_compiled_program_disqualify_its_flop_count():
  x = jnp.ones((64, 64))
  plain = jax.jit(lambda a: a @ a).lower(x).compile()
  looped = jax.jit(lambda a: jax.lax.fori_loop(0, 8, lambda i, b: b @ a, a)).lower(x).compile()
  assert not profiling.has_loops(plain) and profiling.has_loops(looped)
  assert profiling.count_loops(plain) == 0 and profiling.count_loops(looped) >= 1
  assert profiling.whole_step_flops(plain) == profiling.compiled_flops(plain) > 0
  assert profiling.whole_step_flops(looped) is None
  assert profiling.compiled_flops(looped) > 0  # XLA's count exists, but of one trip.


def _fake_aot_compile(compiled, gib_at, hbm, refuse_over=None, slices=1):
  """Stands for aot.aot_compile on 8 devices: `gib_at(per-device batch)` GiB per device.

  Appends each compiled per-device batch to `compiled`; above `refuse_over`
  GiB it raises the compiler's RESOURCE_EXHAUSTED.
  """
  from bertjax.fit import aot  # pylint: disable=g-import-not-at-top

  def fake_compile(config, topology, phase_name, global_batch_size, vocab_size=6000,
                   num_slices=1, available_bytes=None):
    assert num_slices == slices  # The search passes its slices on ...
    assert vocab_size == 6000  # ... and its vocab size, to every compile.
    per_device = global_batch_size // 8
    compiled.append(per_device)
    gib = gib_at(per_device)
    if refuse_over is not None and gib > refuse_over:
      raise jax.errors.JaxRuntimeError(
          f"RESOURCE_EXHAUSTED: Ran out of memory on HBM ({gib:.2f}G of {refuse_over}G)")
    return aot.AotResult(
        topology=topology, devices=8, chips=8, device_kind="TPU v5 lite", mesh={"data": 8},
        phase=phase_name, global_batch_size=global_batch_size, seq_len=128,
        attention="splash", compile_seconds=1.0, argument_bytes=0,
        temp_bytes=int(gib * 2**30), unaliased_output_bytes=0, compiled_flops=None,
        analytic_flops=1.0, xla_view_flops=1.0, hbm_bytes=int(hbm * 2**30),
        num_slices=num_slices)

  return fake_compile


@pytest.mark.parametrize("fixed,per_item,curve,hbm", [
    (1.0, 0.05, 0.0, 16.0),  # Linear: the first prediction is right.
    (1.0, 0.05, 2e-5, 16.0),  # Convex: the line overshoots; bisection corrects it.
    (1.0, 0.05, -2e-5, 16.0),  # Concave: the line undershoots; compiles climb to it.
    (9.0, 0.02, 0.0, 16.0),
    (17.0, 0.05, 0.0, 16.0),  # Nothing fits.
])
@pytest.mark.parametrize("hint", [None, 1.0, 0.5, 2.0])  # x the true memory per sequence.
# Above this many GiB the compiler stops with RESOURCE_EXHAUSTED (None: never).
@pytest.mark.parametrize("refuse_over", [None, 16.5])
def test_find_max_batch_brackets_the_answer_with_compiles(monkeypatch, fixed, per_item,
                                                          curve, hbm, hint, refuse_over):
  from bertjax.fit import aot, max_batch  # pylint: disable=g-import-not-at-top
  compiled = []
  fake_compile = _fake_aot_compile(
      compiled, lambda n: fixed + per_item * n + curve * n ** 2, hbm, refuse_over)
  monkeypatch.setattr(aot, "aot_compile", fake_compile)
  monkeypatch.setattr(max_batch, "num_devices", lambda topology, num_slices=1: 8)
  config = lambda: __import__("ml_collections").ConfigDict(
      {"mesh": {"data": -1, "fsdp": 1, "tensor": 1}})
  try:
    known = fake_compile(None, "v5e:2x4", "seq128", 32 * 8)  # The table's own compile.
  except jax.errors.JaxRuntimeError:
    known = None
  best, result, found = max_batch.find_max_batch(
      config, "v5e:2x4", "seq128", 32, log=lambda m: None, known=known,
      per_item_hint=hint and hint * per_item * 2**30, vocab_size=6000)
  step = max_batch.BATCH_STEP
  fits = lambda n: fixed + per_item * n + curve * n ** 2 <= hbm
  assert compiled.count(32) == 1 + (known is None)  # A known compile is not repeated.
  if not fits(step):
    assert best == 0
    return
  assert best % step == 0 and fits(best) and not fits(best + step), best
  assert best in compiled and best + step in compiled  # Both sides were compiled.
  assert result.global_batch_size == best * 8
  assert len(set(compiled)) <= 10, compiled
  if curve == 0:
    assert found == pytest.approx(per_item * 2**30, rel=1e-6)
  if curve == 0 and refuse_over is None:
    # A line: the start, one compile to fit it, and the two around the answer.
    assert len(compiled) <= (4 if hint in (None, 1.0) else 5), compiled  # A wrong hint: +1.
    if hint == 1.0:  # The right memory per sequence: the start and the two around the answer.
      assert len(compiled) == 3, compiled


def test_packed_search_counts_rows_and_compiles_whole_examples(monkeypatch):
  """With data.packing the search's per-device batch is packed rows, each
  compile gets rows x packing_factor examples, and its resolution keeps that
  a whole number."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bertjax.fit import aot, max_batch  # pylint: disable=g-import-not-at-top
  asked = []

  def fake_compile(config, topology, phase_name, global_batch_size, vocab_size=30522,
                   num_slices=1, available_bytes=None):
    rows = round(global_batch_size / float(config.data.packing_factor))
    # A whole number of rows, as run_config.validate requires.
    assert abs(global_batch_size / float(config.data.packing_factor) - rows) < 1e-9
    asked.append((rows // 8, global_batch_size))
    gib = 1.0 + 0.05 * rows / 8  # Memory grows with the rows, not the examples.
    return aot.AotResult(
        topology=topology, devices=8, chips=8, device_kind="TPU v5 lite", mesh={"data": 8},
        phase=phase_name, global_batch_size=global_batch_size, seq_len=128,
        attention="splash", compile_seconds=1.0, argument_bytes=0,
        temp_bytes=int(gib * 2**30), unaliased_output_bytes=0, compiled_flops=None,
        analytic_flops=1.0, xla_view_flops=1.0, hbm_bytes=16 * 2**30)

  monkeypatch.setattr(aot, "aot_compile", fake_compile)
  monkeypatch.setattr(max_batch, "num_devices", lambda topology, num_slices=1: 8)
  for factor, step in ((1.25, 8), (2.0, 8), (1.1, 40)):
    config = lambda: ml_collections.ConfigDict(  # pylint: disable=cell-var-from-loop
        {"mesh": {"data": -1, "fsdp": 1, "tensor": 1},
         "data": {"packing": True, "packing_factor": factor}})
    assert max_batch.search_step(config()) == step
    asked.clear()
    best, result, per_row = max_batch.find_max_batch(config, "v5e:2x4", "seq128", 32,
                                                     log=lambda m: None)
    fits = lambda n: 1.0 + 0.05 * n <= 16.0
    assert best % step == 0 and fits(best) and not fits(best + step), (factor, best)
    assert result.global_batch_size == round(best * 8 * factor)
    assert per_row == pytest.approx(0.05 * 2**30, rel=1e-6)
    assert all(examples == round(rows * 8 * factor) for rows, examples in asked)
  unpacked = ml_collections.ConfigDict({"data": {"packing": False, "packing_factor": 1.1}})
  assert max_batch.search_step(unpacked) == max_batch.BATCH_STEP
  assert max_batch.examples_for_rows(unpacked, 24) == 24


@pytest.mark.parametrize("start,guess,compiles", [
    (8, 296, 2),  # The answer: it and the next step.
    (8, 304, 2),  # One step high: it and the answer.
    (296, 296, 1),  # The row compiled at the answer: only the next step.
    (304, 304, 1),  # The row compiled one step high: only the answer.
    (8, 8, None),  # The start itself: its neighbour, then the line.
    (8, 160, None),  # Far low or far high (the compiler stops the largest): the line and
    (8, 600, None),  # the bracket find it.
])
def test_find_max_batch_from_a_guess_on_several_slices(monkeypatch, start, guess, compiles):
  from bertjax.fit import aot, max_batch  # pylint: disable=g-import-not-at-top
  compiled = []
  gib_at = lambda n: 1.0 + 0.05 * n  # Fits up to 300 sequences per device: the answer is 296.
  fake_compile = _fake_aot_compile(compiled, gib_at, 16.0, refuse_over=20.0, slices=4)
  monkeypatch.setattr(aot, "aot_compile", fake_compile)
  monkeypatch.setattr(max_batch, "num_devices", lambda topology, num_slices=1: 8)
  config = lambda: __import__("ml_collections").ConfigDict(
      {"mesh": {"data": -1, "fsdp": 1, "tensor": 1, "dcn_data": -1, "dcn_fsdp": 1,
                "dcn_tensor": 1}})
  known = fake_compile(None, "v5e:16x16", "seq128", start * 8, num_slices=4)  # The row's own.
  best, result, _ = max_batch.find_max_batch(
      config, "v5e:16x16", "seq128", start, log=lambda m: None, known=known, num_slices=4,
      vocab_size=6000, guess=guess)
  assert best == 296 and result.global_batch_size == 296 * 8 and result.num_slices == 4
  assert 296 in compiled and 304 in compiled  # Both sides of the answer were compiled.
  assert compiled.count(start) == 1  # The row's compile is not repeated.
  if compiles is not None:
    assert len(compiled) == 1 + compiles, compiled
