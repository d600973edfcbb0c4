"""Time to quality: the paper's pretraining recipe against the modern one, at demo scale.

  python -m bertjax.benchmarks.time_to_quality --workdir=/tmp/ttq [--total_steps=4800]
      [--checkpoints=16] [--eval_batches=40] [--modern_lr_scale=2.0] [--side_by_side]

Pretrains the demo model (configs/tiny.py: the paper's recipe, mlm+nsp with
static 15% masks, lengths 128 then 512) and the modern recipe
(configs/modern.py scaled to the demo by benchmarks/recipes.scaled_to_demo:
mlm on full sentences, 30% dynamic masking, length 128 only, MosaicBERT's
optimizer and schedule shape; tiny.py's batch size, and a peak learning rate
1.25x tiny.py's, MosaicBERT's rate against the paper's at equal batch size;
--modern_lr_scale sets another multiple of tiny.py's rate) for the same
number of steps, each in its own process, one after the other (paper
first), each alone on the machine (recipes.pretrain_in_processes; with
--side_by_side both at once: sooner done, the same accuracy per step, but
wall times that do not compare, as the CPUs are not shared evenly). The
paper recipe's wall time is the budget: the modern run's checkpoints after
it do not count. Every checkpoint is scored on the
same held-out records (recipes.eval_pattern, 15% masking); the demo's
downstream task is fine-tuned from both final checkpoints and from the
modern run's checkpoint at half the budget. Writes
workdir/time_to_quality.png (held-out MLM accuracy against wall time),
workdir/time_to_quality.md (the table) and workdir/time_to_quality.json,
and prints the table.
"""

import argparse
import os

from bertjax.benchmarks import recipes
from bertjax.train import cli


def _plot(curves, budget, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for c in curves:
    ax.plot(c.seconds, c.mlm_accuracy, marker="o", markersize=3, label=c.name)
  ax.axvline(budget, color="gray", linestyle=":", label="budget (paper recipe's run)")
  ax.axvline(budget / 2, color="gray", linestyle="--", label="half the budget")
  ax.set_xlabel("wall seconds since the run began")
  ax.set_ylabel("held-out MLM accuracy (15% masking)")
  ax.legend(loc="lower right", fontsize=8)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def _per_step(curve) -> list[float]:
  """Wall seconds per step between consecutive checkpoints (saves and phase
  changes included)."""
  return [(t1 - t0) / (s1 - s0) for s0, s1, t0, t1 in
          zip(curve.steps, curve.steps[1:], curve.seconds, curve.seconds[1:])]


RECIPES = {"paper": "paper (mlm+nsp, 15% static)", "modern": "modern (mlm, 30% dynamic)"}


def recipe_config(name: str, total_steps: int, modern_lr_scale: float = 0.0):
  """The recipe's demo-scale config; modern_lr_scale > 0 sets the modern
  recipe's peak rate to that multiple of tiny.py's."""
  if name == "paper":
    return recipes.paper_config(total_steps)
  config = recipes.scaled_to_demo(recipes.config_module("modern").get_config(), total_steps)
  if modern_lr_scale:
    config.optimizer.learning_rate = (recipes.paper_config(total_steps).optimizer.learning_rate
                                      * modern_lr_scale)
  return config


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--total_steps", type=int, default=4800,
                      help="Steps of each recipe (docs/recipes.md measured 4800).")
  parser.add_argument("--checkpoints", type=int, default=16,
                      help="Checkpoints per run, each scored on the held-out records.")
  parser.add_argument("--eval_batches", type=int, default=40,
                      help=f"Held-out batches of {recipes.EVAL_BATCH} per checkpoint "
                      "(0: all).")
  parser.add_argument("--modern_lr_scale", type=float, default=0.0,
                      help="The modern recipe's peak learning rate as a multiple of "
                      "tiny.py's (0: 1.25, MosaicBERT's rate against the paper's at equal "
                      "batch).")
  parser.add_argument("--side_by_side", action="store_true",
                      help="Pretrain both recipes at once instead of one after the other "
                      "(the same accuracy per step; wall times that do not compare).")
  parser.add_argument("--_pretrain", choices=sorted(RECIPES), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.modern_lr_scale < 0:
    parser.error(f"--modern_lr_scale must be >= 0, got {args.modern_lr_scale}")
  cli.quiet_library_logs()
  root = os.path.abspath(args.workdir)
  if args._pretrain:  # pylint: disable=protected-access
    name = args._pretrain  # pylint: disable=protected-access
    recipes.pretrain_child(name, RECIPES[name],
                           recipe_config(name, args.total_steps, args.modern_lr_scale), root,
                           checkpoints=args.checkpoints)
    return
  os.makedirs(root, exist_ok=True)
  recipes.prepare_data([recipe_config(n, args.total_steps) for n in RECIPES], root)
  by_name = recipes.pretrain_in_processes(
      "bertjax.benchmarks.time_to_quality", list(RECIPES), root,
      [f"--workdir={root}", f"--total_steps={args.total_steps}",
       f"--checkpoints={args.checkpoints}", f"--modern_lr_scale={args.modern_lr_scale}"],
      side_by_side=args.side_by_side)
  curves = [by_name[n] for n in RECIPES]
  pattern = recipes.eval_pattern(root)
  for c in curves:
    recipes.score_curve(c, pattern, args.eval_batches or None)
  paper, new = curves
  budget = paper.seconds[-1]
  last = recipes.at_or_before(new, budget)
  half = recipes.at_or_before(new, budget / 2)
  ckpt = lambda c, i: os.path.join(c.workdir, "checkpoints", str(c.steps[i]))
  downstream = {
      "paper_final": recipes.finetune(ckpt(paper, -1), root, os.path.join(root, "ft_paper")),
      "modern_final": recipes.finetune(ckpt(new, last), root, os.path.join(root, "ft_modern")),
      "modern_half": recipes.finetune(ckpt(new, half), root,
                                      os.path.join(root, "ft_modern_half")),
  }
  reach = recipes.first_reaching(new, paper.mlm_accuracy[-1])
  rows = [
      ("paper recipe, end of budget", paper.steps[-1], paper.seconds[-1],
       paper.mlm_accuracy[-1], downstream["paper_final"]),
      ("modern recipe, end of budget", new.steps[last], new.seconds[last],
       new.mlm_accuracy[last], downstream["modern_final"]),
      ("modern recipe, half the budget", new.steps[half], new.seconds[half],
       new.mlm_accuracy[half], downstream["modern_half"]),
  ]
  command = ("python -m bertjax.benchmarks.time_to_quality "
             f"--workdir={args.workdir} --total_steps={args.total_steps} "
             f"--checkpoints={args.checkpoints} --eval_batches={args.eval_batches}"
             + (f" --modern_lr_scale={args.modern_lr_scale:g}" if args.modern_lr_scale else "")
             + (" --side_by_side" if args.side_by_side else ""))
  lines = [f"`{command}`", "",
           "| run | step | wall s | held-out MLM acc (15%) | downstream dev acc |",
           "|---|---|---|---|---|"]
  lines += [f"| {r[0]} | {r[1]} | {r[2]:.0f} | {r[3]:.4f} | {r[4]:.4f} |" for r in rows]
  lines += ["", "Modern recipe reaches the paper recipe's final held-out MLM accuracy at "
            + (f"{reach:.0f} s ({reach / budget:.0%} of the budget)." if reach is not None
               else "no checkpoint within the run.")]
  per_step = {name: _per_step(c) for name, c in zip(RECIPES, curves)}
  lines += ["", "Wall seconds per step between checkpoints, median (range): " + "; ".join(
      f"{name} {recipes.median(p):.3f} ({min(p):.3f}-{max(p):.3f})"
      for name, p in per_step.items())]
  table = "\n".join(lines)
  print(table)
  with open(os.path.join(root, "time_to_quality.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  recipes.write_json(os.path.join(root, "time_to_quality.json"),
                     {"curves": curves, "downstream": downstream, "budget_seconds": budget,
                      "modern_reaches_paper_mlm_at_seconds": reach, "command": command})
  _plot(curves, budget, os.path.join(root, "time_to_quality.png"))


if __name__ == "__main__":
  main()
