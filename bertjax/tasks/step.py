"""The pure fine-tuning steps: train_step(state, batch, rng) and predict_step(state, batch).

predict_step returns the outputs with the rows' example ids
(batches.EXAMPLE_ID_KEY), so that each host can put every output with its
example wherever the mesh placed its row in the global batch.

One loss per kind of task, each a mean over real examples (weights 1) that
padding rows (weights 0) do not touch:
  classification   softmax cross entropy over the labels
  regression       squared error of the single output
  token            cross entropy over the tokens with label_weights 1 (each
                   word's first sub-token)
  multiple_choice  cross entropy over the choices
  span             (start cross entropy + end cross entropy) / 2
With optimizer.grad_accum_steps > 1 the global batch is split into that many
micro-batches whose gradients add up in fp32 (train.step.accumulate_gradients,
pretraining's), each micro-batch's loss sum divided by the whole batch's
weight, so the step is the one-batch step up to float rounding (and
each micro-batch's own dropout). The optimizer update is
train.step.apply_gradients, the one pretraining uses.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from bertjax.tasks.batches import EXAMPLE_ID_KEY, WEIGHT_KEY
from bertjax.train import sharding as sharding_lib
from bertjax.train import step as train_step_lib
from bertjax.train.state import TrainState

KINDS = ("classification", "regression", "token", "multiple_choice", "span")


def batch_shapes(kind: str, batch_size: int, max_seq_length: int, num_choices: int = 0
                 ) -> dict[str, tuple[tuple[int, ...], Any]]:
  """{key: (shape, dtype)} of a global batch of the task kind, as the train step reads it."""
  rows = (batch_size, num_choices) if kind == "multiple_choice" else (batch_size,)
  tokens = rows + (max_seq_length,)
  shapes = {k: (tokens, jnp.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  shapes[WEIGHT_KEY] = ((batch_size,), jnp.float32)
  if kind == "span":
    shapes.update(start_positions=((batch_size,), jnp.int32),
                  end_positions=((batch_size,), jnp.int32))
  elif kind == "token":
    shapes.update(labels=(tokens, jnp.int32), label_weights=(tokens, jnp.float32))
  elif kind == "regression":
    shapes["labels"] = ((batch_size,), jnp.float32)
  else:
    shapes["labels"] = ((batch_size,), jnp.int32)
  return shapes


def forward(params, apply_fn, batch, rng=None, deterministic: bool = True):
  return apply_fn({"params": params}, batch["input_ids"], batch["input_mask"],
                  batch["segment_ids"], deterministic=deterministic,
                  rngs=None if deterministic else {"dropout": rng})


def loss_and_hits(kind: str, outputs, batch) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(weighted loss sum, weighted sum of correct predictions, total weight)."""
  w_B = batch[WEIGHT_KEY]
  if kind in ("classification", "multiple_choice"):
    nll_B = optax.softmax_cross_entropy_with_integer_labels(outputs, batch["labels"])
    hits_B = jnp.argmax(outputs, -1) == batch["labels"]
    return jnp.sum(nll_B * w_B), jnp.sum(hits_B * w_B), jnp.sum(w_B)
  if kind == "regression":
    err_B = outputs[:, 0] - batch["labels"]
    return jnp.sum(jnp.square(err_B) * w_B), jnp.zeros([]), jnp.sum(w_B)
  if kind == "token":
    w_BxL = batch["label_weights"] * w_B[:, None]
    nll_BxL = optax.softmax_cross_entropy_with_integer_labels(outputs, batch["labels"])
    hits_BxL = jnp.argmax(outputs, -1) == batch["labels"]
    return jnp.sum(nll_BxL * w_BxL), jnp.sum(hits_BxL * w_BxL), jnp.sum(w_BxL)
  if kind == "span":
    start_BxL, end_BxL = outputs
    nll_B = (optax.softmax_cross_entropy_with_integer_labels(start_BxL, batch["start_positions"])
             + optax.softmax_cross_entropy_with_integer_labels(end_BxL, batch["end_positions"]))
    hits_B = ((jnp.argmax(start_BxL, -1) == batch["start_positions"])
              & (jnp.argmax(end_BxL, -1) == batch["end_positions"]))
    return jnp.sum(nll_B * w_B) / 2, jnp.sum(hits_B * w_B), jnp.sum(w_B)
  raise ValueError(f"task kind {kind!r} is not one of {KINDS}")


def total_weight(kind: str, batch) -> jax.Array:
  """The weight the mean loss of `batch` divides by (at least 1): real examples, or
  for token tasks their labelled tokens."""
  w_B = batch[WEIGHT_KEY].astype(jnp.float32)
  if kind == "token":
    return jnp.maximum(jnp.sum(batch["label_weights"] * w_B[:, None]), 1.0)
  return jnp.maximum(jnp.sum(w_B), 1.0)


def train_step(state: TrainState, batch, rng, *, kind: str, grad_accum_steps: int = 1
               ) -> tuple[TrainState, dict[str, Any]]:
  """One optimizer step on a global batch. `rng` is the run's base key."""
  step_rng = jax.random.fold_in(rng, state.step)
  total = total_weight(kind, batch)

  def loss_fn(params, micro, micro_rng):
    outputs = forward(params, state.apply_fn, micro, micro_rng, deterministic=False)
    loss_sum, hits, _ = loss_and_hits(kind, outputs, micro)
    return loss_sum / total, {"loss": loss_sum / total, "accuracy": hits / total}

  grads, metrics = train_step_lib.accumulate_gradients(loss_fn, state.params, batch,
                                                       step_rng, grad_accum_steps)
  if kind == "regression":
    metrics.pop("accuracy")
  return train_step_lib.apply_gradients(state, grads, metrics)


def predict_step(state: TrainState, batch):
  """(the model's outputs (logits) for every row of an evaluation batch, the rows'
  example ids), row for row."""
  return forward(state.params, state.apply_fn, batch), batch[EXAMPLE_ID_KEY]


def jit_steps(state_shardings, mesh, kind: str, grad_accum_steps: int = 1):
  """(train_step, predict_step) jitted with explicit shardings; train donates the state.

  Predictions and their example ids come back replicated, so every host reads
  the whole global batch and orders it by id (batches.in_example_order).
  """
  batch = sharding_lib.batch_sharding(mesh)
  replicated = sharding_lib.replicated(mesh)
  train = jax.jit(functools.partial(train_step, kind=kind, grad_accum_steps=grad_accum_steps),
                  in_shardings=(state_shardings, batch, replicated),
                  out_shardings=(state_shardings, replicated), donate_argnums=0)
  predict = jax.jit(predict_step, in_shardings=(state_shardings, batch),
                    out_shardings=replicated)
  return train, predict
