"""The optimizer: AdamW or LAMB, the learning-rate schedule over all phases, clipping.

Weight decay is decoupled and never applied to LayerNorm parameters or
biases, as in the original release's AdamWeightDecayOptimizer. With
bias_correction=False the Adam moments are used as they are, which is
what that optimizer does; with schedule='original' the learning rate is
that release's too (see learning_rate_schedule). LAMB's layer-wise trust
ratio is likewise left out for LayerNorm parameters and biases (their step
is Adam's), as NVIDIA's and TF-Addons' LAMB leave them out, and it is taken
per layer: a scanned encoder's parameters stacked on a leading layer axis
get one ratio for each layer, as the unrolled encoder's do.
"""

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import optax


def phase_boundaries(total_steps: int, fractions: Sequence[float]) -> list[int]:
  """Start step of each phase plus total_steps at the end: [0, s1, ..., total]."""
  bounds, acc = [0], 0.0
  for f in fractions[:-1]:
    acc += f
    bounds.append(int(round(acc * total_steps)))
  bounds.append(total_steps)
  return bounds


SCHEDULES = ("linear", "original")


def learning_rate_schedule(opt_config, total_steps: int, bounds: Sequence[int],
                           phase_warmups: Sequence[int]) -> optax.Schedule:
  """The learning rate at each step, by opt_config.schedule:

  linear    warmup from 0 to the peak over W steps, then linear decay from
            the peak to end_learning_rate over the remaining T - W steps.
  original  the original release's optimization.py: the decay
            (peak - end) x (1 - t/T) + end runs from step 0, and for t < W
            the warmup peak x t/W replaces it; so after warmup the rate is
            below the peak (at t = W it is peak x (1 - W/T) for end 0).

  With per_phase_warmup each phase restarts from 0 with its own warmup and
  decays to end_learning_rate at the phase's end, in the same shape.
  """
  kind = opt_config.schedule
  if kind not in SCHEDULES:
    raise ValueError(f"optimizer.schedule: {kind!r} is not one of {SCHEDULES}")
  peak, end = opt_config.learning_rate, opt_config.end_learning_rate

  def warmup_decay(warmup, length):
    warmup = min(warmup, length)
    if kind == "original":
      decay = optax.linear_schedule(peak, end, max(length, 1))
      if not warmup:
        return decay
      return lambda t: jnp.where(t < warmup, peak * t / warmup, decay(t))
    parts = [optax.linear_schedule(0.0, peak, warmup)] if warmup else []
    parts.append(optax.linear_schedule(peak, end, max(length - warmup, 1)))
    return optax.join_schedules(parts, [warmup]) if warmup else parts[0]

  if not opt_config.per_phase_warmup:
    return warmup_decay(opt_config.warmup_steps, total_steps)
  schedules = [warmup_decay(w, b1 - b0)
               for w, b0, b1 in zip(phase_warmups, bounds[:-1], bounds[1:])]
  return optax.join_schedules(schedules, list(bounds[1:-1]))


def _path_names(path) -> list[str]:
  """The names along a pytree key path (dict keys, attribute names), without
  the `.value` of logical-partitioning boxes, so that boxed and plain
  parameter trees give the same names."""
  names = [getattr(k, "key", getattr(k, "name", str(k))) for k in path]
  return [n for n in names if n != "value"]


def decay_mask(params) -> Any:
  """True for the parameters that get weight decay: all but biases and LayerNorm."""
  def is_decayed(path, _):
    names = _path_names(path)
    leaf, parent = names[-1], (names[-2] if len(names) > 1 else "")
    return not (leaf in ("bias", "output_bias") or "layer_norm" in parent)
  return jax.tree_util.tree_map_with_path(is_decayed, params)


def stacked_layer_mask(params) -> Any:
  """True for parameters stacked on a leading layer axis (a scanned encoder's).

  nn.scan stores the encoder's layers under a module named 'layers' with
  the layer index first; the unrolled encoder names them layer_0, layer_1...
  """
  def is_stacked(path, _):
    return "layers" in _path_names(path)
  return jax.tree_util.tree_map_with_path(is_stacked, params)


def scale_by_layerwise_trust_ratio(stacked: Callable[[Any], Any] = stacked_layer_mask
                                   ) -> optax.GradientTransformation:
  """LAMB's trust ratio ||w|| / ||update||, one per layer.

  For a parameter that `stacked(params)` marks, both norms are taken over
  all axes but the leading layer axis, so each layer of a scanned encoder
  gets its own ratio; other parameters get one ratio each. A zero norm
  gives the ratio 1, as in optax.scale_by_trust_ratio.
  """
  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("LAMB's trust ratio needs the parameters")

    def scale(u, p, is_stacked):
      axes = tuple(range(1, u.ndim)) if is_stacked and u.ndim > 1 else None
      p_norm = jnp.sqrt(jnp.sum(jnp.square(p.astype(jnp.float32)), axis=axes, keepdims=True))
      u_norm = jnp.sqrt(jnp.sum(jnp.square(u.astype(jnp.float32)), axis=axes, keepdims=True))
      ratio = jnp.where((p_norm == 0) | (u_norm == 0), 1.0, p_norm / u_norm)
      return (u * ratio).astype(u.dtype)

    return jax.tree.map(scale, updates, params, stacked(params)), state

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_adam_no_bias_correction(b1: float, b2: float, eps: float):
  """Adam's update without bias correction (the original release's optimizer)."""
  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=jax.tree.map(zeros, params),
                                  nu=jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, optax.ScaleByAdamState(count=state.count + 1, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(opt_config, schedule: optax.Schedule,
                   frozen: Sequence[str] = ()) -> optax.GradientTransformation:
  """The optimizer chain named by opt_config.name. The parameters under the
  top-level keys in `frozen` get zero updates and no optimizer state (clipping,
  moments and weight decay see the others only)."""
  tx = _optimizer_chain(opt_config, schedule)
  return freeze(tx, frozen) if frozen else tx


def freeze(tx: optax.GradientTransformation, frozen: Sequence[str]
           ) -> optax.GradientTransformation:
  """`tx` on the parameters outside the top-level keys `frozen`; zero updates for those."""
  def trained(tree):
    return None if tree is None else {k: v for k, v in tree.items() if k not in frozen}

  def init_fn(params):
    return tx.init(trained(params))

  def update_fn(updates, state, params=None, **extra_args):
    # The step's gradient norm covers the frozen parameters too: clipping
    # takes its own over the trained ones.
    extra_args.pop("grad_norm", None)
    inner, state = optax.with_extra_args_support(tx).update(
        trained(updates), state, trained(params), **extra_args)
    return {k: jax.tree.map(jnp.zeros_like, v) if k in frozen else inner[k]
            for k, v in updates.items()}, state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _optimizer_chain(opt_config, schedule: optax.Schedule) -> optax.GradientTransformation:
  name = opt_config.name
  clip = [clip_by_global_norm(opt_config.clip_norm)] if opt_config.clip_norm > 0 else []
  if name == "adamw":
    if opt_config.bias_correction:
      adam = optax.scale_by_adam(b1=opt_config.b1, b2=opt_config.b2, eps=opt_config.eps)
    else:
      adam = scale_by_adam_no_bias_correction(opt_config.b1, opt_config.b2, opt_config.eps)
    core = [adam, optax.add_decayed_weights(opt_config.weight_decay, mask=decay_mask)]
  elif name == "lamb":
    core = [optax.scale_by_adam(b1=opt_config.b1, b2=opt_config.b2, eps=opt_config.eps),
            optax.add_decayed_weights(opt_config.weight_decay, mask=decay_mask),
            optax.masked(scale_by_layerwise_trust_ratio(), decay_mask)]
  else:
    raise ValueError(f"optimizer.name: {name!r} is not one of 'adamw', 'lamb'")
  return optax.chain(*clip, *core, scale_by_schedule_at_step(schedule))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
  """optax.clip_by_global_norm, reading the gradient's norm from the train step
  (`grad_norm=`, tx.update's extra argument) where it has taken it, so the
  norm is computed once a step; without it, it takes the norm itself. The
  same arithmetic as optax's: t where the norm is below max_norm, else
  t / norm * max_norm."""
  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None, *, grad_norm=None, **extra_args):
    del params, extra_args
    norm = optax.tree.norm(updates) if grad_norm is None else grad_norm
    trigger = jnp.squeeze(norm < max_norm)
    updates = jax.tree.map(
        lambda t: jax.lax.select(trigger, t, (t / norm.astype(t.dtype)) * max_norm), updates)
    return updates, state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def scale_by_schedule_at_step(schedule: optax.Schedule
                              ) -> optax.GradientTransformationExtraArgs:
  """Scales updates by -schedule(step), `step` being the train step's number.

  The train step passes `step=state.step` (tx.update(..., step=...)), so the
  learning rate is a function of the step alone: a step whose update is
  skipped (non-finite, step.apply_gradients) still moves the schedule on,
  the run ends at the schedule's end value at total_steps, and each phase's
  warmup starts at the phase's first step, where its data starts. (Adam's
  own count, which its bias correction reads, counts applied updates.)
  Called without `step`, it counts its own updates, as
  optax.scale_by_learning_rate does. The state is optax's
  ScaleByScheduleState, so checkpoints keep their layout.
  """
  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, *, step=None, **extra_args):
    del params, extra_args
    t = state.count if step is None else jnp.asarray(step, jnp.int32)
    scale = -schedule(t)
    updates = jax.tree.map(lambda u: jnp.asarray(scale, u.dtype) * u, updates)
    return updates, optax.ScaleByScheduleState(count=t + 1)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def latest_learning_rate(schedule: Callable[[int], Any], steps_done: int) -> float:
  """The learning rate of the latest step after `steps_done` steps: step
  steps_done - 1's, since scale_by_schedule_at_step reads the step's number."""
  return float(schedule(steps_done - 1))


def make_optimizer_with_runtime_peak(opt_config, unit_schedule: optax.Schedule,
                                     frozen: Sequence[str] = ()
                                     ) -> optax.GradientTransformation:
  """make_optimizer whose peak learning rate is a value in the optimizer state.

  The learning rate at step t is peak x unit_schedule(t): the schedule's shape
  (warmup, decay) is fixed, its peak (opt_state.hyperparams['learning_rate'],
  optax.inject_hyperparams) is data, so runs that differ only in the peak
  share one optimizer and one compiled step. The state starts with a peak of 1;
  set_peak_learning_rate gives it the run's. `frozen` as make_optimizer's.
  """
  def make(learning_rate):
    return make_optimizer(opt_config, lambda t: learning_rate * unit_schedule(t), frozen)
  return optax.inject_hyperparams(make)(learning_rate=1.0)


def set_peak_learning_rate(opt_state, learning_rate: float):
  """`opt_state` of make_optimizer_with_runtime_peak with the peak `learning_rate`, placed
  as the value it replaces."""
  old = opt_state.hyperparams["learning_rate"]
  new = jax.device_put(jnp.asarray(learning_rate, old.dtype), old.sharding)
  return opt_state._replace(hyperparams=dict(opt_state.hyperparams, learning_rate=new))
