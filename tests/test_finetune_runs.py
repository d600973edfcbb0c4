"""Fine-tuning as people run it: gradient accumulation against the one-batch step and a
direct mean over the real rows, dev evaluation during training with the best checkpoint
and early stopping, and a sweep that compiles its train step once.

(SIGTERM and SIGKILL of a real fine-tuning process are in test_finetune_faults.py; the
ahead-of-time fit check on libtpu is in test_fit.py.)
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.model.config import BertConfig
from bertjax.tasks import loop
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.tasks.best import BestDev
from bertjax.tasks.batches import WEIGHT_KEY
from bertjax.train import optimizer as opt_lib
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as train_step_lib

import test_finetune
from test_finetune import _config, _saved_params, data  # pylint: disable=unused-import
from test_train import losses

MODEL = BertConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2,
                   intermediate_size=64, max_position_embeddings=16, dtype="float32",
                   hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
ROWS, LENGTH, REAL = 8, 16, 5  # Rows 5-7 are padding (weight 0), with junk in them.


def _batch(kind: str):
  rng = np.random.default_rng(0)
  batch = {k: np.zeros(shape, dtype) for k, (shape, dtype)
           in step_lib.batch_shapes(kind, ROWS, LENGTH).items()}
  lengths = rng.integers(6, LENGTH + 1, ROWS)
  mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype(np.int32)
  batch.update(input_ids=rng.integers(5, 64, (ROWS, LENGTH)).astype(np.int32) * mask,
               input_mask=mask, segment_ids=(np.arange(LENGTH)[None] >= 4) * mask)
  batch[WEIGHT_KEY] = (np.arange(ROWS) < REAL).astype(np.float32)
  if kind == "classification":
    batch["labels"] = rng.integers(0, 3, ROWS).astype(np.int32)
  else:  # token: a different number of labelled tokens in each row.
    batch["labels"] = rng.integers(0, 3, (ROWS, LENGTH)).astype(np.int32)
    batch["label_weights"] = (mask * (rng.random((ROWS, LENGTH)) < 0.5)).astype(np.float32)
  return {k: jnp.asarray(v) for k, v in batch.items()}


def _direct_mean_loss(kind, params, apply_fn, batch):
  """The mean loss over the real rows only (padding rows dropped before the model)."""
  real = {k: v[:REAL] for k, v in batch.items()}
  logits = step_lib.forward(params, apply_fn, real)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, real["labels"])
  if kind == "classification":
    return jnp.mean(nll)
  return jnp.sum(nll * real["label_weights"]) / jnp.sum(real["label_weights"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["classification", "token"])
def test_accumulated_step_is_the_one_batch_step_and_the_mean_over_real_rows(kind):
  task = registry.Task("t", kind, 3, ("dev",), "accuracy", load=None)
  model = registry.model_for(task, MODEL)
  opt = test_finetune.glue_config.get_config().optimizer
  tx = opt_lib.make_optimizer_with_runtime_peak(opt, optax.constant_schedule(1.0))
  mesh_config = test_finetune.glue_config.get_config().mesh
  mesh, rules = sharding_lib.make_mesh(mesh_config), sharding_lib.rules(mesh_config)
  state, shardings = state_lib.create_train_state(
      model, tx, mesh, rules, jax.random.key(0), init=registry.init_fn(task, LENGTH))
  state = state.replace(opt_state=opt_lib.set_peak_learning_rate(state.opt_state, 1e-3))
  batch = _batch(kind)

  # The twin: gradient of the direct mean, through the same optimizer update.
  loss, grads = jax.value_and_grad(_direct_mean_loss, argnums=1)(
      kind, state.params, state.apply_fn, batch)
  expected, _ = train_step_lib.apply_gradients(state, grads, {"loss": loss})

  results = {}
  with sharding_lib.mesh_context(mesh, rules):
    for k in (1, 2, 4):
      p_train, _ = step_lib.jit_steps(shardings, mesh, kind, grad_accum_steps=k)
      fresh = jax.tree.map(jnp.copy, state)  # The step donates its state.
      results[k] = p_train(fresh, batch, jax.random.key(1))
  for k, (new_state, metrics) in results.items():
    np.testing.assert_allclose(metrics["loss"], loss, rtol=2e-6, err_msg=f"k={k}")
    np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(grads), rtol=2e-5)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=0, atol=2e-6),
                 new_state.params, expected.params)
  # The parameters moved, so the comparison above could fail.
  assert optax.tree.norm(jax.tree.map(jnp.subtract, expected.params, state.params)) > 1e-3


def test_best_dev_never_takes_nan_and_counts_patience_across_a_restart():
  dev = lambda f1: {"dev": {"f1": f1, "accuracy": 0.5}}
  best = BestDev("f1", "dev", patience=2)
  assert not best.update(2, dev(float("nan")))  # NaN is never the best...
  assert best.step is None and best.evals_since_best == 1
  assert best.update(4, dev(0.6)) and best.step == 4  # ...a number after it is.
  assert not best.update(6, dev(0.6))  # Equal is not better.
  restarted = BestDev("f1", "dev", patience=2, saved=best.to_meta())
  assert not restarted.update(6, dev(0.6))  # Step 6 was counted before the restart.
  assert not restarted.should_stop()
  assert not restarted.update(8, dev(float("nan")))
  assert restarted.should_stop() and (restarted.step, restarted.score) == (4, 0.6)


@pytest.mark.slow
def test_periodic_dev_evaluation_keeps_the_best_checkpoint(data, tmp_path):
  # 16 steps, evaluated every 4: steps 4, 8, 12 and the last.
  config = _config(data, num_epochs=2.0, eval_every_steps=4,
                   **{"optimizer.learning_rate": 1e-3})
  results = loop.finetune_and_evaluate(config, str(tmp_path))
  f1 = losses(tmp_path, tag="dev_dev/f1")
  assert sorted(f1) == [4, 8, 12, 16]
  np.testing.assert_allclose(f1[16], results["dev"]["dev"]["f1"], rtol=1e-6)
  best = results["best"]  # The first of the highest scores (TensorBoard keeps float32).
  top = max(f1.values())
  assert best["score"] == pytest.approx(top, rel=1e-6)
  assert best["step"] == min(s for s in f1 if f1[s] == top)
  assert best["dev"]["dev"]["f1"] == best["score"]
  assert best["checkpoint"] == os.path.join(str(tmp_path), "best", str(best["step"]))
  assert os.listdir(os.path.join(str(tmp_path), "best")) == [str(best["step"])]
  assert (results["trained_steps"], results["stopped_early"]) == (16, False)


def test_early_stopping_after_patience_evaluations_without_a_better_score(data, tmp_path):
  # Nothing moves (learning rate 0), so no evaluation after the first is better:
  # with patience 2 the run stops at the third, step 6 of 16.
  config = _config(data, num_epochs=2.0, eval_every_steps=2, early_stopping_patience=2,
                   **{"optimizer.learning_rate": 0.0})
  results = loop.finetune_and_evaluate(config, str(tmp_path))
  assert (results["trained_steps"], results["stopped_early"]) == (6, True)
  assert results["best"]["step"] == 2
  assert sorted(losses(tmp_path, tag="dev_dev/f1")) == [2, 4, 6]
  assert sorted(os.listdir(os.path.join(str(tmp_path), "checkpoints"))) == ["6"]
  with pytest.raises(ValueError, match="--config.early_stopping_patience counts dev "
                     "evaluations during training: set --config.eval_every_steps"):
    loop.finetune_and_evaluate(_config(data, early_stopping_patience=2),
                               str(tmp_path / "refused"))


def test_a_sweep_traces_its_train_step_once_for_every_learning_rate(data, tmp_path,
                                                                     monkeypatch):
  traces = {"train": 0, "predict": 0}

  def counting(name, fn):
    @functools.wraps(fn)
    def traced(*args, **kwargs):
      traces[name] += 1  # Runs only while jax traces the function.
      return fn(*args, **kwargs)
    return traced
  monkeypatch.setattr(step_lib, "train_step", counting("train", step_lib.train_step))
  monkeypatch.setattr(step_lib, "predict_step", counting("predict", step_lib.predict_step))
  after_each_run = []
  run = loop.finetune_and_evaluate

  def recording_run(*args, **kwargs):
    result = run(*args, **kwargs)
    after_each_run.append(dict(traces))
    return result
  monkeypatch.setattr(loop, "finetune_and_evaluate", recording_run)

  config = _config(data)
  config.sweep.learning_rates = (1e-3, 1e-4)
  config.sweep.seeds = (0,)
  summary = loop.sweep(config, str(tmp_path))
  assert after_each_run[0]["train"] == 1
  assert after_each_run[1] == after_each_run[0]  # The second run compiled nothing.
  # Each run trained with its own peak learning rate: the same schedule, scaled.
  high, low = (losses(r["workdir"], tag="train/learning_rate") for r in summary["runs"])
  assert sorted(high) == sorted(low) and max(high.values()) > 0
  for step, rate in high.items():
    assert rate == pytest.approx(10 * low[step], rel=1e-5)
  a, b = (_saved_params(r["workdir"]) for r in summary["runs"])
  assert not np.array_equal(a["classifier"]["kernel"], b["classifier"]["kernel"])
