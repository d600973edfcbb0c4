"""Measures the steady-state train step on synthetic data.

  python -m bertjax.benchmarks.step_bench --config=configs/base.py --phase=seq128 --steps=20

prints compile time, step time, sequences/s, tokens/s and utilisation (MFU
from the analytic model FLOPs, HFU from XLA's count where it is complete; with
--compile_cache_dir the compile is loaded from that cache when it holds the
step). On a device that reports how much memory a program may use (a GPU), a
step whose compiled program needs more, by XLA's memory analysis, stops with
the config fields to change before it runs. The model, optimizer and mesh
are bertjax/train/step_setup.py's, as the fit check's (`python -m
bertjax.fit`, which compiles the step ahead of time for a TPU slice without
running it). The timed run has no packed synthetic data and refuses
packing."""

# glibc reads its malloc tunables at start-up: on the CPU, this program's own
# command line re-executes itself once with them, before the imports below
# with BERTJAX_HOST_MALLOC=tuned, or once the model is known for a large one
# (auto, the default; bertjax/records/hostmem.py); imported from Python it
# does not.
from bertjax.records import hostmem  # pylint: disable=g-bad-import-order
hostmem.reexec_for_cpu("bertjax.benchmarks.step_bench")

import time

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from bertjax.input import device as device_lib
from bertjax.input.synthetic import SyntheticSource
from bertjax.train import cli
from bertjax.train import flops
from bertjax.train import profiling
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib
from bertjax.train import step_setup

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file.",
                                          lock_config=True)
_PHASE = flags.DEFINE_string("phase", "", "Phase to measure (default: the first).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps after the warm-up.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
_VOCAB = flags.DEFINE_integer("vocab_size", 30522, "Vocab size when config.model.vocab_size is 0.")
_CACHE = flags.DEFINE_string(
    "compile_cache_dir", "", "Persistent compilation cache directory; a second run with "
    "the same config loads the step from it.")


def run_benchmark(config):
  if config.data.get("packing", False):
    raise app.UsageError(
        "--config.data.packing=True: the timed run has unpacked synthetic batches only; check "
        "the packed step's fit with python -m bertjax.fit, or time it on records with "
        "python -m bertjax.benchmarks.packing_bench")
  devices = jax.devices()
  model_config, phase, mesh, rules, model, tx = step_setup.build(
      config, devices, phase_name=_PHASE.value, vocab_size=_VOCAB.value)
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
  source = SyntheticSource(phase.global_batch_size, max_seq_length=phase.max_seq_length,
                           max_predictions_per_seq=phase.max_predictions_per_seq,
                           vocab_size=model_config.vocab_size, seed=0,
                           process_index=jax.process_index(),
                           process_count=jax.process_count())
  batch = device_lib.to_global(source.batch(0), sharding_lib.batch_sharding(mesh))
  rng = jax.random.key(1)
  with sharding_lib.mesh_context(mesh, rules):
    t0 = time.perf_counter()
    step_fn = step_lib.jit_train_step(
        shardings, mesh, objective=config.objective,
        grad_accum_steps=config.optimizer.grad_accum_steps)
    step_fn = step_fn.lower(state, batch, rng).compile()
    compile_s = time.perf_counter() - t0
    problem = step_setup.device_memory_problem(
        step_fn.memory_analysis(), (devices[0].memory_stats() or {}).get("bytes_limit"),
        devices[0].device_kind, phase.name, devices[0].platform)
    if problem:  # Said before the run fails for lack of memory.
      raise SystemExit(f"Does not fit: {problem}.")
    for _ in range(_WARMUP.value):
      state, metrics = step_fn(state, batch, rng)
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for _ in range(_STEPS.value):
      state, metrics = step_fn(state, batch, rng)
    jax.block_until_ready(metrics)
    seconds = (time.perf_counter() - t0) / _STEPS.value
  seqs = phase.global_batch_size / seconds
  peak = config.logging.peak_tflops or flops.peak_tflops(devices[0].device_kind)
  util = profiling.utilisation(
      step_seconds=seconds, num_chips=len(devices), peak_tflops_per_chip=peak,
      model_config=model_config, seq_len=phase.max_seq_length,
      num_predictions=phase.max_predictions_per_seq,
      global_batch_size=phase.global_batch_size,
      compiled_step_flops=profiling.whole_step_flops(step_fn),
      grad_accum_steps=config.optimizer.grad_accum_steps)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  print(f"devices         {len(devices)} x {devices[0].device_kind}, mesh {dict(mesh.shape)}")
  print(f"model           {n_params / 1e6:.1f}M parameters, dtype {model_config.dtype}, "
        f"remat {model_config.remat_policy}, attention_impl {model_config.attention_impl}")
  print(f"phase           {phase.name}: batch {phase.global_batch_size} x "
        f"{phase.max_seq_length}, {phase.max_predictions_per_seq} predictions")
  print(f"compile time    {compile_s:.1f} s")
  print(f"step time       {seconds * 1e3:.1f} ms (mean of {_STEPS.value})")
  print(f"sequences/s     {seqs:.1f}")
  print(f"tokens/s        {seqs * phase.max_seq_length:.0f}")
  print(f"model TFLOP/s   {flops.train_flops_per_sequence(model_config, phase.max_seq_length, phase.max_predictions_per_seq) * seqs / 1e12:.2f}")
  mfu_text = hfu_text = "n/a (unknown peak for this device)"
  if util:
    mfu_text = f"{100 * util['mfu']:.1f}% (analytic model FLOPs)"
    hfu_text = (f"{100 * util['hfu']:.1f}% (XLA's hardware FLOPs)" if "hfu" in util
                else "n/a (no XLA count of the whole step: it has loops, or the "
                "backend gives no cost analysis)")
  print(f"MFU             {mfu_text}")
  print(f"HFU             {hfu_text}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config=configs/base.py")
  hostmem.reexec_for_model("bertjax.benchmarks.step_bench", _CONFIG.value.model.hidden_size)
  print(hostmem.describe())
  if _CACHE.value:
    profiling.enable_compilation_cache(_CACHE.value)
  run_benchmark(_CONFIG.value)


if __name__ == "__main__":
  cli.run(main)
