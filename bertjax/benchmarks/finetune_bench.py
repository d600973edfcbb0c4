"""Fine-tuning throughput: bertjax's sequence classification step against transformers'
FlaxBertForSequenceClassification with optax AdamW, same dimensions, in one process.

  python -m bertjax.benchmarks.finetune_bench [--hidden 256 --layers 4 --heads 4
      --intermediate 1024 --vocab 30522 --seq 128 --batch 32] [--rounds 3 --steps 10]

Both train on the same random batches with dropout 0.1, gradient clipping at
1.0 and AdamW with weight decay 0.01 (not on biases or LayerNorm), fp32 (or
--dtype bfloat16 for bertjax's compute and transformers' `dtype`). After one
compiled warm-up step each, the two alternate --rounds times, --steps steps
each; printed: median sequences/s of the rounds and the ratio.
"""

import argparse
import importlib.util
import os
import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax.model import heads
from bertjax.model.config import BertConfig
from bertjax.tasks import step as step_lib
from bertjax.train import optimizer as opt_lib
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib

_BASE_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs", "base.py")


def _mesh_config():
  """configs/base.py's mesh: data parallel over every device, its rules table."""
  spec = importlib.util.spec_from_file_location("base_config", _BASE_CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config().mesh


def _batches(args, count):
  rng = np.random.default_rng(0)
  out = []
  for _ in range(count):
    ids = rng.integers(5, args.vocab, (args.batch, args.seq)).astype(np.int32)
    out.append({"input_ids": ids, "input_mask": np.ones_like(ids),
                "segment_ids": (np.arange(args.seq) >= args.seq // 2).astype(np.int32)[None]
                               .repeat(args.batch, 0),
                "labels": rng.integers(0, 2, args.batch).astype(np.int32),
                "weights": np.ones(args.batch, np.float32)})
  return out


def _optimizer_config(args):
  return ml_collections.ConfigDict(dict(
      name="adamw", learning_rate=2e-5, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
      bias_correction=True, clip_norm=1.0, warmup_steps=0, end_learning_rate=2e-5,
      per_phase_warmup=False))


def bertjax_step(args, config: BertConfig):
  """(step function, state) of bertjax's fine-tuning step on one device mesh."""
  mesh_config = _mesh_config()
  mesh, rules = sharding_lib.make_mesh(mesh_config), sharding_lib.rules(mesh_config)
  opt = _optimizer_config(args)
  tx = opt_lib.make_optimizer(opt, optax.constant_schedule(opt.learning_rate))
  model = heads.BertForSequenceClassification(config, num_labels=2)

  def init(m, rng):
    ids = jnp.zeros((1, args.seq), jnp.int32)
    return m.init({"params": rng}, ids, ids, ids)["params"]
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0),
                                                  init=init)
  train, _ = step_lib.jit_steps(shardings, mesh, "classification")
  batch_sharding = sharding_lib.batch_sharding(mesh)
  rng = jax.random.key(1)

  def run(state, batch):
    with sharding_lib.mesh_context(mesh, rules):
      batch = {k: jax.device_put(v, batch_sharding) for k, v in batch.items()}
      return train(state, batch, rng)
  return run, state


def transformers_step(args, config: BertConfig):
  """(step function, (params, opt_state)) of FlaxBertForSequenceClassification + optax AdamW."""
  import transformers  # pylint: disable=g-import-not-at-top
  hf_config = transformers.BertConfig(
      vocab_size=config.vocab_size, hidden_size=config.hidden_size,
      num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
      intermediate_size=config.intermediate_size, num_labels=2, hidden_act="gelu")
  model = transformers.FlaxBertForSequenceClassification(
      hf_config, seed=0, dtype=jnp.dtype(config.dtype))
  opt = _optimizer_config(args)
  tx = optax.chain(optax.clip_by_global_norm(opt.clip_norm), optax.adamw(
      opt.learning_rate, opt.b1, opt.b2, opt.eps, weight_decay=opt.weight_decay,
      mask=jax.tree_util.tree_map_with_path(
          lambda path, _: not (path[-1].key == "bias" or path[-2].key == "LayerNorm"),
          model.params)))

  def loss_fn(params, batch, rng):
    logits = model(batch["input_ids"], attention_mask=batch["input_mask"],
                   token_type_ids=batch["segment_ids"], params=params, dropout_rng=rng,
                   train=True).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

  @jax.jit
  def train(carry, batch, rng):
    params, opt_state, step = carry
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, jax.random.fold_in(rng, step))
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, step + 1), loss

  rng = jax.random.key(1)
  return (lambda carry, batch: train(carry, batch, rng)), (
      model.params, tx.init(model.params), jnp.zeros([], jnp.int32))


def _time(step, carry, batches, steps):
  t0 = time.perf_counter()
  for i in range(steps):
    carry, out = step(carry, batches[i % len(batches)])
  jax.block_until_ready(out)
  return carry, time.perf_counter() - t0


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  for name, default in (("hidden", 256), ("layers", 4), ("heads", 4), ("intermediate", 1024),
                        ("vocab", 30522), ("seq", 128), ("batch", 32), ("rounds", 3),
                        ("steps", 10)):
    p.add_argument(f"--{name}", type=int, default=default)
  p.add_argument("--dtype", default="float32")
  args = p.parse_args()
  config = BertConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                      num_heads=args.heads, intermediate_size=args.intermediate,
                      dtype=args.dtype)
  batches = _batches(args, 4)
  runners = {"bertjax": bertjax_step(args, config),
             "transformers": transformers_step(args, config)}
  carries = {}
  for name, (step, carry) in runners.items():
    t0 = time.perf_counter()
    carries[name], _ = _time(step, carry, batches, 1)
    print(f"{name}: compile + first step {time.perf_counter() - t0:.1f}s")
  rates = {name: [] for name in runners}
  for _ in range(args.rounds):
    for name, (step, _) in runners.items():
      carries[name], seconds = _time(step, carries[name], batches, args.steps)
      rates[name].append(args.steps * args.batch / seconds)
  print(f"{jax.device_count()} x {jax.devices()[0].device_kind}; L={args.layers} "
        f"H={args.hidden} A={args.heads} F={args.intermediate} V={args.vocab}, "
        f"seq {args.seq}, batch {args.batch}, {args.dtype}")
  for name, r in rates.items():
    print(f"{name:>12}: {statistics.median(r):8.1f} sequences/s (rounds: "
          f"{', '.join(f'{x:.1f}' for x in r)})")
  print(f"bertjax / transformers: "
        f"{statistics.median(rates['bertjax']) / statistics.median(rates['transformers']):.2f}x")


if __name__ == "__main__":
  main()
