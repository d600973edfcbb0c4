"""bertjax's train step against transformers' FlaxBertForPreTraining + optax AdamW.

  python -m bertjax.benchmarks.step_vs_hf [--rounds 7] [--steps 4]

Both train the same architecture on the same synthetic batches: L=4,
H=256, A=4, F=1024, the 30,522-token vocab, sequences of 128 with 20 masked
positions, batch 32, fp32, dropout 0.1 (hidden and
attention), AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 off biases
and LayerNorm) after global-norm clipping at 1.0, jitted with the
parameters and optimizer state donated. bertjax's side is its own train step
(configs/base.py with these sizes; README "Train-step speed"): the masked-LM
head only at the masked positions, the last layer only at [CLS] and the
masked positions, the tied decoder's written-out gradient (its bias's summed
pairwise on CPU), one max for loss and accuracy, dropout masks as products
of row and column words (a threefry hash per row and per column), GELU,
LayerNorm, dropout and attention gradients
that keep less for the backward pass, scanned layers run unrolled
(model.layer_loop=auto on the CPU at this size), the vocab padded to a
multiple of 128. The transformers side is the stock model, whose
head computes logits at every position; the loss takes the masked positions
from them.

Each side runs in its own process: bertjax with the glibc malloc settings
that the default BERTJAX_HOST_MALLOC=auto gives `python -m bertjax.main` on
the CPU for this model (bertjax/records/hostmem.py: TUNABLES for a hidden
size of 256 or more), transformers with glibc's defaults; any GLIBC_TUNABLES
this command is given reaches neither.
Two more processes swap them (bertjax with the defaults, transformers with
bertjax's settings) so that what the settings give each side is printed
too. After every process has compiled and warmed up, the parent has them
run --steps steps each in turn, in rounds (the order reversing each round),
one process at a time; printed: sequences/s per side (median and range),
minor page faults per step, and the per-round ratios to transformers.
"""

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import optax

from bertjax.input.synthetic import SyntheticSource
from bertjax.records import hostmem
from bertjax.records import schema
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib
from bertjax.train import step_setup

VOCAB, HIDDEN, LAYERS, HEADS, FFN = 30522, 256, 4, 4, 1024
SEQ, PREDICTIONS, BATCH, DROPOUT = 128, 20, 32, 0.1
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _base_config():
  spec = importlib.util.spec_from_file_location(
      "base_config", os.path.join(REPO, "configs", "base.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  m = config.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads = VOCAB, HIDDEN, LAYERS, HEADS
  m.intermediate_size, m.dtype = FFN, "float32"
  m.hidden_dropout_rate = m.attention_dropout_rate = DROPOUT
  config.phases.seq128.global_batch_size = BATCH
  config.phases.seq128.max_predictions_per_seq = PREDICTIONS
  return config


def bertjax_step(batch):
  """() -> runs one bertjax train step (state kept inside), jitted and compiled."""
  return compiled_train_step(_base_config(), batch)


def compiled_train_step(config, batch, vocab_size: int = VOCAB):
  """() -> runs one train step of `config` (phase seq128) on `batch`, the
  state kept inside, jitted and compiled."""
  _, _, mesh, rules, model, tx = step_setup.build(config, jax.devices(), phase_name="seq128",
                                                  vocab_size=vocab_size)
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
  rng = jax.random.key(1)
  with sharding_lib.mesh_context(mesh, rules):
    step_fn = step_lib.jit_train_step(shardings, mesh, objective=config.objective).lower(
        state, batch, rng).compile()
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


# What BERTJAX_HOST_MALLOC=auto runs this model with ("": glibc's defaults).
AUTO = hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu"}, HIDDEN) or ""
# name -> (which step, the GLIBC_TUNABLES its process starts with)
SIDES = {
    "bertjax": ("bertjax", AUTO),
    "bertjax, glibc defaults": ("bertjax", ""),
    "transformers": ("transformers", ""),
    "transformers, bertjax's malloc": ("transformers", AUTO),
}


def _worker(step_name: str, warmup: int):
  """Builds one side's step, then runs `N` steps for each line N on stdin.

  Prints `ready SECONDS` after compiling and warming up, then for each line
  `SECONDS FAULTS` (the wall time of the N steps and the minor page faults
  taken during them).
  """
  source = SyntheticSource(BATCH, max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS,
                           vocab_size=VOCAB, seed=0)
  shapes = schema.batch_shapes(BATCH, SEQ, PREDICTIONS)
  batch = {k: jnp.asarray(v) for k, v in source.batch(0).items() if k in shapes}
  t0 = time.perf_counter()
  if step_name == "bertjax":
    run = bertjax_step(batch)
  else:
    run = hf_step(batch, optax.linear_schedule(0.0, 1e-4, 10_000))
  _seconds(run, warmup)
  print(f"ready {time.perf_counter() - t0:.1f}", flush=True)
  for line in sys.stdin:
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = _seconds(run, int(line))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    print(f"{seconds} {faults}", flush=True)


def _start(name: str, warmup: int) -> tuple[subprocess.Popen, float]:
  step_name, tunables = SIDES[name]
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  if tunables:
    env["GLIBC_TUNABLES"] = tunables
  proc = subprocess.Popen(
      [sys.executable, "-m", "bertjax.benchmarks.step_vs_hf", "--worker", step_name,
       "--warmup", str(warmup)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      text=True)
  line = proc.stdout.readline().split()
  if not line or line[0] != "ready":
    proc.kill()
    raise RuntimeError(f"the {name!r} process stopped before its step was ready "
                       f"(exit code {proc.wait()}); its error is above")
  return proc, float(line[1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7, help="Alternating timed rounds.")
  parser.add_argument("--steps", type=int, default=4, help="Steps per side per round.")
  parser.add_argument("--warmup", type=int, default=2, help="Untimed steps per side first.")
  parser.add_argument("--worker", choices=["bertjax", "transformers"],
                      help="(internal) Run one side's step for the parent.")
  args = parser.parse_args()
  if args.worker:
    _worker(args.worker, args.warmup)
    return
  procs, setup = {}, {}
  try:
    for name in SIDES:  # One at a time, so that compiles do not overlap.
      procs[name], setup[name] = _start(name, args.warmup)
    rates = {name: [] for name in SIDES}
    faults = {name: [] for name in SIDES}
    for r in range(args.rounds):
      for name in (list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]):
        procs[name].stdin.write(f"{args.steps}\n")
        procs[name].stdin.flush()
        seconds, minflt = procs[name].stdout.readline().split()
        rates[name].append(BATCH * args.steps / float(seconds))
        faults[name].append(int(minflt) / args.steps)
  finally:
    for proc in procs.values():
      proc.stdin.close()
      proc.wait()
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind} x {jax.device_count()}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
  print(f"L={LAYERS} H={HIDDEN} A={HEADS} F={FFN} vocab {VOCAB}, batch {BATCH} x {SEQ}, "
        f"{PREDICTIONS} predictions, fp32, dropout {DROPOUT}")
  print(f"bertjax's side: what BERTJAX_HOST_MALLOC=auto runs a hidden size of {HIDDEN} with, "
        f"GLIBC_TUNABLES={AUTO or '(unset)'} (auto takes the tunables at "
        f"{hostmem.AUTO_MIN_HIDDEN} or more, glibc's defaults below)")
  print("setup + compile  " + ", ".join(f"{k} {v:.1f} s" for k, v in setup.items()))
  for name in SIDES:
    print(f"{name:31s} sequences/s {_summary(rates[name])} over {args.rounds} rounds "
          f"of {args.steps} steps; minor page faults/step {statistics.median(faults[name]):,.0f}")
  for name, reference in (("bertjax", "transformers"),
                          ("bertjax, glibc defaults", "transformers"),
                          ("bertjax", "transformers, bertjax's malloc")):
    ratios = [a / b for a, b in zip(rates[name], rates[reference])]
    print(f"{name} / {reference}  {_summary(ratios)} (paired rounds); per round: "
          f"{' '.join(f'{x:.2f}' for x in ratios)}")


if __name__ == "__main__":
  main()
