"""The train state, created already sharded.

The state is first built abstractly (`jax.eval_shape`), its logical axis
names become shardings through the rules table, and `jit(init,
out_shardings=...)` materialises each parameter directly in its shards: no
device ever holds the whole model unless the rules say so.
"""

import math
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from bertjax.model.bert import BertForPreTraining
from bertjax.records import schema
from bertjax.train import sharding as sharding_lib


class TrainState(flax.struct.PyTreeNode):
  """What a training step reads and writes. apply_fn and tx are static."""
  step: jax.Array
  params: Any
  opt_state: Any
  apply_fn: Callable = flax.struct.field(pytree_node=False)
  tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)


def dummy_batch(batch_size: int, max_seq_length: int, max_predictions_per_seq: int):
  """Zeros in the model batch layout (for shapes and init)."""
  return {k: jnp.zeros(shape, dtype) for k, (shape, dtype)
          in schema.batch_shapes(batch_size, max_seq_length, max_predictions_per_seq).items()}


def init_params(model: BertForPreTraining, rng, seq_len: int = 8, num_pred: int = 2):
  """Boxed (logically annotated) parameters of `model`."""
  b = dummy_batch(1, seq_len, num_pred)
  return model.init({"params": rng}, b["input_ids"], b["input_mask"], b["segment_ids"],
                    b["masked_lm_positions"], deterministic=True)["params"]


# (model, rng) -> boxed parameters; init_params for the pretraining model.
InitFn = Callable[[nn.Module, Any], Any]


def _boxed_state(model, tx, rng, init: InitFn = init_params) -> TrainState:
  # Optimizer moments built from boxed parameters carry the same logical
  # axis names, so one get_partition_spec covers the whole state.
  boxed = init(model, rng)
  return TrainState(step=jnp.zeros([], jnp.int32), params=boxed,
                    opt_state=tx.init(boxed), apply_fn=model.apply, tx=tx)


def abstract_train_state(model: BertForPreTraining, tx: optax.GradientTransformation,
                         mesh, axis_rules, init: InitFn = init_params
                         ) -> tuple[TrainState, TrainState]:
  """Shapes, dtypes and shardings of the state, without allocating it.

  Returns (abstract state of jax.ShapeDtypeStructs carrying their sharding,
  the state's shardings). `init` makes the model's boxed parameters (another
  model, e.g. a fine-tuning head, brings its own).
  """
  boxed = jax.eval_shape(lambda: _boxed_state(model, tx, jax.random.key(0), init))
  shardings = sharding_lib.logical_to_sharding(
      nn.get_partition_spec(boxed), mesh, axis_rules)
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  _check_divisible(boxed.params, shardings.params, mesh)
  plain = jax.tree.map(lambda x: x.unbox(apply_constraint=False) if is_box(x) else x,
                       boxed, is_leaf=is_box)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          plain, shardings)
  return abstract, shardings


def create_train_state(model: BertForPreTraining, tx: optax.GradientTransformation,
                       mesh, axis_rules, rng, params=None, init: InitFn = init_params
                       ) -> tuple[TrainState, Any]:
  """A sharded TrainState and its shardings.

  With `params` (e.g. converted weights) the state starts from them, placed
  on the mesh by the same rules; otherwise parameters are initialised.
  """
  abstract, shardings = abstract_train_state(model, tx, mesh, axis_rules, init)

  def make(rng, given):
    state = nn.unbox(_boxed_state(model, tx, rng, init))
    if given is None:
      return state
    return state.replace(params=given, opt_state=tx.init(given))

  if params is not None:
    _check_same_structure(abstract.params, params)
    params = jax.device_put(params, shardings.params)
  with sharding_lib.mesh_context(mesh, axis_rules):
    state = jax.jit(make, out_shardings=shardings)(rng, params)
  return state, shardings


def _check_divisible(boxed_params, shardings, mesh):
  """Refuses, naming the parameter, an axis its mesh axes do not divide."""
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  for (path, box), sharding in zip(
      jax.tree_util.tree_leaves_with_path(boxed_params, is_leaf=is_box),
      jax.tree.leaves(shardings)):
    if not is_box(box):
      continue
    for size, name, axes in zip(box.value.shape, box.names, sharding.spec):
      axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
      shards = math.prod(mesh.shape[a] for a in axes)
      if size % shards:
        hint = (f"; set model.vocab_multiple to a multiple of {shards}" if name == "vocab"
                else "")
        raise ValueError(
            f"config.mesh.rules: parameter {jax.tree_util.keystr(path)} has {size} along "
            f"its '{name}' axis, which the rules split over mesh axes {list(axes)} "
            f"({shards} shards) that do not divide it{hint}")


def _check_same_structure(expected, given):
  exp = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(expected)}
  got = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(given)}
  if exp != got:
    missing = sorted(set(exp) - set(got))[:5]
    extra = sorted(set(got) - set(exp))[:5]
    wrong = sorted(k for k in set(exp) & set(got) if exp[k] != got[k])[:5]
    raise ValueError("init_from: the weights do not fit the model config: "
                     f"missing {missing}, unexpected {extra}, wrong shapes "
                     f"{[(k, got[k], exp[k]) for k in wrong]}")
