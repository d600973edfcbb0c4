"""Sequence packing: real-token share and train-step throughput, packed against unpacked.

  python -m bertjax.benchmarks.packing_bench [--mb 2] [--dupe_factor 2] [--batch 32]
      [--rounds 5] [--steps 3] [--skip_reference] [--skip_timing]
  python -m bertjax.benchmarks.packing_bench --eval_plan [--plan_records 100000,1000000]
      [--plan_pods 64x256,64x4096,256x4096]

Data, made afresh in a temporary directory:
* demo: bertjax's demo corpus (bertjax/create/demo.py) through bertjax's
  create_pretraining_data, at 128 (20 predictions) and 512 (80);
* original: `--mb` megabytes of the docstring corpus (corpus.py, no text
  repeated) through the original release's create_pretraining_data.py
  (bert-tensorflow), same lengths, short_seq_prob 0.1 as in the release;
  its records carry no metadata.json, as the release writes them.

For each: the share of real (non-padding) tokens of all token slots,
unpacked; packed for evaluation (every record once, first-fit decreasing
over all of them, in batches of --batch / 2 rows, up to 4 examples a row; the
empty rows of the last batch count as padding); and packed in
training (TrainSource: the --batch examples of each of --chunk_steps steps
into --batch / factor rows per step, first-fit decreasing) for several
packing factors, with the share of examples that fit in no row
(packing_overflow) over --train_steps steps.

Then, unless --skip_timing, the train step of a small model (L=2, H=128,
A=2, F=512, fp32, no dropout) on the original release's records at 128 and
512: the first
training batch unpacked ([batch, L]) and packed (the largest factor above
without overflow), each compiled, then alternating in --rounds rounds (order
reversed each round) of --steps steps; printed: real tokens per second
(each batch's own real tokens), median and range, and the per-round ratio
packed / unpacked.

With --eval_plan, instead: one host's cost of planning the packed evaluation
for held-out sets of --plan_records records and pods of HOSTSxGLOBAL_BATCH
(--plan_pods), packing factor 1.25 (rows rounded down to a multiple of the
hosts), 3 examples a row, length 128 and 20 predictions. Half the records are
full length and the others uniform in [8, 128] tokens (75% real tokens, as
docs/packing.md measures on the original release's records at 128), with
min(20, max(1, round(0.15 x tokens))) predictions, as the release masks.
Every host's plan is made as evaluation makes it: packing.EvalPacker over
the sizes of its contiguous share of the records, given those sizes, so the
size pass itself (reading and parsing the share's records) is not timed:
printed instead is the number of records it reads on a host, which its cost
is proportional to. Printed: the records read per host, the fewest and most
seconds any host spends planning, and the packed batches every host runs
(the most any host needs) against the unpacked count.
"""

import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from bertjax.benchmarks import create_data_bench
from bertjax.benchmarks import step_vs_hf
from bertjax.create import demo
from bertjax.input import evaluation
from bertjax.input import packing as packing_lib
from bertjax.input import pipeline

LENGTHS = {128: 20, 512: 80}
FACTORS = (1.1, 1.25, 1.5, 2.0, 3.0)
PER_ROW = 4  # packing max_examples_per_row


def _eval(pattern, length, batch, **kw):
  return evaluation.eval_batches(pattern, batch, max_seq_length=length,
                               max_predictions_per_seq=LENGTHS[length], process_index=0,
                               process_count=1, **kw)


def _train_source(pattern, length, batch, factor=None, chunk_steps=1):
  packing = None if factor is None else {
      "rows": int(batch / factor), "max_examples_per_row": PER_ROW, "chunk_steps": chunk_steps}
  return pipeline.TrainSource(pattern, batch, max_seq_length=length,
                              max_predictions_per_seq=LENGTHS[length], seed=0, process_index=0,
                              process_count=1, packing=packing)


def shares(pattern: str, length: int, batch: int, train_steps: int, chunk_steps: int) -> dict:
  """Real-token shares unpacked, eval-packed and train-packed per factor."""
  real = slots = records = 0
  for b in _eval(pattern, length, batch):
    real += int(b["input_mask"].sum())
    slots += b["input_mask"].size
    records += int(b["example_weights"].sum())
  out = {"records": records, "unpacked": real / slots}
  rows = packed_real = 0
  for b in _eval(pattern, length, batch,
                 packing={"rows": batch // 2, "max_examples_per_row": PER_ROW}):
    rows += len(b["input_ids"])
    packed_real += int(b["input_mask"].sum())
  assert packed_real == real, "packed evaluation lost or repeated tokens"
  out["eval_packed"] = real / (rows * length)
  out["train"] = {}
  for factor in FACTORS:
    source = _train_source(pattern, length, batch, factor, chunk_steps)
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
  return step_vs_hf.compiled_train_step(config, jax.device_put(batch), vocab_size)


def throughput(pattern: str, length: int, batch: int, factor: float, chunk_steps: int,
               vocab_size: int, rounds: int, steps: int) -> dict:
  """Real tokens/s of the train step, unpacked and packed, alternating."""
  batches = {"unpacked": next(_train_source(pattern, length, batch).iterate(0)),
             "packed": next(_train_source(pattern, length, batch, factor,
                                          chunk_steps).iterate(0))}
  real = {name: int(b["input_mask"].sum()) for name, b in batches.items()}
  runs = {name: compiled_step(b, vocab_size, length) for name, b in batches.items()}
  for run in runs.values():
    step_vs_hf._seconds(run, 2)  # pylint: disable=protected-access
  rates = {name: [] for name in runs}
  for r in range(rounds):
    for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
      seconds = step_vs_hf._seconds(runs[name], steps)  # pylint: disable=protected-access
      rates[name].append(real[name] * steps / seconds)
  ratios = [p / u for p, u in zip(rates["packed"], rates["unpacked"])]
  return {"rows": {name: len(b["input_ids"]) for name, b in batches.items()},
          "real": real, "rates": rates, "ratios": ratios}


def release_like_sizes(n: int, length: int, max_predictions: int, seed: int = 0):
  """(tokens [n], predictions [n]) drawn as the --eval_plan docstring says."""
  rng = np.random.default_rng(seed)
  tokens = np.where(rng.random(n) < 0.5, length, rng.integers(8, length + 1, n))
  predictions = np.clip(np.round(0.15 * tokens), 1, max_predictions).astype(np.int64)
  return tokens.astype(np.int64), predictions


def eval_plan_cost(records: int, hosts: int, global_batch: int, length: int = 128,
                   max_predictions: int = 20, factor: float = 1.25) -> dict:
  """Records read and seconds spent planning by each host, each over its share."""
  tokens, predictions = release_like_sizes(records, length, max_predictions)
  real = np.ones(records, bool)
  rows = max(1, int(global_batch / factor / hosts)) * hosts
  p = packing_lib.from_options({"rows": rows}, process_count=hosts, max_seq_length=length,
                               max_predictions_per_seq=max_predictions)
  seconds, batches, read = [], [], []
  for host in range(hosts):
    lo, hi = host * records // hosts, (host + 1) * records // hosts
    start = time.perf_counter()
    packer = packing_lib.EvalPacker(p, tokens[lo:hi], predictions[lo:hi], real[lo:hi],
                                    first_record=lo)
    seconds.append(time.perf_counter() - start)
    batches.append(packer.num_batches)
    read.append(hi - lo)
  return {"rows": rows, "seconds": (min(seconds), max(seconds)), "batches": max(batches),
          "read": (min(read), max(read)), "unpacked_batches": -(-records // global_batch)}


def print_eval_plan_costs(records_list, pods) -> None:
  for records in records_list:
    for hosts, global_batch in pods:
      c = eval_plan_cost(records, hosts, global_batch)
      print(f"{records:,} records, {hosts} hosts, global batch {global_batch} "
            f"({c['rows']} packed rows): size pass reads {c['read'][0]:,}-{c['read'][1]:,} "
            f"records a host; plan {c['seconds'][0]:.4f}-{c['seconds'][1]:.4f} s a host; "
            f"{c['batches']} packed batches against {c['unpacked_batches']} unpacked",
            flush=True)


def _range(values, fmt="{:,.0f}"):
  return (f"median {fmt.format(statistics.median(values))} "
          f"(range {fmt.format(min(values))}-{fmt.format(max(values))})")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mb", type=float, default=2.0, help="Docstring corpus megabytes.")
  parser.add_argument("--dupe_factor", type=int, default=2)
  parser.add_argument("--batch", type=int, default=32, help="Examples per step.")
  parser.add_argument("--train_steps", type=int, default=32,
                      help="Training steps read per packing factor (whole chunks).")
  parser.add_argument("--chunk_steps", type=int, default=16,
                      help="data.packing_chunk_steps: steps packed together.")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--skip_reference", action="store_true",
                      help="Leave out the original release's records (and the timing).")
  parser.add_argument("--skip_timing", action="store_true",
                      help="Print the real-token shares only, without timing the train step.")
  parser.add_argument("--eval_plan", action="store_true",
                      help="Only the per-host cost of planning the packed evaluation on a pod.")
  parser.add_argument("--plan_records", default="100000,1000000",
                      help="--eval_plan: held-out record counts, comma-separated.")
  parser.add_argument("--plan_pods", default="64x256,64x4096,256x4096",
                      help="--eval_plan: HOSTSxGLOBAL_BATCH, comma-separated.")
  args = parser.parse_args()
  if args.eval_plan:
    print_eval_plan_costs([int(n) for n in args.plan_records.split(",")],
                          [tuple(int(x) for x in pod.split("x"))
                           for pod in args.plan_pods.split(",")])
    return
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
      if args.train_steps % args.chunk_steps:
        raise SystemExit("--train_steps must be a multiple of --chunk_steps")
      s = shares(pattern, length, args.batch, args.train_steps, args.chunk_steps)
      print(f"{name}: {s['records']} records; real tokens {100 * s['unpacked']:.1f}% "
            f"unpacked, {100 * s['eval_packed']:.1f}% packed for evaluation (every record)")
      for factor, (share, overflow) in s["train"].items():
        print(f"  train, packing_factor {factor}: {args.batch} examples in "
              f"{int(args.batch / factor)} rows, real tokens {100 * share:.1f}%, "
              f"overflow {100 * overflow:.1f}% of examples")
        if overflow == 0:
          best[name] = factor
    for length in () if args.skip_timing else LENGTHS:
      name = f"original {length}"
      if name not in data or name not in best:
        continue
      t = throughput(data[name][0], length, args.batch, best[name], args.chunk_steps,
                     vocab_size, args.rounds, args.steps)
      print(f"{name}: train step, {t['rows']['unpacked']} rows ({t['real']['unpacked']} real "
            f"tokens) unpacked vs {t['rows']['packed']} rows ({t['real']['packed']}) packed "
            f"(packing_factor {best[name]}), real tokens/s: unpacked "
            f"{_range(t['rates']['unpacked'])}, packed {_range(t['rates']['packed'])}; "
            f"packed/unpacked {_range(t['ratios'], '{:.2f}')}")


if __name__ == "__main__":
  main()
