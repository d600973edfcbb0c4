"""The train step of a run config on given devices, without data: what the step
benchmarks and the fit check build alike.

`build` gives the model config, phase, mesh, rules, model and optimizer
(the data source becomes synthetic: nothing is read), `batch_specs` the
phase's global batch as abstract arrays (packed rows where data.packing is
on), and `device_memory_problem` says why a compiled step cannot run on its
device, from XLA's memory analysis, with the fields to change.
"""

from absl import app
import jax

from bertjax.model.bert import BertForPreTraining
from bertjax.train import optimizer as opt_lib
from bertjax.train import run_config
from bertjax.train import sharding as sharding_lib


def build(config, devices, *, phase_name: str = "", vocab_size: int = 30522,
          device_mesh: bool = False, compile_only: bool = False):
  """(model config, phase, mesh, rules, model, optimizer) for a run config on `devices`;
  the model config and model are the phase's (its remat_policy).

  `compile_only`: the step is compiled, never run, so the config may pack
  (run_config.validate). With `device_mesh` the devices are laid out in the
  given order within each slice (topology devices have no physical layout
  to optimise for).
  """
  config.data.source = "synthetic"
  config.data.demo_dir = ""
  vocab = config.model.vocab_size or vocab_size
  slices, _ = sharding_lib.device_slices(devices, config.mesh)
  model_config = run_config.validate(config, num_devices=len(devices), vocab_size=vocab,
                                     num_slices=len(slices), compile_only=compile_only)
  plan = run_config.phases(config)
  phase = next((p for p in plan if p.name == phase_name), None) if phase_name else plan[0]
  if phase is None:
    raise app.UsageError(f"--phase={phase_name}: not one of {[p.name for p in plan]}")
  mesh = jax.sharding.Mesh(
      sharding_lib.listed_device_array(
          slices, *sharding_lib.hybrid_mesh_shape(config.mesh, len(devices), len(slices))),
      sharding_lib.MESH_AXES) if device_mesh else sharding_lib.make_mesh(config.mesh, devices)
  rules = sharding_lib.rules(config.mesh)
  schedule = opt_lib.learning_rate_schedule(
      config.optimizer, config.total_steps, [p.start for p in plan] + [plan[-1].end],
      [p.warmup_steps for p in plan])
  tx = opt_lib.make_optimizer(config.optimizer, schedule)
  model_config = phase.model_config(model_config)  # The phase's remat policy.
  return model_config, phase, mesh, rules, BertForPreTraining(model_config), tx


def batch_specs(config, phase: run_config.Phase, sharding) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batch of `phase` as the input pipeline yields it, as abstract
  arrays: packed rows and fields where data.packing is on."""
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
          for k, (shape, dtype) in run_config.batch_shapes(config, phase).items()}


def gib(n) -> str:
  return f"{n / 2**30:.2f} GiB"


def needed_bytes(mem) -> int:
  """What a compiled program needs on its device, by XLA's memory analysis
  (`compiled.memory_analysis()`): arguments, temporaries and the outputs not
  aliased to donated arguments."""
  return (mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes
          - mem.alias_size_in_bytes)


def ways_to_fit(phase: str, platform: str = "") -> str:
  """The run config's fields that make a pretraining step of `phase` need less memory."""
  return ("split each step's batch with --config.optimizer.grad_accum_steps=2 (or more), "
          "rematerialise more with --config.model.remat_policy, lower --config.phases."
          f"{phase}.global_batch_size, or run on more devices"
          + ("; JAX takes XLA_PYTHON_CLIENT_MEM_FRACTION of a GPU's memory (0.75 unless "
             "set)" if platform == "gpu" else ""))


def device_memory_problem(mem, bytes_limit: int | None, device_kind: str,
                          phase: str, platform: str = "") -> str | None:
  """Why a compiled step cannot run on its device, from XLA's memory analysis
  (`compiled.memory_analysis()`) and the device's `bytes_limit` (its
  `memory_stats()`; None where the backend gives none); None if it fits."""
  needed = needed_bytes(mem)
  if not bytes_limit or needed <= bytes_limit:
    return None
  return (f"the {phase} train step needs {gib(needed)} per device (arguments "
          f"{gib(mem.argument_size_in_bytes)}, temporaries {gib(mem.temp_size_in_bytes)}) and "
          f"one {device_kind} lets it use {gib(bytes_limit)}: {ways_to_fit(phase, platform)}")
