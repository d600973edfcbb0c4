"""A small grid over the demo-scale modern recipe's learning rate, warmup and
masking rate, each point scored by the downstream suite.

  python -m bertjax.studies.recipe_grid --workdir=/tmp/grid [--total_steps=2400]
      [--lr_scales=1.25,2,3] [--warmup_pcts=6,2] [--mask_rates=0.3,0.15]
      [--seed=0] [--eval_batches=40]

Coordinate search from the first value of each list (configs/modern.py's
recipe at demo scale: 1.25x tiny.py's rate, 6% warmup, 30% masking): every
learning rate at the first warmup and masking rate; then every warmup at the
best rate; then every masking rate at the best rate and warmup. "Best" is the
highest transfer mean of the suite (studies/suite.py: same_document's and
related_words' accuracy), fine-tuned from the run's final checkpoint; the
held-out MLM accuracy and the run's wall time are reported beside it. Each
run is its own process, alone on the machine (time_to_quality's runs), all on
one build of the demo data (workdir/demo_data). A point's scores are kept in
workdir/POINT/result.json: a rerun in the same workdir measures only the
points without one. Writes workdir/grid.md and
workdir/grid.json and prints the table.
"""

import argparse
import json
import os

from bertjax.studies import recipes
from bertjax.studies import suite
from bertjax.studies import time_to_quality as ttq
from bertjax.train import cli
from bertjax.train import profiling


def _floats(parser, flag, text):
  try:
    values = [float(v) for v in text.split(",") if v]
  except ValueError:
    parser.error(f"--{flag}={text}: expected numbers separated by commas")
  if not values or any(v <= 0 for v in values):
    parser.error(f"--{flag}={text}: expected one or more numbers > 0")
  return values


def coordinate_search(score, lrs, warmups, masks) -> tuple[float, float, float]:
  """(lr, warmup, mask) by coordinate search from the first value of each list:
  the learning rate with the best score(point) at the first warmup and mask,
  then the warmup at that rate, then the mask at both."""
  best = lambda points: max(points, key=score)
  lr = best([(x, warmups[0], masks[0]) for x in lrs])[0]
  warmup = best([(lr, w, masks[0]) for w in warmups])[1]
  mask = best([(lr, warmup, m) for m in masks])[2]
  return lr, warmup, mask


def point_name(lr_scale: float, warmup_pct: float, mask_rate: float) -> str:
  return f"lr{lr_scale:g}_warmup{warmup_pct:g}_mask{mask_rate:g}"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--total_steps", type=int, default=2400)
  parser.add_argument("--lr_scales", default="1.25,2,3",
                      help="Peak rates as multiples of tiny.py's; the first is the start.")
  parser.add_argument("--warmup_pcts", default="6,2",
                      help="Warmup in percent of the steps; the first is the start.")
  parser.add_argument("--mask_rates", default="0.3,0.15",
                      help="Dynamic masking rates; the first is the start.")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--eval_batches", type=int, default=40,
                      help=f"Held-out batches of {recipes.EVAL_BATCH} (0: all).")
  args = parser.parse_args()
  lrs = _floats(parser, "lr_scales", args.lr_scales)
  warmups = _floats(parser, "warmup_pcts", args.warmup_pcts)
  masks = _floats(parser, "mask_rates", args.mask_rates)
  if any(m >= 1 for m in masks):
    parser.error(f"--mask_rates={args.mask_rates}: rates must be below 1")
  cli.quiet_library_logs()
  root = os.path.abspath(args.workdir)
  os.makedirs(root, exist_ok=True)
  # Fine-tuning compiles the same programs for every checkpoint: cached (the
  # pretraining runs are other processes, untouched).
  profiling.enable_compilation_cache(os.path.join(root, "compile_cache"))
  recipes.prepare_data([ttq.recipe_config(r, args.total_steps) for r in ttq.RECIPES], root)
  data_dir = os.path.join(root, "demo_data")
  pattern = recipes.eval_pattern(root)
  results = {}

  def run(lr, warmup, mask):
    name = point_name(lr, warmup, mask)
    if name in results:
      return results[name]
    point = os.path.join(root, name)
    done = os.path.join(point, "result.json")
    if os.path.exists(done):  # Measured by an earlier invocation: kept.
      with open(done, encoding="utf-8") as f:
        results[name] = json.load(f)
      return results[name]
    os.makedirs(point, exist_ok=True)
    if not os.path.exists(os.path.join(point, "demo_data")):
      os.symlink(data_dir, os.path.join(point, "demo_data"))  # One build of the data.
    run_name = ttq._run_name("modern", args.seed)  # pylint: disable=protected-access
    curve = recipes.pretrain_in_processes(
        "bertjax.studies.time_to_quality", [run_name], point,
        [f"--workdir={point}", f"--total_steps={args.total_steps}", "--checkpoints=1",
         f"--modern_lr_scale={lr}", f"--modern_warmup_pct={warmup}",
         f"--modern_mask_rate={mask}"], side_by_side=False)[run_name]
    final = os.path.join(curve.workdir, "checkpoints", str(curve.steps[-1]))
    scores = suite.score(final, data_dir, os.path.join(point, "suite"), seed=args.seed,
                         tasks=suite.TRANSFER)
    results[name] = dict(scores, lr_scale=lr, warmup_pct=warmup, mask_rate=mask,
                         mlm_accuracy=recipes.mlm_accuracy(final, pattern,
                                                           args.eval_batches or None),
                         wall_s=curve.seconds[-1], step=curve.steps[-1])
    recipes.write_json(done, results[name])
    print(f"{name}: {results[name]}", flush=True)
    return results[name]

  lr, warmup, mask = coordinate_search(lambda p: run(*p)[suite.SUMMARY], lrs, warmups, masks)
  chosen = point_name(lr, warmup, mask)
  command = ("python -m bertjax.studies.recipe_grid "
             f"--workdir={args.workdir} --total_steps={args.total_steps} "
             f"--lr_scales={args.lr_scales} --warmup_pcts={args.warmup_pcts} "
             f"--mask_rates={args.mask_rates} --seed={args.seed} "
             f"--eval_batches={args.eval_batches}")
  lines = [f"`{command}`", "",
           "| run | lr (x tiny.py's) | warmup % | masking | same_document | related_words | "
           "transfer mean | held-out MLM acc | wall s |", "|---|---|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    label = name + (" (chosen)" if name == chosen else "")
    knobs = f"| {r['lr_scale']:g} | {r['warmup_pct']:g} | {r['mask_rate']:g}"
    lines.append(f"| {label} {knobs} | {r['same_document']:.3f} | {r['related_words']:.3f} | "
                 f"{r[suite.SUMMARY]:.3f} | {r['mlm_accuracy']:.4f} | {r['wall_s']:.0f} |")
  lines += ["", f"Chosen: --modern_lr_scale={lr:g} --modern_warmup_pct={warmup:g} "
            f"--modern_mask_rate={mask:g} (transfer mean {results[chosen][suite.SUMMARY]:.3f})."]
  table = "\n".join(lines)
  print(table)
  with open(os.path.join(root, "grid.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  recipes.write_json(os.path.join(root, "grid.json"),
                     {"results": results, "chosen": chosen, "command": command})


if __name__ == "__main__":
  main()
