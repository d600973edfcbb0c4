"""The demo's downstream score against the fine-tuning budget, from given checkpoints.

  python -m bertjax.studies.downstream_budget --root=/tmp/ttq2 \\
      --checkpoint=paper=paper/checkpoints/4800 --checkpoint=modern=modern/checkpoints/4800 \\
      [--epochs=2,10] [--seeds=0,1,2] [--random_init] [--segment_b_init=keep,copy_a]

Fine-tunes the demo's downstream task (configs/finetune/demo.py: same-document
pairs, 62 steps at its 2 epochs) from each checkpoint, and with --random_init
from random initialisation, once per (epochs, seed), and prints the dev
accuracy of each run and per (checkpoint, epochs) the median and range over
seeds. `--root` is a time_to_quality or ablation workdir: its demo_data/
holds the task's text and vocab, and checkpoint paths are relative to it.
It answers whether a gap between two pretrained checkpoints on this task
closes when fine-tuning runs longer. With --segment_b_init each checkpoint is
fine-tuned once per listed config.segment_b_init (what segment B's token-type
row starts from when the checkpoint was pretrained on one segment), its rows
named NAME [choice]. Writes root/downstream_budget.json.
"""

import argparse
import os
import statistics
from typing import Optional

from bertjax.studies import recipes
from bertjax.studies import suite
from bertjax.convert import weights
from bertjax.train import cli


def _checkpoints(specs: list[str], root: str, random_init: bool,
                 segment_b_inits: list[str]) -> dict[str, tuple[str, Optional[str]]]:
  """Row name -> (checkpoint path, segment_b_init or None for the config's)."""
  out = {}
  for spec in specs:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
      raise SystemExit(f"--checkpoint={spec!r}: expected NAME=PATH (PATH relative to --root).")
    full = os.path.join(root, path)
    if not os.path.isdir(full):
      raise SystemExit(f"--checkpoint={spec!r}: {full} is not a directory.")
    for choice in segment_b_inits or [None]:
      out[f"{name} [{choice}]" if choice else name] = (full, choice)
  if random_init:
    out["random init"] = ("", None)
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
  parser.add_argument("--segment_b_init", default="",
                      help="config.segment_b_init values, comma-separated: each checkpoint "
                      "is fine-tuned with each (empty: the config's).")
  args = parser.parse_args()
  cli.quiet_library_logs()
  root = os.path.abspath(args.root)
  if not os.path.isdir(os.path.join(root, "demo_data")):
    raise SystemExit(f"--root={args.root}: no demo_data/ there (run time_to_quality or "
                     "ablation with this workdir first).")
  inits = [c for c in args.segment_b_init.split(",") if c]
  unknown = sorted(set(inits) - set(weights.SEGMENT_B_INITS))
  if unknown:
    raise SystemExit(f"--segment_b_init: {unknown} not among {weights.SEGMENT_B_INITS}.")
  checkpoints = _checkpoints(args.checkpoint, root, args.random_init, inits)
  epochs = [float(e) for e in args.epochs.split(",") if e]
  seeds = [int(s) for s in args.seeds.split(",") if s]
  scores = {}
  for e in epochs:
    for name, (path, choice) in checkpoints.items():
      for seed in seeds:
        label = name.replace(" [", "_").replace("]", "").replace(" ", "_")
        workdir = os.path.join(root, "downstream_budget", f"{label}_ep{e:g}_seed{seed}")
        score = suite.finetune_task("same_document", path, os.path.join(root, "demo_data"),
                                    workdir, num_epochs=e, seed=seed, segment_b_init=choice)
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
                     {"checkpoints": {k: p for k, (p, _) in checkpoints.items()},
                      "scores": scores})


if __name__ == "__main__":
  main()
