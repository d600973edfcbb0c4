"""Whether a fine-tuning step fits a TPU chip: an ahead-of-time compile of the task's
train step (the one bertjax.finetune runs) for a TPU topology on this machine.

  ALLOW_MULTIPLE_LIBTPU_LOAD=1 JAX_PLATFORMS=cpu python -m bertjax.benchmarks.finetune_fit \
      --config=configs/finetune/squad.py --config.version=2.0 --large \
      --topology=v5e:1x1 --grad_accum_steps=1,4

compiles the step once per --grad_accum_steps value at the config's global batch
(SQuAD v2.0: the paper's 48) and length, and prints the memory XLA's analysis
says one device needs (arguments, temporaries, outputs not aliased to the
donated state) against the HBM the compiler lets a program use on a device of
that topology (tpu_topology.available_hbm_bytes). Needs libtpu
(`pip install "jax[tpu]"`); reads no data.
"""

import dataclasses
import re
import time
from typing import Any

from absl import app
from absl import flags
import jax
import numpy as np
from ml_collections import config_flags

from bertjax.benchmarks import tpu_topology
from bertjax.model.config import BertConfig
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.tasks import sweep_steps
from bertjax.train import optimizer as opt_lib
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib

LARGE = dict(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096)


@dataclasses.dataclass
class FitResult:
  """Bytes one device needs for the compiled step, and what it may use."""
  grad_accum_steps: int
  global_batch_size: int
  max_seq_length: int
  compile_seconds: float
  argument_bytes: int
  temp_bytes: int
  unaliased_output_bytes: int
  hbm_bytes: int | None  # Available to a program on one device; None: unknown.
  out_of_memory: str = ""  # libtpu's message when the compile ran out of HBM.

  @property
  def total_bytes(self) -> int:
    return self.argument_bytes + self.temp_bytes + self.unaliased_output_bytes

  @property
  def fits(self) -> bool | None:
    if self.out_of_memory:
      return False
    return None if self.hbm_bytes is None else self.total_bytes <= self.hbm_bytes


# libtpu's message when the temporaries alone are too many: "... the total memory
# required for HLO temporaries (29.86G) exceeds available HBM (15.75G)."
_TEMPORARIES = re.compile(r"required for HLO temporaries \((?P<n>[0-9.]+)G\)")


def _temporaries_of(message: str) -> int:
  """Bytes of temporaries named by a libtpu out-of-memory message (0: none named)."""
  match = _TEMPORARIES.search(message)
  return int(float(match["n"]) * 2**30) if match else 0


def model_config_of(config, vocab_size: int) -> BertConfig:
  fields = dict(config.model)
  fields["vocab_size"] = fields.get("vocab_size") or vocab_size
  return BertConfig.from_mapping(fields)


def compile_step(config, topology: str, grad_accum_steps: int,
                 vocab_size: int = 30522) -> FitResult:
  """Compiles the fine-tuning train step of `config` for `topology`, without data."""
  task = registry.get_task(config.task)
  if task.configure is not None:
    task.configure(config)
  config.optimizer.grad_accum_steps = grad_accum_steps
  devices = tpu_topology.topology_devices(topology)
  mesh = jax.sharding.Mesh(
      np.asarray(devices).reshape(sharding_lib.mesh_shape(config.mesh, len(devices))),
      sharding_lib.MESH_AXES)
  rules = sharding_lib.rules(config.mesh)
  model = registry.model_for(task, model_config_of(config, vocab_size))
  tx = opt_lib.make_optimizer_with_runtime_peak(config.optimizer,
                                                sweep_steps.unit_schedule(config, 1000))
  init = registry.init_fn(task, config.max_seq_length)
  with sharding_lib.mesh_context(mesh, rules):
    abstract, shardings = state_lib.abstract_train_state(model, tx, mesh, rules, init)
    batch_s = sharding_lib.batch_sharding(mesh)
    batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_s)
             for k, (shape, dtype) in step_lib.batch_shapes(
                 task.kind, config.global_batch_size, config.max_seq_length,
                 task.num_choices).items()}
    rng = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                               sharding=sharding_lib.replicated(mesh))
    p_train, _ = step_lib.jit_steps(shardings, mesh, task.kind, grad_accum_steps)
    t0 = time.perf_counter()
    try:
      compiled = p_train.lower(abstract, batch, rng).compile()
    except jax.errors.JaxRuntimeError as e:
      if not tpu_topology.is_out_of_memory(e):
        raise
      # The compiler stops at the first limit it finds: the temporaries it names
      # (when it names them) are the figure; the arguments are not counted.
      return FitResult(grad_accum_steps, config.global_batch_size, config.max_seq_length,
                       time.perf_counter() - t0, 0, _temporaries_of(str(e)), 0,
                       tpu_topology.available_hbm_bytes(topology), out_of_memory=str(e))
    seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  return FitResult(grad_accum_steps, config.global_batch_size, config.max_seq_length,
                   seconds, mem.argument_size_in_bytes, mem.temp_size_in_bytes,
                   mem.output_size_in_bytes - mem.alias_size_in_bytes,
                   tpu_topology.available_hbm_bytes(topology))


def _gib(n) -> str:
  return "unknown" if n is None else f"{n / 2**30:.2f} GiB"


def define_flags() -> dict[str, Any]:
  """The command line's flags (defined only when run as a program, so that importing
  this module beside bertjax.benchmarks.step_bench defines no flag twice)."""
  return {
      "config": config_flags.DEFINE_config_file("config", None, "Fine-tuning config file.",
                                                lock_config=True),
      "topology": flags.DEFINE_string("topology", "v5e:1x1", "TPU topology to compile for."),
      "grad_accum_steps": flags.DEFINE_list("grad_accum_steps", ["1"],
                                            "Compile once per value."),
      "large": flags.DEFINE_bool("large", False, "BERT-LARGE's sizes (L=24, H=1024, A=16, "
                                 "F=4096) instead of the config's."),
      "vocab_size": flags.DEFINE_integer("vocab_size", 30522, "Vocab size when "
                                         "config.model.vocab_size is 0 (the uncased "
                                         "release's)."),
  }


def main(argv, flag_values: dict[str, Any]):
  _CONFIG, _TOPOLOGY, _ACCUM, _LARGE, _VOCAB = (  # pylint: disable=invalid-name
      flag_values[k] for k in ("config", "topology", "grad_accum_steps", "large",
                               "vocab_size"))
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config: give a fine-tuning config, e.g. configs/finetune/squad.py")
  if _LARGE.value:
    config.unlock()
    config.model.update(LARGE)
  for accum in (int(a) for a in _ACCUM.value):
    r = compile_step(config.copy_and_resolve_references(), _TOPOLOGY.value, accum,
                     _VOCAB.value)
    if r.out_of_memory:
      print(f"{config.task} {_TOPOLOGY.value} L={config.model.num_layers} "
            f"H={config.model.hidden_size} batch {r.global_batch_size} length "
            f"{r.max_seq_length} grad_accum_steps {accum}: does not fit; temporaries alone "
            f"{_gib(r.temp_bytes)} of {_gib(r.hbm_bytes)} available "
            f"(libtpu: {r.out_of_memory.splitlines()[0][:200]})", flush=True)
      continue
    print(f"{config.task} {_TOPOLOGY.value} L={config.model.num_layers} "
          f"H={config.model.hidden_size} batch {r.global_batch_size} length "
          f"{r.max_seq_length} grad_accum_steps {accum}: {_gib(r.total_bytes)} per device "
          f"(arguments {_gib(r.argument_bytes)}, temporaries {_gib(r.temp_bytes)}, "
          f"outputs {_gib(r.unaliased_output_bytes)}) of {_gib(r.hbm_bytes)} available: "
          f"{'fits' if r.fits else 'does not fit' if r.fits is False else 'unknown'} "
          f"(compile {r.compile_seconds:.0f} s)", flush=True)


if __name__ == "__main__":
  _flags = define_flags()
  app.run(lambda argv: main(argv, _flags))
