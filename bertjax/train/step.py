"""The pure training and evaluation steps.

`train_step(state, batch, rng) -> (state, metrics)` and
`eval_step(state, batch) -> metrics` are module-level functions; the loop
jits them with explicit shardings and donates the state. The loss is the
masked-LM cross entropy averaged over `masked_lm_weights` plus the
next-sentence cross entropy averaged over real examples. The objective
(schema.OBJECTIVES, a static argument; the run config's `objective`)
decides which terms there are, in one place (`loss_terms`): for "mlm" the
NSP terms are 0 with weight 0, and for "ltr" the masked-LM terms are the
next-token cross entropy and accuracy at every position whose next token is
real (input_mask[t + 1] = 1), reported under the same mlm_* names. The
model must output the logits its objective needs (a clear error otherwise).
With gradient accumulation the global batch is split into micro-batches
whose gradients add up to the gradient of the whole batch (up to float
rounding, and with each micro-batch drawing its own dropout): every
micro-batch loss is divided by the whole batch's weight totals. Packed
batches (schema.PACKED_KEYS present) carry next_sentence_labels and weights
per packed example, [B, K]: the sums run over every example either way.
train_step's metrics also count the batch's real tokens (`real_tokens`,
the sum of input_mask over the global batch), packed or not, for the logged
real-token throughput.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertjax.records.schema import DEFAULT_OBJECTIVE, EXAMPLE_WEIGHT_KEY, OBJECTIVES, PACKED_KEYS
from bertjax.train import sharding as sharding_lib
from bertjax.train.sharding import BATCH_AXES
from bertjax.train.state import TrainState

Batch = dict[str, jax.Array]


def loss_terms(objective: str) -> tuple[bool, bool]:
  """(causal, next_sentence): whether `objective`'s language-model loss is
  next-token prediction (ltr), and whether it has the NSP loss (mlm+nsp)."""
  if objective not in OBJECTIVES:
    raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
  return objective == "ltr", objective == "mlm+nsp"


def _logits(out: dict[str, jax.Array], key: str, objective: str) -> jax.Array:
  if key not in out:
    raise ValueError(f"objective={objective!r} needs the model's {key}, but it outputs "
                     f"{sorted(out)}: build the model with run_config.model_overrides"
                     f"({objective!r})")
  return out[key]


def _lm_weights(batch: Batch, causal: bool) -> jax.Array:
  """The language-model loss's weights: the masked positions, or for a causal
  model every position whose next token is real (of a real example)."""
  if causal:
    example_w_B = batch[EXAMPLE_WEIGHT_KEY].astype(jnp.float32)
    return batch["input_mask"][:, 1:].astype(jnp.float32) * example_w_B[:, None]
  return batch["masked_lm_weights"].astype(jnp.float32)


def loss_sums(params, apply_fn, batch: Batch, rng, deterministic: bool,
              objective: str = DEFAULT_OBJECTIVE):
  """Weighted sums (not means) of losses and hits, so micro-batches add up."""
  causal, next_sentence = loss_terms(objective)
  packed = {k: batch[k] for k in PACKED_KEYS if k in batch}
  out = apply_fn(
      {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"], deterministic=deterministic, sequence_output=False,
      rngs=None if deterministic else {"dropout": rng}, **packed)
  mlm_w_BxP = _lm_weights(batch, causal)
  if causal:
    # Next-token prediction: position t predicts the token at t + 1.
    mlm_logits_BxPxV = _logits(out, "lm_logits", objective)[:, :-1]
    mlm_labels_BxP = batch["input_ids"][:, 1:]
  else:
    mlm_logits_BxPxV = _logits(out, "mlm_logits", objective)
    mlm_labels_BxP = batch["masked_lm_ids"]
  mlm_nll_BxP, mlm_hit = nll_and_hit(mlm_logits_BxPxV, mlm_labels_BxP)
  nsp_w_B = batch[EXAMPLE_WEIGHT_KEY].astype(jnp.float32)
  if next_sentence:
    nsp_nll_B, nsp_hit = nll_and_hit(_logits(out, "nsp_logits", objective),
                                     batch["next_sentence_labels"])
  else:
    nsp_w_B = jnp.zeros_like(nsp_w_B)
    nsp_nll_B, nsp_hit = nsp_w_B, nsp_w_B
  return {
      "mlm_loss": jnp.sum(mlm_nll_BxP * mlm_w_BxP),
      "nsp_loss": jnp.sum(nsp_nll_B * nsp_w_B),
      "mlm_hits": jnp.sum(mlm_hit * mlm_w_BxP),
      "nsp_hits": jnp.sum(nsp_hit * nsp_w_B),
      "mlm_weight": jnp.sum(mlm_w_BxP),
      "nsp_weight": jnp.sum(nsp_w_B),
      "examples": jnp.sum(batch[EXAMPLE_WEIGHT_KEY].astype(jnp.float32)),
  }


def nll_and_hit(logits, labels):
  """Softmax cross entropy with integer labels, and whether the label's logit is the largest.

  One max over the classes serves both (an argmax would be a second pass
  over the masked-LM logits); a label tied with the largest logit counts as
  a hit.
  """
  shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  label_shifted = jnp.take_along_axis(shifted, labels[..., None], axis=-1)[..., 0]
  nll = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1)) - label_shifted
  return nll, label_shifted >= 0


def _split_micro(batch: Batch, num_micro: int) -> Batch:
  """[B, ...] -> [num_micro, B / num_micro, ...], each micro-batch spread over all shards.

  Row i goes to micro-batch i % num_micro, so every device's contiguous block
  of rows splits evenly across micro-batches and no data moves.
  """
  def split(x):
    b = x.shape[0]
    y = x.reshape((b // num_micro, num_micro) + x.shape[1:]).swapaxes(0, 1)
    spec = jax.sharding.PartitionSpec(None, BATCH_AXES)
    return jax.lax.with_sharding_constraint(y, spec) if _has_mesh() else y
  return jax.tree.map(split, batch)


def _has_mesh() -> bool:
  return not jax.sharding.get_abstract_mesh().empty


def train_step(state: TrainState, batch: Batch, rng, *, objective: str = DEFAULT_OBJECTIVE,
               grad_accum_steps: int = 1) -> tuple[TrainState, dict[str, Any]]:
  """One optimizer step on a global batch. `rng` is the run's base key."""
  step_rng = jax.random.fold_in(rng, state.step)
  mlm_total, nsp_total = _weight_totals(batch, objective)

  def loss_fn(params, micro, micro_rng):
    sums = loss_sums(params, state.apply_fn, micro, micro_rng, deterministic=False,
                     objective=objective)
    return sums["mlm_loss"] / mlm_total + sums["nsp_loss"] / nsp_total, sums

  grads, sums = accumulate_gradients(loss_fn, state.params, batch, step_rng,
                                     grad_accum_steps)
  real_tokens = jnp.sum(batch["input_mask"] > 0, dtype=jnp.int32)
  return apply_gradients(state, grads, dict(_summarise(sums), real_tokens=real_tokens))


def accumulate_gradients(loss_fn, params, batch: Batch, rng, grad_accum_steps: int):
  """(gradients, sums) of `loss_fn(params, micro_batch, micro_rng) -> (loss, sums)`.

  With grad_accum_steps > 1 the batch is split into that many micro-batches
  (_split_micro) that run one after another in a scan; their gradients and
  sums are added up in fp32, so memory holds one micro-batch's activations.
  Micro-batch i draws dropout from fold_in(rng, i). The loss must be a sum
  over rows divided by whole-batch totals (as train_step's is) for the added
  gradients to be the whole batch's.
  """
  grad_fn = jax.grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    return grad_fn(params, batch, rng)
  micro_batches = _split_micro(batch, grad_accum_steps)

  def body(carry, xs):
    acc_grads, acc_sums = carry
    micro, i = xs
    g, s = grad_fn(params, micro, jax.random.fold_in(rng, i))
    add = lambda acc, x: acc + x.astype(acc.dtype)
    return (jax.tree.map(add, acc_grads, g), jax.tree.map(add, acc_sums, s)), None

  first = jax.tree.map(lambda x: x[0], micro_batches)
  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)
  zeros_g = jax.tree.map(zeros, params)
  zeros_s = jax.tree.map(zeros, jax.eval_shape(lambda: loss_fn(params, first, rng)[1]))
  (grads, sums), _ = jax.lax.scan(
      body, (zeros_g, zeros_s), (micro_batches, jnp.arange(grad_accum_steps)))
  return grads, sums


def _weight_totals(batch: Batch, objective: str):
  """The whole batch's language-model and NSP weight totals (at least 1), which
  every micro-batch's loss sums are divided by."""
  causal, _ = loss_terms(objective)
  example_w_B = batch[EXAMPLE_WEIGHT_KEY].astype(jnp.float32)
  return (jnp.maximum(jnp.sum(_lm_weights(batch, causal)), 1.0),
          jnp.maximum(jnp.sum(example_w_B), 1.0))


def apply_gradients(state: TrainState, grads, metrics: dict[str, jax.Array]
                    ) -> tuple[TrainState, dict[str, Any]]:
  """The optimizer update, skipped where the loss or the gradient is not finite.

  Adds grad_norm, param_norm (of the parameters after the step) and `finite`
  to `metrics`. The gradient's global norm is taken once: it is the metric,
  the non-finite test and the clipping's norm (the optimizer reads it,
  optimizer.clip_by_global_norm). A step whose metrics["loss"] or gradient
  norm is not finite keeps the parameters and optimizer state (Adam's
  moments and count) as they were: the test is known before the update, so
  the choice between new and old values happens inside the passes that
  compute the new ones, and a good step writes its state once. The step
  number moves on, and with it the learning rate, which the optimizer reads
  from the step (optimizer.scale_by_schedule_at_step). `finite` says whether
  the update was applied. Where an applied update itself made the parameters
  non-finite (a finite gradient at an absurd learning rate), param_norm
  shows it and StepMetrics stops the run at that step: its parameters are
  lost, and the run resumes from its latest checkpoint.
  """
  grad_norm = optax.tree.norm(grads)
  ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params,
                                       step=state.step, grad_norm=grad_norm)
  keep = lambda new, old: jnp.where(ok, new, old)
  params = jax.tree.map(keep, optax.apply_updates(state.params, updates), state.params)
  opt_state = jax.tree.map(keep, opt_state, state.opt_state)
  param_norm = optax.tree.norm(params)
  metrics = dict(metrics, grad_norm=grad_norm, param_norm=param_norm, finite=ok)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, metrics


def eval_step(state: TrainState, batch: Batch, *, objective: str = DEFAULT_OBJECTIVE
              ) -> dict[str, jax.Array]:
  """Weighted sums over one eval batch; the loop adds them up and divides."""
  return loss_sums(state.params, state.apply_fn, batch, None, deterministic=True,
                   objective=objective)


def jit_train_step(state_shardings: TrainState, mesh, *, objective: str = DEFAULT_OBJECTIVE,
                   grad_accum_steps: int = 1):
  """train_step jitted with the state's and the batch's shardings; the state is donated.

  Call it under sharding.mesh_context(mesh, rules) so that the model's
  logical constraints resolve.
  """
  return jax.jit(
      functools.partial(train_step, objective=objective, grad_accum_steps=grad_accum_steps),
      in_shardings=(state_shardings, sharding_lib.batch_sharding(mesh),
                    sharding_lib.replicated(mesh)),
      out_shardings=(state_shardings, sharding_lib.replicated(mesh)), donate_argnums=0)


def _summarise(sums: dict[str, jax.Array]) -> dict[str, jax.Array]:
  mlm_w = jnp.maximum(sums["mlm_weight"], 1.0)
  nsp_w = jnp.maximum(sums["nsp_weight"], 1.0)
  mlm_loss, nsp_loss = sums["mlm_loss"] / mlm_w, sums["nsp_loss"] / nsp_w
  return {
      "loss": mlm_loss + nsp_loss,
      "mlm_loss": mlm_loss,
      "nsp_loss": nsp_loss,
      "mlm_accuracy": sums["mlm_hits"] / mlm_w,
      "nsp_accuracy": sums["nsp_hits"] / nsp_w,
  }


def summarise_eval(sums: dict[str, float]) -> dict[str, float]:
  """Totals of eval_step over a dataset -> losses and accuracies."""
  return {k: float(v) for k, v in _summarise(sums).items()}
