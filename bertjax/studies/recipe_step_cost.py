"""What a demo-scale pretraining step costs under each recipe, one ingredient at a time.

  python -m bertjax.studies.recipe_step_cost --workdir=/tmp/step_cost [--steps=1000]
      [--rounds=2] [--variants=paper128,modern,modern_slots20,modern_static,modern_static_slots20]

Runs bertjax.main's pretraining (recipes.paper_config and recipes.modern: the
demo model, batch 8, length 128) for --steps steps per variant, each in its own
process and alone on the machine, the variants in one order and then the
reverse, --rounds times in all, and prints each run's sequences/s: the median
(and range) of the logged 100-step windows after the first, which holds the
compile. Variants:

  paper128               the paper's recipe at length 128 only (20 prediction
                         slots, static masks, NSP)
  modern                 the modern recipe (40 slots for 30% masking, dynamic)
  modern_slots20         the modern recipe at 15% masking with 20 slots
  modern_static          the modern recipe with static masks from its records
  modern_static_slots20  both of the above

Each (objective, slots) pair has its own demo data under workdir/data_*,
built before any clock starts. Writes workdir/step_cost.json.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys

import ml_collections

from bertjax.studies import recipes
from bertjax.create import demo
from bertjax.train import cli

VARIANTS = ("paper128", "modern", "modern_slots20", "modern_static", "modern_static_slots20")
_RATE = re.compile(r"([0-9.]+) seq/s")


def variant_config(name: str, steps: int, workdir: str):
  """The variant's config, its data in workdir/data_{objective}_{slots}."""
  if name == "paper128":
    config = recipes.paper_config(steps)
    config.phases = ml_collections.ConfigDict({"seq128": config.phases.seq128.to_dict()})
    config.phases.seq128.fraction = 1.0
  else:
    config = recipes.modern(steps, mask_rate=0.15 if "slots20" in name else 0.0)
    config.data.dynamic_masking = "static" not in name
  config.data.demo_dir = os.path.join(
      workdir, f"data_{config.objective}_{config.phases.seq128.max_predictions_per_seq}")
  config.logging.every_steps = 100
  config.logging.eval_every_steps = 0
  config.logging.eval_batches = 1
  config.checkpoint.every_steps = 10 * steps  # Only the final save.
  return config


def window_rates(log: str) -> list[float]:
  """The logged sequences/s of every 100-step window but the first."""
  return [float(x) for x in _RATE.findall(log)][1:]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--_run", help=argparse.SUPPRESS)
  args = parser.parse_args()
  names = [v for v in args.variants.split(",") if v]
  unknown = sorted(set(names) - set(VARIANTS))
  if unknown or not names:
    parser.error(f"--variants={args.variants}: expected names among {list(VARIANTS)}")
  if args.steps < 300:
    parser.error(f"--steps={args.steps}: give 300 or more (100-step windows after the first)")
  root = os.path.abspath(args.workdir)
  if args._run:  # pylint: disable=protected-access
    from absl import logging  # pylint: disable=g-import-not-at-top
    logging.set_verbosity(logging.INFO)
    logging.set_stderrthreshold("info")
    from bertjax.train import loop  # pylint: disable=g-import-not-at-top
    run_dir = os.path.join(root, "runs", args._run)  # pylint: disable=protected-access
    config = variant_config(args._run, args.steps, root)  # pylint: disable=protected-access
    demo.prepare_config(config, root)  # Built by the parent: only the file patterns.
    loop.train_and_evaluate(config, run_dir)
    return
  cli.quiet_library_logs()
  for name in names:  # The data first, outside every run's clock.
    demo.prepare_config(variant_config(name, args.steps, root), root)
  rates = {name: [] for name in names}
  for r in range(args.rounds):
    for name in names if r % 2 == 0 else names[::-1]:
      run_dir = os.path.join(root, "runs", name)
      subprocess.run(["rm", "-rf", run_dir], check=True)
      proc = subprocess.run(
          [sys.executable, "-m", "bertjax.studies.recipe_step_cost", f"--workdir={root}",
           f"--steps={args.steps}", f"--_run={name}"], capture_output=True, text=True,
          check=False)
      if proc.returncode:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
      w = window_rates(proc.stderr)
      rates[name].append(w)
      print(f"round {r + 1} {name}: {statistics.median(w):.1f} sequences/s "
            f"({min(w):.1f}-{max(w):.1f})", flush=True)
  print()
  print("| variant | sequences/s per round: median of 100-step windows (range) |\n|---|---|")
  for name in names:
    print(f"| {name} | " + "; ".join(f"{statistics.median(w):.1f} ({min(w):.1f}-{max(w):.1f})"
                                      for w in rates[name]) + " |")
  recipes.write_json(os.path.join(root, "step_cost.json"),
                     {"rates": rates, "steps": args.steps, "rounds": args.rounds})


if __name__ == "__main__":
  main()
