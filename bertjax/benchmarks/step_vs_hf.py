"""bertjax's train step against transformers' FlaxBertForPreTraining + optax AdamW.

  python -m bertjax.benchmarks.step_vs_hf [--rounds 7] [--steps 4]

Both train the same architecture on the same synthetic batches in one
process: L=4, H=256, A=4, F=1024, the 30,522-token vocab, sequences of 128
with 20 masked positions, batch 32, fp32, dropout 0.1 (hidden and
attention), AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 off biases
and LayerNorm) after global-norm clipping at 1.0, jitted with the
parameters and optimizer state donated. bertjax's side is its own train step
(configs/base.py with these sizes; README "Train-step speed"): the masked-LM
head only at the masked positions, the last layer only at [CLS] and the
masked positions, the tied decoder's written-out gradient (its bias's summed
pairwise on CPU), one max for loss and accuracy, dropout masks as one fused
pass of threefry hashes, GELU, LayerNorm, dropout and attention gradients
that keep less for the backward pass, scanned layers, the vocab padded to a
multiple of 128. The transformers side is the stock model, whose
head computes logits at every position; the loss takes the masked positions
from them.

bertjax runs twice: as configured (scanned layers) and with
scan_layers=False. After compiling and a warm-up, the three alternate in
rounds (the order reversing each round), each timing --steps steps;
printed: sequences/s per round (median and range) and the per-round ratios
to transformers.
"""

import argparse
import importlib.util
import os
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from bertjax.benchmarks import aot
from bertjax.input.synthetic import SyntheticSource
from bertjax.records import schema
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib

VOCAB, HIDDEN, LAYERS, HEADS, FFN = 30522, 256, 4, 4, 1024
SEQ, PREDICTIONS, BATCH, DROPOUT = 128, 20, 32, 0.1
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _base_config(scan_layers: bool = True):
  spec = importlib.util.spec_from_file_location(
      "base_config", os.path.join(REPO, "configs", "base.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  m = config.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads = VOCAB, HIDDEN, LAYERS, HEADS
  m.intermediate_size, m.dtype, m.scan_layers = FFN, "float32", scan_layers
  m.hidden_dropout_rate = m.attention_dropout_rate = DROPOUT
  config.phases.seq128.global_batch_size = BATCH
  config.phases.seq128.max_predictions_per_seq = PREDICTIONS
  return config


def bertjax_step(batch, scan_layers: bool = True):
  """() -> runs one bertjax train step (state kept inside), jitted and compiled."""
  return compiled_train_step(_base_config(scan_layers), batch)


def compiled_train_step(config, batch, vocab_size: int = VOCAB):
  """() -> runs one train step of `config` (phase seq128) on `batch`, the
  state kept inside, jitted and compiled."""
  _, _, mesh, rules, model, tx = aot.build(config, jax.devices(), phase_name="seq128",
                                           vocab_size=vocab_size)
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
  rng = jax.random.key(1)
  with sharding_lib.mesh_context(mesh, rules):
    step_fn = step_lib.jit_train_step(shardings, mesh).lower(state, batch, rng).compile()
  holder = {"state": state}

  def run():
    holder["state"], metrics = step_fn(holder["state"], batch, rng)
    return metrics["loss"]
  return run


def _hf_decay_mask(params):
  def decayed(path, _):
    names = [getattr(k, "key", str(k)) for k in path]
    return not (names[-1] == "bias" or any("LayerNorm" in n for n in names))
  return jax.tree_util.tree_map_with_path(decayed, params)


def hf_step(batch, schedule):
  """() -> runs one FlaxBertForPreTraining train step, jitted with donation."""
  import transformers  # pylint: disable=g-import-not-at-top
  hf_config = transformers.BertConfig(
      vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
      num_attention_heads=HEADS, intermediate_size=FFN, hidden_dropout_prob=DROPOUT,
      attention_probs_dropout_prob=DROPOUT, hidden_act="gelu")
  model = transformers.FlaxBertForPreTraining(hf_config, seed=0)
  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                               mask=_hf_decay_mask))
  params = model.params
  opt_state = tx.init(params)

  def loss_fn(p, rng):
    out = model(batch["input_ids"], attention_mask=batch["input_mask"],
                token_type_ids=batch["segment_ids"], params=p, dropout_rng=rng, train=True)
    logits = jnp.take_along_axis(out.prediction_logits,
                                 batch["masked_lm_positions"][..., None], axis=1)
    w = batch["masked_lm_weights"]
    mlm = optax.softmax_cross_entropy_with_integer_labels(logits, batch["masked_lm_ids"])
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits, batch["next_sentence_labels"])
    return jnp.sum(mlm * w) / jnp.maximum(jnp.sum(w), 1.0) + jnp.mean(nsp)

  def train_step(params, opt_state, step):
    loss, grads = jax.value_and_grad(loss_fn)(params, jax.random.fold_in(jax.random.key(1), step))
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, step + 1, loss

  step = jnp.zeros([], jnp.int32)
  step_fn = jax.jit(train_step, donate_argnums=(0, 1)).lower(params, opt_state, step).compile()
  holder = {"params": params, "opt_state": opt_state, "step": step}

  def run():
    holder["params"], holder["opt_state"], holder["step"], loss = step_fn(
        holder["params"], holder["opt_state"], holder["step"])
    return loss
  return run


def _seconds(run, steps: int) -> float:
  t0 = time.perf_counter()
  for _ in range(steps):
    loss = run()
  jax.block_until_ready(loss)
  return time.perf_counter() - t0


def _summary(values):
  return f"median {statistics.median(values):.1f} (range {min(values):.1f}-{max(values):.1f})"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7, help="Alternating timed rounds.")
  parser.add_argument("--steps", type=int, default=4, help="Steps per side per round.")
  parser.add_argument("--warmup", type=int, default=2, help="Untimed steps per side first.")
  args = parser.parse_args()
  source = SyntheticSource(BATCH, max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS,
                           vocab_size=VOCAB, seed=0)
  shapes = schema.batch_shapes(BATCH, SEQ, PREDICTIONS)
  batch = {k: jnp.asarray(v) for k, v in source.batch(0).items() if k in shapes}
  runs, setup = {}, {}
  for name, make in (("bertjax", lambda: bertjax_step(batch)),
                     ("bertjax unrolled", lambda: bertjax_step(batch, scan_layers=False)),
                     ("transformers", lambda: hf_step(
                         batch, optax.linear_schedule(0.0, 1e-4, 10_000)))):
    t0 = time.perf_counter()
    runs[name] = make()
    setup[name] = time.perf_counter() - t0
    _seconds(runs[name], args.warmup)
  rates = {name: [] for name in runs}
  for r in range(args.rounds):
    names = list(runs) if r % 2 == 0 else list(runs)[::-1]
    for name in names:
      rates[name].append(BATCH * args.steps / _seconds(runs[name], args.steps))
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind} x {jax.device_count()}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
  print(f"L={LAYERS} H={HIDDEN} A={HEADS} F={FFN} vocab {VOCAB}, batch {BATCH} x {SEQ}, "
        f"{PREDICTIONS} predictions, fp32, dropout {DROPOUT}")
  print("setup + compile  " + ", ".join(f"{k} {v:.1f} s" for k, v in setup.items()))
  for name, values in rates.items():
    print(f"{name:17s} sequences/s {_summary(values)} over {args.rounds} rounds "
          f"of {args.steps} steps")
  for name in ("bertjax", "bertjax unrolled"):
    ratios = [a / b for a, b in zip(rates[name], rates["transformers"])]
    print(f"{name} / transformers  {_summary(ratios)} (paired rounds); per round: "
          f"{' '.join(f'{x:.2f}' for x in ratios)}")

if __name__ == "__main__":
  main()
