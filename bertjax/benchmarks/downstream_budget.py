"""The demo's downstream score against the fine-tuning budget, from given checkpoints.

  python -m bertjax.benchmarks.downstream_budget --root=/tmp/ttq2 \\
      --checkpoint=paper=paper/checkpoints/4800 --checkpoint=modern=modern/checkpoints/4800 \\
      [--epochs=2,10] [--seeds=0,1,2] [--random_init]

Fine-tunes the demo's downstream task (configs/finetune/demo.py: same-document
pairs, 62 steps at its 2 epochs) from each checkpoint, and with --random_init
from random initialisation, once per (epochs, seed), and prints the dev
accuracy of each run and per (checkpoint, epochs) the median and range over
seeds. `--root` is a time_to_quality or ablation workdir: its demo_data/
holds the task's text and vocab, and checkpoint paths are relative to it.
It answers whether a gap between two pretrained checkpoints on this task
closes when fine-tuning runs longer. Writes root/downstream_budget.json.
"""

import argparse
import os
import statistics

from bertjax.benchmarks import recipes
from bertjax.train import usage


def _checkpoints(specs: list[str], root: str, random_init: bool) -> dict[str, str]:
  out = {}
  for spec in specs:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
      raise SystemExit(f"--checkpoint={spec!r}: expected NAME=PATH (PATH relative to --root).")
    full = os.path.join(root, path)
    if not os.path.isdir(full):
      raise SystemExit(f"--checkpoint={spec!r}: {full} is not a directory.")
    out[name] = full
  if random_init:
    out["random init"] = ""
  if not out:
    raise SystemExit("Give at least one --checkpoint=NAME=PATH or --random_init.")
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", required=True,
                      help="A time_to_quality or ablation workdir (with demo_data/).")
  parser.add_argument("--checkpoint", action="append", default=[],
                      help="NAME=PATH of a pretraining checkpoint, PATH relative to --root.")
  parser.add_argument("--random_init", action="store_true",
                      help="Also fine-tune from random initialisation.")
  parser.add_argument("--epochs", default="2,10", help="Fine-tuning epochs, comma-separated.")
  parser.add_argument("--seeds", default="0,1,2", help="Fine-tuning seeds, comma-separated.")
  args = parser.parse_args()
  usage.quiet_library_logs()
  root = os.path.abspath(args.root)
  if not os.path.isdir(os.path.join(root, "demo_data")):
    raise SystemExit(f"--root={args.root}: no demo_data/ there (run time_to_quality or "
                     "ablation with this workdir first).")
  checkpoints = _checkpoints(args.checkpoint, root, args.random_init)
  epochs = [float(e) for e in args.epochs.split(",") if e]
  seeds = [int(s) for s in args.seeds.split(",") if s]
  scores = {}
  for e in epochs:
    for name, path in checkpoints.items():
      for seed in seeds:
        workdir = os.path.join(root, "downstream_budget",
                               f"{name.replace(' ', '_')}_ep{e:g}_seed{seed}")
        score = recipes.finetune(path, root, workdir, num_epochs=e, seed=seed)
        scores[f"{name}|{e:g}|{seed}"] = score
        print(f"{name:12s} epochs {e:g} seed {seed}: dev accuracy {score:.4f}", flush=True)
  print()
  print("| checkpoint | epochs | dev accuracy, median (range) over seeds " + " ".join(
      map(str, seeds)) + " |\n|---|---|---|")
  for e in epochs:
    for name in checkpoints:
      values = [scores[f"{name}|{e:g}|{s}"] for s in seeds]
      print(f"| {name} | {e:g} | {statistics.median(values):.3f} "
            f"({min(values):.3f}-{max(values):.3f}) |")
  recipes.write_json(os.path.join(root, "downstream_budget.json"),
                     {"checkpoints": checkpoints, "scores": scores})


if __name__ == "__main__":
  main()
