"""Time to quality: the paper's pretraining recipe against the modern one, at demo
scale, over several seeds, with a projection to BERT-BASE on one H100.

  python -m bertjax.studies.time_to_quality --workdir=/tmp/ttq [--total_steps=5600]
      [--checkpoints=8] [--seeds=0,1,2] [--eval_batches=40] [--modern_lr_scale=3]
      [--modern_warmup_pct=0] [--modern_mask_rate=0] [--base_step_ms=...]

Pretrains the demo model (configs/tiny.py: the paper's recipe, mlm+nsp with
static 15% masks, lengths 128 then 512) and the modern recipe
(configs/modern.py scaled to the demo by recipes.scaled_to_demo: mlm on full
sentences, 30% dynamic masking, length 128 only, MosaicBERT's optimizer and
schedule shape; tiny.py's batch size; --modern_* set its peak rate, warmup
and masking rate, by default 3x tiny.py's rate, 6% and 30%, recipe_grid's
choice) for the same number of steps, once per seed (the seed of
initialisation, data order, masking and fine-tuning), each run in its own
process and alone on the machine, the two recipes alternating which goes
first from one seed to the next.

Every checkpoint is scored on the same held-out records (recipes.eval_pattern,
15% masking). The paper run's final checkpoint is fine-tuned on the whole
downstream suite (studies/suite.py); its held-out MLM accuracy and its
transfer mean (the suite's tasks on which a bag of words is at chance:
same_document and related_words) are the targets of the modern run of the same
seed, whose checkpoints are fine-tuned on those tasks in order until
one reaches the target (and its final checkpoint on the whole suite).
Random initialisation and the bag-of-words baseline are scored beside them.
A rerun in the same workdir keeps the finished runs (recipes.
pretrain_in_processes) and scores them again. For each recipe and target the
table gives the steps, the analytic model FLOPs (recipes.train_flops, what the logs' MFU
counts), the wall seconds (each checkpoint's save time since its run began)
and a projection to BERT-BASE on one H100: the steps to the target, phase by
phase, times each recipe's measured BASE step time at that phase
(BASE_STEP_MS, or --base_step_ms), all as median (range) over the seeds.
The paper recipe reaches its own targets at its final step, by definition.

Writes workdir/time_to_quality.{md,json,png} and prints the table.
"""

import argparse
import os
from typing import Optional

from bertjax.studies import recipes
from bertjax.studies import suite
from bertjax.convert import export
from bertjax.train import cli
from bertjax.train import profiling

RECIPES = {"paper": "paper (mlm+nsp, 15% static)", "modern": "modern (mlm, dynamic masking)"}
SUMMARY = suite.SUMMARY  # The downstream target: studies/suite.py's summary figure.

# BERT-BASE's train step at batch 256, ms, by (recipe, phase), and where each
# was measured (docs/benchmarks.md, "Train step on one GPU": one run of
# bertjax.benchmarks.step_bench each). The paper's seq512 step does not fit one
# H100 at batch 256 (83.93 GiB needed), so its only measurement is the H200's,
# whose peak bf16 rate is the H100's but whose memory is faster: it prices the
# paper recipe's long phase at or below what an H100 would take.
BASE_STEP_MS = {
    ("paper", "seq128"): (93.4, "H100 80GB, configs/base.py seq128, XLA attention"),
    ("paper", "seq512"): (448.1, "H200, configs/base.py seq512, XLA attention"),
    ("modern", "seq128"): (77.6, "H100 80GB, configs/modern.py seq128 at batch 256, cuDNN "
                                 "attention"),
}


def recipe_config(name: str, total_steps: int, *, seed: int = 0, lr_scale: float = 0.0,
                  warmup_pct: float = 0.0, mask_rate: float = 0.0):
  """The recipe's demo-scale config with `seed`. For the modern recipe: lr_scale
  > 0 sets its peak rate to that multiple of tiny.py's; warmup_pct > 0 its
  warmup to that percentage of total_steps; mask_rate > 0 its masking rate,
  with prediction slots for that share of a 128-token row (recipes.modern)."""
  if name == "paper":
    config = recipes.paper_config(total_steps)
  else:
    config = recipes.modern(total_steps, lr_scale=lr_scale, warmup_pct=warmup_pct,
                            mask_rate=mask_rate)
  config.seed = seed
  return config


def _run_name(recipe: str, seed: int) -> str:
  return f"{recipe}_seed{seed}"


def _parse_run_name(name: str) -> tuple[str, int]:
  recipe, _, seed = name.rpartition("_seed")
  return recipe, int(seed)


def parse_step_ms(spec: str) -> dict[tuple[str, str], tuple[float, str]]:
  """BASE_STEP_MS with the entries of "recipe.phase=ms,..." replaced."""
  out = dict(BASE_STEP_MS)
  for item in filter(None, spec.split(",")):
    key, sep, value = item.partition("=")
    recipe, dot, phase = key.partition(".")
    try:
      ms = float(value)
    except ValueError:
      ms = -1.0
    if not sep or not dot or (recipe, phase) not in BASE_STEP_MS or ms <= 0:
      raise SystemExit(f"--base_step_ms={spec}: expected RECIPE.PHASE=MS with MS > 0 and "
                       f"RECIPE.PHASE one of {sorted('.'.join(k) for k in BASE_STEP_MS)}; "
                       f"got {item!r}")
    out[(recipe, phase)] = (ms, "given with --base_step_ms")
  return out


def projected_hours(recipe: str, config, step: int, step_ms) -> float:
  """Hours of BERT-BASE training at batch 256 for the steps that the demo run
  took to `step`, each priced at the recipe's BASE step time for its phase."""
  return sum(n * step_ms[(recipe, phase)][0] for phase, n in
             recipes.phase_steps(config, step).items()) / 1e3 / 3600


def _reach(recipe: str, config, model_config, curve, index: Optional[int], step_ms):
  if index is None:
    return None
  step = curve.steps[index]
  return {"step": step, "pflops": recipes.train_flops(config, model_config, step) / 1e15,
          "wall_s": curve.seconds[index],
          "base_h100_hours": projected_hours(recipe, config, step, step_ms)}


def _first(values, target) -> Optional[int]:
  return next((i for i, v in enumerate(values) if v is not None and v >= target), None)


def _plot(curves, downstream_points, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.0))
  colors = {"paper": "tab:blue", "modern": "tab:orange"}
  for name, c in curves.items():
    recipe, seed = _parse_run_name(name)
    ax.plot(c.seconds, c.mlm_accuracy, marker="o", markersize=2, color=colors[recipe],
            alpha=0.8, label=RECIPES[recipe] if seed == min(
                _parse_run_name(n)[1] for n in curves) else None)
    points = downstream_points.get(name, [])
    if points:
      bx.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
              color=colors[recipe], alpha=0.8)
  ax.set_xlabel("wall seconds since the run began")
  ax.set_ylabel("held-out MLM accuracy (15% masking)")
  ax.legend(loc="lower right", fontsize=8)
  bx.set_xlabel("wall seconds since the run began")
  bx.set_ylabel("transfer mean (same_document, related_words)")
  for a in (ax, bx):
    a.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--total_steps", type=int, default=5600,
                      help="Steps of each run (5600: the demo's, configs/tiny.py).")
  parser.add_argument("--checkpoints", type=int, default=8,
                      help="Checkpoints per run, each scored on the held-out records.")
  parser.add_argument("--seeds", default="0,1,2", help="Seeds, comma-separated.")
  parser.add_argument("--eval_batches", type=int, default=40,
                      help=f"Held-out batches of {recipes.EVAL_BATCH} per checkpoint "
                      "(0: all).")
  parser.add_argument("--modern_lr_scale", type=float, default=3.0,
                      help="The modern recipe's peak learning rate as a multiple of "
                      "tiny.py's: 3 was studies/recipe_grid's choice (docs/recipes.md); "
                      "0: recipes.scaled_to_demo's 1.25.")
  parser.add_argument("--modern_warmup_pct", type=float, default=0.0,
                      help="The modern recipe's warmup in percent of the steps (0: 6).")
  parser.add_argument("--modern_mask_rate", type=float, default=0.0,
                      help="The modern recipe's masking rate (0: configs/modern.py's).")
  parser.add_argument("--base_step_ms", default="",
                      help="RECIPE.PHASE=MS,...: BERT-BASE step times for the projection "
                      "instead of BASE_STEP_MS's (paper.seq128, paper.seq512, modern.seq128).")
  parser.add_argument("--_pretrain", help=argparse.SUPPRESS)
  args = parser.parse_args()
  for flag in ("modern_lr_scale", "modern_warmup_pct", "modern_mask_rate"):
    if getattr(args, flag) < 0:
      parser.error(f"--{flag} must be >= 0, got {getattr(args, flag)}")
  if not 0 <= args.modern_mask_rate < 1:
    parser.error(f"--modern_mask_rate must be in [0, 1), got {args.modern_mask_rate}")
  seeds = recipes.parse_seeds(parser, args.seeds)
  step_ms = parse_step_ms(args.base_step_ms)
  cli.quiet_library_logs()
  root = os.path.abspath(args.workdir)
  modern = dict(lr_scale=args.modern_lr_scale, warmup_pct=args.modern_warmup_pct,
                mask_rate=args.modern_mask_rate)
  config_of = lambda r, s: recipe_config(r, args.total_steps, seed=s,
                                         **(modern if r == "modern" else {}))
  if args._pretrain:  # pylint: disable=protected-access
    recipe, seed = _parse_run_name(args._pretrain)  # pylint: disable=protected-access
    recipes.pretrain_child(args._pretrain, RECIPES[recipe], config_of(recipe, seed), root,  # pylint: disable=protected-access
                           checkpoints=args.checkpoints)
    return
  os.makedirs(root, exist_ok=True)
  # Fine-tuning compiles the same programs for every checkpoint: cached (the
  # pretraining runs are other processes, untouched).
  profiling.enable_compilation_cache(os.path.join(root, "compile_cache"))
  recipes.prepare_data([config_of(r, 0) for r in RECIPES], root)
  data_dir = os.path.join(root, "demo_data")
  order = []
  for i, seed in enumerate(seeds):
    pair = [_run_name(r, seed) for r in RECIPES]
    order += pair if i % 2 == 0 else pair[::-1]
  curves = recipes.pretrain_in_processes(
      "bertjax.studies.time_to_quality", order, root,
      [f"--workdir={root}", f"--total_steps={args.total_steps}",
       f"--checkpoints={args.checkpoints}", f"--modern_lr_scale={args.modern_lr_scale}",
       f"--modern_warmup_pct={args.modern_warmup_pct}",
       f"--modern_mask_rate={args.modern_mask_rate}"], side_by_side=False)
  pattern = recipes.eval_pattern(root)
  for c in curves.values():
    recipes.score_curve(c, pattern, args.eval_batches or None)

  ckpt = lambda c, i: os.path.join(c.workdir, "checkpoints", str(c.steps[i]))
  results, points = {}, {}
  bag = suite.bag_of_words(data_dir)
  for seed in seeds:
    paper, new = (curves[_run_name(r, seed)] for r in RECIPES)
    suite_dir = lambda name, i: os.path.join(root, "suite", name, str(i))
    paper_final = suite.score(ckpt(paper, -1), data_dir,
                              suite_dir(_run_name("paper", seed), len(paper.steps) - 1),
                              seed=seed)
    floor = suite.score("", data_dir, os.path.join(root, "suite", f"random_init_seed{seed}"),
                        seed=seed)
    # The modern run's checkpoints in order, on the transfer tasks, until one
    # reaches the paper's final transfer mean; its final checkpoint on all tasks.
    means = [None] * len(new.steps)
    for i in range(len(new.steps) - 1):
      means[i] = suite.score(ckpt(new, i), data_dir, suite_dir(_run_name("modern", seed), i),
                             seed=seed, tasks=suite.TRANSFER)[SUMMARY]
      if means[i] >= paper_final[SUMMARY]:
        break
    modern_final = suite.score(ckpt(new, -1), data_dir,
                               suite_dir(_run_name("modern", seed), len(new.steps) - 1),
                               seed=seed)
    means[-1] = modern_final[SUMMARY]
    points[_run_name("paper", seed)] = [(paper.seconds[-1], paper_final[SUMMARY])]
    points[_run_name("modern", seed)] = [(t, m) for t, m in zip(new.seconds, means)
                                         if m is not None]
    configs = {r: config_of(r, seed) for r in RECIPES}
    models = {r: export.read_checkpoint(ckpt(c, -1))[1]
              for r, c in zip(RECIPES, (paper, new))}
    results[seed] = {
        "random_init": floor,
        "final": {"paper": dict(paper_final, mlm_accuracy=paper.mlm_accuracy[-1],
                                step=paper.steps[-1], wall_s=paper.seconds[-1]),
                  "modern": dict(modern_final, mlm_accuracy=new.mlm_accuracy[-1],
                                 step=new.steps[-1], wall_s=new.seconds[-1])},
        "targets": {"mlm_accuracy": paper.mlm_accuracy[-1],
                    SUMMARY: paper_final[SUMMARY]},
        "reach": {
            "paper": {k: _reach("paper", configs["paper"], models["paper"], paper,
                                len(paper.steps) - 1, step_ms)
                      for k in ("mlm_accuracy", SUMMARY)},
            "modern": {
                "mlm_accuracy": _reach("modern", configs["modern"], models["modern"], new,
                                       _first(new.mlm_accuracy, paper.mlm_accuracy[-1]),
                                       step_ms),
                SUMMARY: _reach("modern", configs["modern"], models["modern"], new,
                                _first(means, paper_final[SUMMARY]), step_ms)},
        },
    }
  command = ("python -m bertjax.studies.time_to_quality "
             f"--workdir={args.workdir} --total_steps={args.total_steps} "
             f"--checkpoints={args.checkpoints} --seeds={args.seeds} "
             f"--eval_batches={args.eval_batches}"
             + "".join(f" --{k}={getattr(args, k):g}" for k in
                       ("modern_lr_scale", "modern_warmup_pct", "modern_mask_rate")
                       if getattr(args, k))
             + (f" --base_step_ms={args.base_step_ms}" if args.base_step_ms else ""))
  table = _table(results, bag, seeds, step_ms, command)
  print(table)
  with open(os.path.join(root, "time_to_quality.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  recipes.write_json(os.path.join(root, "time_to_quality.json"),
                     {"curves": curves, "results": results, "bag_of_words": bag,
                      "downstream_points": points,
                      "base_step_ms": {".".join(k): v for k, v in step_ms.items()},
                      "command": command})
  _plot(curves, points, os.path.join(root, "time_to_quality.png"))


def _table(results, bag, seeds, step_ms, command) -> str:
  n = len(seeds)
  cols = ("mlm_accuracy", *suite.TRANSFER, SUMMARY, *suite.REFERENCE)
  lines = [f"`{command}`", "", f"Median (range) over {n} seeds ({', '.join(map(str, seeds))}).",
           "", "| recipe, at its final step | held-out MLM acc | " + " | ".join(cols[1:])
           + " | wall s |", "|---" * (len(cols) + 2) + "|"]
  for recipe in RECIPES:
    finals = [results[s]["final"][recipe] for s in seeds]
    lines.append(f"| {RECIPES[recipe]} | " + " | ".join(
        recipes.cell([f[c] for f in finals], "{:.3f}") for c in cols)
        + f" | {recipes.cell([f['wall_s'] for f in finals], '{:.0f}')} |")
  floors = [results[s]["random_init"] for s in seeds]
  lines.append("| random initialisation | n/a | " + " | ".join(
      recipes.cell([f[c] for f in floors], "{:.3f}") for c in cols[1:]) + " | n/a |")
  lines.append(f"| {suite.BAG_OF_WORDS} (same rows) | n/a | " + " | ".join(
      f"{bag[c]:.3f}" for c in cols[1:]) + " | n/a |")
  for target, what in (("mlm_accuracy", "the paper recipe's final held-out MLM accuracy"),
                       (SUMMARY, "the paper recipe's final transfer mean")):
    lines += ["", f"To {what} (each seed's own paper run):", "",
              "| recipe | steps | model PFLOPs | wall s | projected BERT-BASE hours on one "
              "H100 |", "|---|---|---|---|---|"]
    for recipe in RECIPES:
      reach = [results[s]["reach"][recipe][target] for s in seeds]
      get = lambda k: [None if r is None else r[k] for r in reach]
      lines.append(f"| {RECIPES[recipe]} | {recipes.cell(get('step'), '{:.0f}')} | "
                   f"{recipes.cell(get('pflops'), '{:.3f}')} | {recipes.cell(get('wall_s'), '{:.0f}')} | "
                   f"{recipes.cell(get('base_h100_hours'), '{:.4f}')} |")
  lines += ["", "Projection: the demo run's steps to the target, phase by phase, times "
            "BERT-BASE's step time at batch 256 for that recipe and phase: " + "; ".join(
                f"{r}.{p} {ms:g} ms ({where})" for (r, p), (ms, where) in step_ms.items())
            + ". It assumes that the steps each recipe needs carry over from the demo "
            "(L=2, H=128) to BERT-BASE (L=12, H=768).", "", suite.NOTE]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
