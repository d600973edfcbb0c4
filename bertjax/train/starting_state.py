"""Where a run starts: its latest checkpoint, init_from's weights, or a fresh init."""

import dataclasses
from typing import Any, Callable, Optional

import jax
import optax
from absl import logging

from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import state as state_lib

# (path, abstract params, model config) -> params, for config.init_from, e.g.
# bertjax.convert.weights.load_weights (bertjax checkpoints, Hugging Face
# model directories and the original release's TF1 checkpoints; the train
# layer does not import the convert layer).
WeightsLoader = Callable[[str, Any, BertConfig], Any]


@dataclasses.dataclass(frozen=True)
class StartingState:
  """The state to train from, its shardings, the run's dropout key, and the
  resumed checkpoint's metadata (None when not resuming)."""
  state: state_lib.TrainState
  shardings: state_lib.TrainState
  dropout_rng: jax.Array
  meta: Optional[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Sources:
  """What a run may start from, in order of precedence."""
  checkpointer: ckpt_lib.Checkpointer
  latest_step: Optional[int]  # The checkpoint to resume from, if any.
  init_from: str = ""  # Weights for a run that is not resuming.
  weights_loader: Optional[WeightsLoader] = None


def initial_state(model: BertForPreTraining, tx: optax.GradientTransformation, mesh,
                  rules, *, seed: int, sources: Sources) -> StartingState:
  """Resumes from the latest checkpoint, else starts from init_from or a fresh init.

  A resumed run reads its state straight into the abstract (sharded) state,
  and init_from reads its weights before anything is initialised. The seed
  gives the init key and the dropout key; a resumed run takes its dropout
  key from the checkpoint.
  """
  init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
  abstract, shardings = state_lib.abstract_train_state(model, tx, mesh, rules)
  if sources.latest_step is not None:
    state, meta = sources.checkpointer.restore(abstract, shardings, sources.latest_step)
    logging.info("Resumed from the checkpoint at step %d (phase %s, data step %d).",
                 sources.latest_step, meta["phase"], meta["data_step"])
    return StartingState(state, shardings, ckpt_lib.rng_from_json(meta["rng"]), meta)
  params = None
  if sources.init_from:
    if sources.weights_loader is None:
      raise ValueError("--config.init_from: pass train_and_evaluate a weights_loader, e.g. "
                       "bertjax.convert.weights.load_weights as bertjax.main does")
    params = sources.weights_loader(sources.init_from, abstract.params, model.config)
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, init_rng,
                                                  params=params)
  if params is not None:
    logging.info("Started from the weights in %s at step 0.", sources.init_from)
  else:
    logging.info("Started from a fresh initialisation (seed %d).", seed)
  return StartingState(state, shardings, dropout_rng, None)
