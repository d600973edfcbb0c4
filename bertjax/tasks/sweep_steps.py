"""What a fine-tuning run is built from: the compiled steps that every run of a sweep
shares (SweepSteps), and a run's starting state (its checkpoint, init_from's encoder or a
fresh init) with its own peak learning rate."""

import dataclasses
from typing import Any

import jax
import ml_collections
import optax
from absl import logging

from bertjax.model.config import BertConfig
from bertjax.tasks import batches as batches_lib
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.train import optimizer as opt_lib
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib


def unit_schedule(config, num_steps: int) -> optax.Schedule:
  """The learning-rate schedule with a peak of 1 (the run's peak multiplies it)."""
  opt = ml_collections.ConfigDict(config.optimizer.to_dict())
  opt.learning_rate = 1.0
  opt.warmup_steps = int(round(config.warmup_proportion * num_steps))
  opt.end_learning_rate = 0.0
  opt.per_phase_warmup = False
  return opt_lib.learning_rate_schedule(opt, num_steps, [0, num_steps], [0])


@dataclasses.dataclass(frozen=True)
class SweepSteps:
  """What the runs of a sweep share besides the data: the step count, the model, the
  optimizer (its peak learning rate is in the state) and the jitted steps, so that
  every run calls the same compiled train and predict steps."""
  num_steps: int
  unit_schedule: optax.Schedule
  model: Any
  init: Any
  tx: optax.GradientTransformation
  mesh: jax.sharding.Mesh
  rules: Any
  p_train: Any
  p_predict: Any


def build_sweep_steps(config: ml_collections.ConfigDict, prepared) -> SweepSteps:
  """The SweepSteps of runs of `config` on `prepared`'s data (loop.Prepared), for any
  learning rate and seed."""
  _check_run_fields(config)
  num_steps = max(1, batches_lib.train_steps(len(prepared.train), config.global_batch_size,
                                             config.num_epochs))
  schedule = unit_schedule(config, num_steps)
  tx = opt_lib.make_optimizer_with_runtime_peak(config.optimizer, schedule,
                                                 frozen=prepared.task.frozen)
  mesh = sharding_lib.make_mesh(config.mesh)
  rules = sharding_lib.rules(config.mesh)
  accum = config.optimizer.grad_accum_steps
  dp = sharding_lib.data_parallel_size(mesh)
  if config.global_batch_size % (dp * accum):
    raise ValueError(f"--config.global_batch_size={config.global_batch_size} is not "
                     f"divisible by optimizer.grad_accum_steps={accum} x the {dp} "
                     "data-parallel devices (mesh.data x mesh.fsdp)")
  model = registry.model_for(prepared.task, prepared.model_config, config)
  init = registry.init_fn(prepared.task, config.max_seq_length)
  _, shardings = state_lib.abstract_train_state(model, tx, mesh, rules, init)
  p_train, p_predict = step_lib.jit_steps(shardings, mesh, prepared.task.kind, accum)
  return SweepSteps(num_steps, schedule, model, init, tx, mesh, rules, p_train, p_predict)


def _check_run_fields(config):
  """The fields of the run's accumulation, evaluations and early stopping."""
  if config.optimizer.grad_accum_steps < 1:
    raise ValueError("--config.optimizer.grad_accum_steps: must be at least 1, got "
                     f"{config.optimizer.grad_accum_steps}")
  if config.eval_every_steps < 0:
    raise ValueError("--config.eval_every_steps: must be 0 (only at the end) or positive, "
                     f"got {config.eval_every_steps}")
  if config.early_stopping_patience < 0:
    raise ValueError("--config.early_stopping_patience: must be 0 (off) or positive, got "
                     f"{config.early_stopping_patience}")
  if config.early_stopping_patience and not config.eval_every_steps:
    raise ValueError("--config.early_stopping_patience counts dev evaluations during "
                     "training: set --config.eval_every_steps too")


def initial_state(config, model_config: BertConfig, steps: SweepSteps, checkpointer,
                  weights_loader):
  """(state with the run's peak learning rate, meta of the resumed checkpoint or None)."""
  rng = jax.random.key(config.seed)
  model, init, mesh, rules = steps.model, steps.init, steps.mesh, steps.rules
  abstract, shardings = state_lib.abstract_train_state(model, steps.tx, mesh, rules, init)
  latest = checkpointer.latest_step()
  meta = None
  if latest is not None:
    state, meta = checkpointer.restore(abstract, shardings, latest)
    logging.info("Resumed fine-tuning from step %d.", latest)
  else:
    params = None
    if config.init_from:
      if weights_loader is None:
        raise ValueError("--config.init_from: pass a weights_loader, e.g. "
                         "bertjax.convert.weights.load_weights as bertjax.finetune does")
      encoder = weights_loader(config.init_from, abstract.params["bert"], model_config)
      fresh = jax.jit(lambda r: jax.tree.map(
          lambda x: x.unbox() if hasattr(x, "unbox") else x, init(model, r),
          is_leaf=lambda x: hasattr(x, "unbox")), out_shardings=shardings.params)(rng)
      params = dict(fresh, bert=encoder)
      logging.info("Encoder from %s; %s head freshly initialised.", config.init_from,
                   "/".join(k for k in fresh if k != "bert"))
    state, _ = state_lib.create_train_state(model, steps.tx, mesh, rules, rng,
                                            params=params, init=init)
  opt_state = opt_lib.set_peak_learning_rate(state.opt_state,
                                             config.optimizer.learning_rate)
  return state.replace(opt_state=opt_state), meta
