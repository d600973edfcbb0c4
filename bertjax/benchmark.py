"""Measures the steady-state train step on synthetic data, or compiles it for a TPU slice.

  python -m bertjax.benchmark --config=configs/base.py --phase=seq128 --steps=20

prints compile time, step time, sequences/s, tokens/s and MFU. With
--topology (e.g. v5e:2x2, v4:2x2x1) it instead compiles the step ahead of
time for that TPU slice on this machine (needs `pip install jax[tpu]` and
JAX_PLATFORMS=cpu) and prints the per-chip memory the program needs, which
proves that it compiles and fits before any TPU is booked.
"""

import time

from absl import app
from absl import flags
import jax
import numpy as np
from ml_collections import config_flags

from bertjax.input.synthetic import SyntheticSource
from bertjax.model.bert import BertForPreTraining
from bertjax.records import schema
from bertjax.train import flops
from bertjax.train import optimizer as opt_lib
from bertjax.train import run_config
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file.",
                                          lock_config=True)
_PHASE = flags.DEFINE_string("phase", "", "Phase to measure (default: the first).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps after the warm-up.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
_TOPOLOGY = flags.DEFINE_string("topology", "", "Compile ahead of time for this TPU "
                                "topology (e.g. v5e:2x2) instead of running.")
_VOCAB = flags.DEFINE_integer("vocab_size", 30522, "Vocab size when config.model.vocab_size is 0.")


def build(config, devices, *, phase_name: str = "", vocab_size: int = 30522,
          device_mesh: bool = False):
  """(model config, phase, mesh, rules, model, optimizer) for a run config on `devices`.

  The benchmark reads no files: the data source becomes synthetic. With
  `device_mesh` the devices are laid out in the given order (topology
  devices have no physical layout to optimise for).
  """
  config.data.source = "synthetic"
  config.data.demo_dir = ""
  vocab = config.model.vocab_size or vocab_size
  model_config = run_config.validate(config, num_devices=len(devices), vocab_size=vocab)
  plan = run_config.phases(config)
  phase = next((p for p in plan if p.name == phase_name), None) if phase_name else plan[0]
  if phase is None:
    raise app.UsageError(f"--phase={phase_name}: not one of {[p.name for p in plan]}")
  mesh = jax.sharding.Mesh(
      np.asarray(devices).reshape(sharding_lib.mesh_shape(config.mesh, len(devices))),
      sharding_lib.MESH_AXES) if device_mesh else sharding_lib.make_mesh(config.mesh, devices)
  rules = sharding_lib.rules(config.mesh)
  schedule = opt_lib.learning_rate_schedule(
      config.optimizer, config.total_steps, [p.start for p in plan] + [plan[-1].end],
      [p.warmup_steps for p in plan])
  tx = opt_lib.make_optimizer(config.optimizer, schedule)
  return model_config, phase, mesh, rules, BertForPreTraining(model_config), tx


def _setup(config, devices):
  return build(config, devices, phase_name=_PHASE.value, vocab_size=_VOCAB.value,
               device_mesh=bool(_TOPOLOGY.value))


def _gib(n):
  return f"{n / 2**30:.2f} GiB"


def compile_for_topology(config):
  """Ahead-of-time compile for a TPU slice; prints per-chip memory."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  topo = topologies.get_topology_desc(platform="tpu", topology_name=_TOPOLOGY.value)
  devices = topo.devices
  model_config, phase, mesh, rules, model, tx = _setup(config, devices)
  with sharding_lib.mesh_context(mesh, rules):
    abstract_state, shardings = state_lib.abstract_train_state(model, tx, mesh, rules)
    batch_s = sharding_lib.batch_sharding(mesh)
    batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_s) for k, (shape, dtype)
             in schema.batch_shapes(phase.global_batch_size, phase.max_seq_length,
                                              phase.max_predictions_per_seq).items()}
    rng = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                               sharding=sharding_lib.replicated(mesh))
    t0 = time.perf_counter()
    step_fn = step_lib.jit_train_step(
        shardings, mesh, grad_accum_steps=config.optimizer.grad_accum_steps)
    compiled = step_fn.lower(abstract_state, batch, rng).compile()
    seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  print(f"topology        {_TOPOLOGY.value} ({len(devices)} chips, {devices[0].device_kind})")
  print(f"mesh            {dict(mesh.shape)}")
  print(f"phase           {phase.name}: batch {phase.global_batch_size} x {phase.max_seq_length}")
  print(f"compile time    {seconds:.1f} s")
  if mem is not None:
    total = (mem.argument_size_in_bytes + mem.output_size_in_bytes
             - mem.alias_size_in_bytes + mem.temp_size_in_bytes)
    print(f"per chip        arguments {_gib(mem.argument_size_in_bytes)}, "
          f"temporaries {_gib(mem.temp_size_in_bytes)}, "
          f"outputs not aliased {_gib(mem.output_size_in_bytes - mem.alias_size_in_bytes)}")
    print(f"per chip total  {_gib(total)}")


def run_benchmark(config):
  devices = jax.devices()
  model_config, phase, mesh, rules, model, tx = _setup(config, devices)
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
  source = SyntheticSource(phase.global_batch_size, max_seq_length=phase.max_seq_length,
                           max_predictions_per_seq=phase.max_predictions_per_seq,
                           vocab_size=model_config.vocab_size, seed=0,
                           process_index=jax.process_index(),
                           process_count=jax.process_count())
  batch_s = sharding_lib.batch_sharding(mesh)
  batch = {k: jax.make_array_from_process_local_data(batch_s, v)
           for k, v in source.batch(0).items()}
  rng = jax.random.key(1)
  with sharding_lib.mesh_context(mesh, rules):
    t0 = time.perf_counter()
    step_fn = step_lib.jit_train_step(
        shardings, mesh, grad_accum_steps=config.optimizer.grad_accum_steps)
    step_fn = step_fn.lower(state, batch, rng).compile()
    compile_s = time.perf_counter() - t0
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
  util = flops.mfu(model_config, phase.max_seq_length, phase.max_predictions_per_seq,
                   seqs, len(devices), peak)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  print(f"devices         {len(devices)} x {devices[0].device_kind}, mesh {dict(mesh.shape)}")
  print(f"model           {n_params / 1e6:.1f}M parameters, dtype {model_config.dtype}, "
        f"remat {model_config.remat_policy}, attention {model_config.attention_impl}")
  print(f"phase           {phase.name}: batch {phase.global_batch_size} x "
        f"{phase.max_seq_length}, {phase.max_predictions_per_seq} predictions")
  print(f"compile time    {compile_s:.1f} s")
  print(f"step time       {seconds * 1e3:.1f} ms (mean of {_STEPS.value})")
  print(f"sequences/s     {seqs:.1f}")
  print(f"tokens/s        {seqs * phase.max_seq_length:.0f}")
  print(f"model TFLOP/s   {flops.train_flops_per_sequence(model_config, phase.max_seq_length, phase.max_predictions_per_seq) * seqs / 1e12:.2f}")
  print(f"MFU             {f'{100 * util:.1f}%' if util is not None else 'n/a (unknown peak for this device)'}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config=configs/base.py")
  if _TOPOLOGY.value:
    compile_for_topology(_CONFIG.value)
  else:
    run_benchmark(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
