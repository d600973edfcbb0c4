"""The paper's Table 5 (effect of the pretraining tasks) at demo scale.

  python -m bertjax.studies.ablation --workdir=/tmp/ablation [--total_steps=4800]

Pretrains the demo model (configs/tiny.py) three times for the same number of
steps, at the same time (recipes.pretrain_in_processes: one process each, so
that the machine's other load falls on all three alike), changing only
config.objective: mlm+nsp (BERT), mlm (No NSP: full
sentences, no NSP head) and ltr (LTR & No NSP: a causal left-to-right LM
predicting every next token); every other setting is tiny.py's (static 15%
masks for the two masked objectives, lengths 128 then 512). Each final
checkpoint is fine-tuned on the downstream suite (studies/suite.py; an ltr
checkpoint keeps its causal mask) and scored on the held-out records at 15%
masking (not for ltr, which predicts no masked tokens). Prints each task's dev
score and the suite's transfer mean beside the paper's BERT-BASE rows
and writes workdir/ablation.md and workdir/ablation.json.
"""

import argparse
import math
import os

from bertjax import downstream
from bertjax.studies import recipes
from bertjax.studies import suite
from bertjax.train import cli

# Devlin et al. (2018), Table 5: dev scores of BERT-BASE and its ablations.
PAPER = {
    "mlm+nsp": {"MNLI-m": 84.4, "QNLI": 88.4, "MRPC": 86.7, "SST-2": 92.7, "SQuAD F1": 88.5},
    "mlm": {"MNLI-m": 83.9, "QNLI": 84.9, "MRPC": 86.5, "SST-2": 92.6, "SQuAD F1": 87.9},
    "ltr": {"MNLI-m": 82.1, "QNLI": 84.3, "MRPC": 77.5, "SST-2": 92.1, "SQuAD F1": 77.8},
}
NAMES = {"mlm+nsp": "BERT-BASE (mlm+nsp)", "mlm": "No NSP (mlm)",
         "ltr": "LTR & No NSP (ltr)"}


def noise_margin(dev_examples: int) -> float:
  """Two binomial standard errors of an accuracy near 0.5 on `dev_examples`:
  closer scores than this are not told apart (the demo's 1,000 dev pairs: 0.032)."""
  return 2 * math.sqrt(0.25 / dev_examples)


def order_line(scores: dict[str, float], margin: float) -> str:
  """The objectives by downstream score, '>' where the gap exceeds `margin`
  and '~' where it does not."""
  order = sorted(scores, key=lambda o: -scores[o])
  line = NAMES[order[0]]
  for above, o in zip(order, order[1:]):
    line += (" > " if scores[above] - scores[o] > margin else " ~ ") + NAMES[o]
  return (f"Demo downstream order: {line} ('~': within {margin:.3f}, two standard errors of "
          "an accuracy on the dev set, so not told apart); the paper's: BERT-BASE > No NSP > "
          "LTR & No NSP on every task.")


def _dirname(objective: str) -> str:
  return objective.replace("+", "_")


def _config(objective: str, total_steps: int):
  config = recipes.paper_config(total_steps)
  config.objective = objective
  return config


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--total_steps", type=int, default=4800)
  parser.add_argument("--eval_batches", type=int, default=40,
                      help=f"Held-out batches of {recipes.EVAL_BATCH} (0: all).")
  parser.add_argument("--_pretrain", choices=[_dirname(o) for o in PAPER],
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  cli.quiet_library_logs()
  root = os.path.abspath(args.workdir)
  if args._pretrain:  # pylint: disable=protected-access
    objective = {_dirname(o): o for o in PAPER}[args._pretrain]  # pylint: disable=protected-access
    recipes.pretrain_child(args._pretrain, NAMES[objective],  # pylint: disable=protected-access
                           _config(objective, args.total_steps), root, checkpoints=1)
    return
  os.makedirs(root, exist_ok=True)
  pattern = recipes.eval_pattern(root)
  recipes.prepare_data([_config(o, args.total_steps) for o in PAPER], root)
  curves = recipes.pretrain_in_processes(
      "bertjax.studies.ablation", [_dirname(o) for o in PAPER], root,
      [f"--workdir={root}", f"--total_steps={args.total_steps}"], side_by_side=True)
  results = {}
  for objective in PAPER:
    name = _dirname(objective)
    curve = curves[name]
    final = os.path.join(curve.workdir, "checkpoints", str(curve.steps[-1]))
    results[objective] = {
        "wall_seconds": curve.seconds[-1],
        "mlm_accuracy": (None if objective == "ltr" else
                         recipes.mlm_accuracy(final, pattern, args.eval_batches or None)),
        "downstream": suite.score(final, os.path.join(root, "demo_data"),
                                  os.path.join(root, "suite", name)),
    }
  command = (f"python -m bertjax.studies.ablation --workdir={args.workdir} "
             f"--total_steps={args.total_steps} --eval_batches={args.eval_batches}")
  cols = list(PAPER["mlm+nsp"])
  tasks = [*suite.TASKS, suite.SUMMARY]
  lines = [f"`{command}`", "",
           "| objective | " + " | ".join(f"demo: {t}" for t in tasks)
           + " | demo: held-out MLM acc | pretrain s | "
           + " | ".join(f"paper {c}" for c in cols) + " |",
           "|---" * (3 + len(tasks) + len(cols)) + "|"]
  for objective, r in results.items():
    mlm = "n/a" if r["mlm_accuracy"] is None else f"{r['mlm_accuracy']:.4f}"
    lines.append(f"| {NAMES[objective]} | "
                 + " | ".join(f"{r['downstream'][t]:.4f}" for t in tasks)
                 + f" | {mlm} | {r['wall_seconds']:.0f} | "
                 + " | ".join(f"{PAPER[objective][c]}" for c in cols) + " |")
  margin = noise_margin(downstream.demo_config().num_dev_pairs)
  lines += ["", "same_document (NSP's question): " + order_line(
      {o: r["downstream"]["same_document"] for o, r in results.items()}, margin),
            "", suite.NOTE]
  table = "\n".join(lines)
  print(table)
  with open(os.path.join(root, "ablation.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  recipes.write_json(os.path.join(root, "ablation.json"),
                     {"results": results, "paper": PAPER, "command": command})


if __name__ == "__main__":
  main()
