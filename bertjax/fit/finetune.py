"""Whether a fine-tuning step fits: an ahead-of-time compile of the task's train step
(the one bertjax.finetune runs) at the config's global batch and length, for a TPU
topology on this machine (libtpu, JAX_PLATFORMS=cpu) or for this machine's devices.

`compile_step` returns the memory XLA's analysis says one device needs
(arguments, temporaries, outputs not aliased to the donated state) beside the
memory a program may use on one (topology.available_bytes); a compile that
libtpu stops for lack of HBM gives the temporaries its message names. Reads
no data. `python -m bertjax.fit --config=configs/finetune/squad.py ...` runs it.
"""

import dataclasses
import re
import time

import jax
import numpy as np

from bertjax.fit import topology as topology_lib
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
                 vocab_size: int = 30522, available_bytes: int | None = None) -> FitResult:
  """Compiles the fine-tuning train step of `config` for `topology` ("": this
  machine's devices), without data; `available_bytes` as in aot.aot_compile."""
  task = registry.get_task(config.task)
  if task.configure is not None:
    task.configure(config)
  config.optimizer.grad_accum_steps = grad_accum_steps
  devices = topology_lib.devices(topology)
  available = available_bytes or topology_lib.available_bytes(topology)
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
      if not topology_lib.is_out_of_memory(e):
        raise
      # The compiler stops at the first limit it finds: the temporaries it names
      # (when it names them) are the figure; the arguments are not counted.
      return FitResult(grad_accum_steps, config.global_batch_size, config.max_seq_length,
                       time.perf_counter() - t0, 0, _temporaries_of(str(e)), 0,
                       available, out_of_memory=str(e))
    seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  return FitResult(grad_accum_steps, config.global_batch_size, config.max_seq_length,
                   seconds, mem.argument_size_in_bytes, mem.temp_size_in_bytes,
                   mem.output_size_in_bytes - mem.alias_size_in_bytes, available)
