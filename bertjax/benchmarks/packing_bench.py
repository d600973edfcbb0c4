"""Sequence packing: real-token share and train-step throughput, packed against unpacked.

  python -m bertjax.benchmarks.packing_bench [--mb 2] [--dupe_factor 2] [--batch 32]
      [--rounds 5] [--steps 3] [--skip_reference]

Data, made afresh in a temporary directory:
* demo: bertjax's demo corpus (bertjax/create/demo.py) through bertjax's
  create_pretraining_data, at 128 (20 predictions) and 512 (80);
* original: `--mb` megabytes of the docstring corpus (corpus.py, no text
  repeated) through the original release's create_pretraining_data.py
  (bert-tensorflow), same lengths, short_seq_prob 0.1 as in the release;
  its records carry no metadata.json, as the release writes them.

For each: the share of real (non-padding) tokens of all token slots,
unpacked; packed for evaluation (every record once, first-fit in file order
into rows of --batch / 2 per batch); and packed in training (TrainSource,
each step's --batch examples into --batch / factor rows by first-fit
decreasing) for several packing factors, with the share of examples that
fit in no row (packing_overflow) over --train_steps steps.

Then the train step of a small model (L=2, H=128, A=2, F=512, fp32, no
dropout) on the original release's records at 128 and 512: one step's
examples unpacked ([batch, L]) and packed (the largest factor above without
overflow), each compiled, then alternating in --rounds rounds (order
reversed each round) of --steps steps; printed: real tokens per second,
median and range, and the per-round ratio packed / unpacked.
"""

import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from bertjax import benchmark
from bertjax.benchmarks import create_data_bench
from bertjax.benchmarks import step_vs_hf
from bertjax.create import demo
from bertjax.input import packing
from bertjax.input import pipeline
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib

LENGTHS = {128: 20, 512: 80}
FACTORS = (1.25, 1.5, 2.0, 3.0, 4.0)


def _eval(pattern, length, batch, **kw):
  return pipeline.eval_batches(pattern, batch, max_seq_length=length,
                               max_predictions_per_seq=LENGTHS[length], process_index=0,
                               process_count=1, **kw)


def shares(pattern: str, length: int, batch: int, train_steps: int) -> dict:
  """Real-token shares unpacked, eval-packed and train-packed per factor."""
  real = slots = records = 0
  for b in _eval(pattern, length, batch):
    real += int(b["input_mask"].sum())
    slots += b["input_mask"].size
    records += int(b["next_sentence_weights"].sum())
  out = {"records": records, "unpacked": real / slots}
  per_row = max(FACTORS)
  rows = packed_real = 0
  for b in _eval(pattern, length, batch,
                 packing={"rows": batch // 2, "max_examples_per_row": int(per_row)}):
    rows += len(b["input_ids"])
    packed_real += int(b["input_mask"].sum())
  assert packed_real == real, "packed evaluation lost or repeated tokens"
  out["eval_packed"] = real / (rows * length)
  out["train"] = {}
  for factor in FACTORS:
    source = pipeline.TrainSource(
        pattern, batch, max_seq_length=length, max_predictions_per_seq=LENGTHS[length],
        seed=0, process_index=0, process_count=1,
        packing={"rows": int(batch / factor), "max_examples_per_row": int(per_row)})
    it = source.iterate(0)
    real_t = slots_t = 0
    for _ in range(train_steps):
      b = next(it)
      real_t += int(b["input_mask"].sum())
      slots_t += b["input_mask"].size
    it.close()
    overflow = source.stats()["packing_overflow"] / (train_steps * batch)
    out["train"][factor] = (real_t / slots_t, overflow)
  return out


def _model_config(vocab_size: int, length: int):
  config = step_vs_hf._base_config()  # pylint: disable=protected-access
  m = config.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads = vocab_size, 128, 2, 2
  m.intermediate_size, m.hidden_dropout_rate, m.attention_dropout_rate = 512, 0.0, 0.0
  phase = config.phases.seq128
  phase.max_seq_length, phase.max_predictions_per_seq = length, LENGTHS[length]
  return config


def compiled_step(batch, vocab_size: int, length: int):
  """() -> runs one train step on `batch` (state kept inside), compiled."""
  config = _model_config(vocab_size, length)
  config.phases.seq128.global_batch_size = len(batch["input_ids"])
  _, _, mesh, rules, model, tx = benchmark.build(config, jax.devices(), phase_name="seq128",
                                                 vocab_size=vocab_size)
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
  batch = jax.device_put(batch)
  rng = jax.random.key(1)
  with sharding_lib.mesh_context(mesh, rules):
    step_fn = step_lib.jit_train_step(shardings, mesh).lower(state, batch, rng).compile()
  holder = {"state": state}

  def run():
    holder["state"], metrics = step_fn(holder["state"], batch, rng)
    return metrics["loss"]
  return run


def throughput(pattern: str, length: int, batch: int, factor: float, vocab_size: int,
               rounds: int, steps: int) -> dict:
  """Real tokens/s of the train step, unpacked and packed, alternating."""
  kw = dict(max_seq_length=length, max_predictions_per_seq=LENGTHS[length], seed=0,
            process_index=0, process_count=1)
  plain_src = pipeline.TrainSource(pattern, batch, **kw)
  packed_src = pipeline.TrainSource(pattern, batch, **kw, packing={
      "rows": int(batch / factor), "max_examples_per_row": int(max(FACTORS))})
  plain, packed = next(plain_src.iterate(0)), next(packed_src.iterate(0))
  real = int(plain["input_mask"].sum())
  assert int(packed["input_mask"].sum()) == real, "packing overflowed on the timed step"
  runs = {"unpacked": compiled_step(plain, vocab_size, length),
          "packed": compiled_step(packed, vocab_size, length)}
  for run in runs.values():
    step_vs_hf._seconds(run, 2)  # pylint: disable=protected-access
  rates = {name: [] for name in runs}
  for r in range(rounds):
    for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
      seconds = step_vs_hf._seconds(runs[name], steps)  # pylint: disable=protected-access
      rates[name].append(real * steps / seconds)
  ratios = [p / u for p, u in zip(rates["packed"], rates["unpacked"])]
  return {"rows": (len(plain["input_ids"]), len(packed["input_ids"])), "rates": rates,
          "ratios": ratios}


def _range(values, fmt="{:,.0f}"):
  return (f"median {fmt.format(statistics.median(values))} "
          f"(range {fmt.format(min(values))}-{fmt.format(max(values))})")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mb", type=float, default=2.0, help="Docstring corpus megabytes.")
  parser.add_argument("--dupe_factor", type=int, default=2)
  parser.add_argument("--batch", type=int, default=32, help="Examples per step.")
  parser.add_argument("--train_steps", type=int, default=20)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--skip_reference", action="store_true",
                      help="Leave out the original release's records (and the timing).")
  args = parser.parse_args()
  print(f"devices: {jax.devices()}")
  with tempfile.TemporaryDirectory() as tmp:
    paths = demo.ensure_demo_data(os.path.join(tmp, "demo"), dupe_factor=args.dupe_factor,
                                  eval_dupe_factor=1, phases=LENGTHS, log=lambda *a: None)
    data = {f"demo {n}": (paths["train"][n], n) for n in LENGTHS}
    vocab_size = None
    if not args.skip_reference:
      corpus, vocab = create_data_bench.build_corpus(tmp, args.mb, vocab_size=8000)
      with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
      for n, p in LENGTHS.items():
        out = os.path.join(tmp, f"original_{n}.tfrecord")
        create_data_bench.run_original(corpus, vocab, out, n, p, args.dupe_factor)
        data[f"original {n}"] = (out, n)
    best = {}
    for name, (pattern, length) in data.items():
      s = shares(pattern, length, args.batch, args.train_steps)
      print(f"{name}: {s['records']} records; real tokens {100 * s['unpacked']:.1f}% "
            f"unpacked, {100 * s['eval_packed']:.1f}% packed for evaluation (every record)")
      for factor, (share, overflow) in s["train"].items():
        print(f"  train, packing_factor {factor}: {args.batch} examples in "
              f"{int(args.batch / factor)} rows, real tokens {100 * share:.1f}%, "
              f"overflow {100 * overflow:.1f}% of examples")
        if overflow == 0:
          best[name] = factor
    for length in LENGTHS:
      name = f"original {length}"
      if name not in data or name not in best:
        continue
      t = throughput(data[name][0], length, args.batch, best[name], vocab_size, args.rounds,
                     args.steps)
      print(f"{name}: train step, {t['rows'][0]} rows unpacked vs {t['rows'][1]} packed "
            f"(packing_factor {best[name]}), real tokens/s: unpacked "
            f"{_range(t['rates']['unpacked'])}, packed {_range(t['rates']['packed'])}; "
            f"packed/unpacked {_range(t['ratios'], '{:.2f}')}")


if __name__ == "__main__":
  main()
