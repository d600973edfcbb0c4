"""The CPU train step under each glibc malloc setting, for the models `auto` chooses between.

  python -m bertjax.benchmarks.malloc_bench [--sizes demo,l4] [--pairs 3]

times bertjax's pretraining train step (configs/base.py with the sizes below,
synthetic batches, fp32) in fresh processes, one per setting and size:
glibc's defaults, TUNABLES (bertjax/records/hostmem.py: one arena, no mmap,
a 2 GiB trim threshold) and KEEP_FREED (the same without the one arena); in
alternating order, --pairs times. Each process compiles, warms up and times
--windows windows of steps; printed are sequences/s and minor page faults
per step (median and range over every window of a setting) with the load
average, and which setting BERTJAX_HOST_MALLOC=auto takes for the size.

  demo  configs/tiny.py's model: L=2, H=128, A=2, F=512, a 3,000-token vocab,
        batch 8 x 128, 20 predictions, no dropout
  l4    step_vs_hf's: L=4, H=256, A=4, F=1024, the 30,522-token vocab, batch
        32 x 128, 20 predictions, dropout 0.1
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from bertjax.records import hostmem

SIZES = {
    "demo": dict(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512,
                 vocab_size=3000, batch=8, steps=60, dropout=0.0),
    "l4": dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024,
               vocab_size=30522, batch=32, steps=6, dropout=0.1),
}
SETTINGS = {"glibc's defaults": "", "TUNABLES": hostmem.TUNABLES,
            "KEEP_FREED": hostmem.KEEP_FREED}


def _worker(size: str, windows: int):
  """Times one size's step in this process; prints sequences/s of each window."""
  import jax  # pylint: disable=g-import-not-at-top
  from bertjax.input import device as device_lib  # pylint: disable=g-import-not-at-top
  from bertjax.input.synthetic import SyntheticSource  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import step_setup  # pylint: disable=g-import-not-at-top
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.path.insert(0, os.path.join(repo, "configs"))
  import base  # pylint: disable=g-import-not-at-top
  s = SIZES[size]
  config = base.get_config()
  config.model.update(hidden_size=s["hidden_size"], num_layers=s["num_layers"],
                      num_heads=s["num_heads"], intermediate_size=s["intermediate_size"],
                      vocab_size=s["vocab_size"], dtype="float32",
                      hidden_dropout_rate=s["dropout"], attention_dropout_rate=s["dropout"])
  config.phases.seq128.update(global_batch_size=s["batch"])
  model_config, phase, mesh, rules, model, tx = step_setup.build(config, jax.devices(),
                                                                 phase_name="seq128")
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
  source = SyntheticSource(s["batch"], max_seq_length=phase.max_seq_length,
                           max_predictions_per_seq=phase.max_predictions_per_seq,
                           vocab_size=model_config.vocab_size, seed=0)
  batch = device_lib.to_global(source.batch(0), sharding_lib.batch_sharding(mesh))
  rng = jax.random.key(1)
  with sharding_lib.mesh_context(mesh, rules):
    step = step_lib.jit_train_step(shardings, mesh, objective=config.objective)
    for _ in range(4):  # Compile and warm up.
      state, metrics = step(state, batch, rng)
    jax.block_until_ready(metrics)
    rates, faults = [], []
    for _ in range(windows):
      start = time.perf_counter()
      before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      for _ in range(s["steps"]):
        state, metrics = step(state, batch, rng)
      jax.block_until_ready(metrics)
      rates.append(s["batch"] * s["steps"] / (time.perf_counter() - start))
      faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / s["steps"])
  print(json.dumps({"rates": rates, "faults": faults,
                    "started_with": hostmem.tunables_at_start()}))


def _run(size: str, tunables: str, windows: int) -> dict[str, list[float]]:
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", hostmem.SETTING)}
  env["JAX_PLATFORMS"] = "cpu"
  if tunables:
    env["GLIBC_TUNABLES"] = tunables
  out = subprocess.run([sys.executable, "-m", "bertjax.benchmarks.malloc_bench", "--worker",
                        size, "--windows", str(windows)], env=env, capture_output=True,
                       text=True, check=True).stdout
  result = json.loads(out.strip().splitlines()[-1])
  if (result["started_with"] or "") != tunables:
    raise RuntimeError(f"the worker started with {result['started_with']!r}, not {tunables!r}")
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="demo,l4")
  parser.add_argument("--pairs", type=int, default=3, help="Rounds of all settings.")
  parser.add_argument("--windows", type=int, default=3)
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    _worker(args.worker, args.windows)
    return
  for size in args.sizes.split(","):
    if size not in SIZES:
      parser.error(f"--sizes: {size!r} is not one of {sorted(SIZES)}")
    rates = {name: [] for name in SETTINGS}
    faults = {name: [] for name in SETTINGS}
    loads = []
    for r in range(args.pairs):
      order = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
      for name in order:
        loads.append(os.getloadavg()[0])
        result = _run(size, SETTINGS[name], args.windows)
        rates[name] += result["rates"]
        faults[name] += result["faults"]
    auto = hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu"}, SIZES[size]["hidden_size"])
    auto_name = next(name for name, value in SETTINGS.items() if value == (auto or ""))
    print(f"{size} (hidden {SIZES[size]['hidden_size']}; BERTJAX_HOST_MALLOC=auto takes "
          f"{auto_name}), load average {min(loads):.1f}-{max(loads):.1f} on "
          f"{os.cpu_count()} CPUs:")
    for name, values in rates.items():
      print(f"  {name:16s} {statistics.median(values):7.1f} sequences/s "
            f"({min(values):.1f}-{max(values):.1f}, {len(values)} windows); minor page "
            f"faults/step {statistics.median(faults[name]):,.0f} "
            f"({min(faults[name]):,.0f}-{max(faults[name]):,.0f})")


if __name__ == "__main__":
  main()
