"""The demo's downstream suite: three tasks from the demo corpus, fine-tuned from
any demo-scale checkpoint with one command.

  python -m bertjax.studies.suite --data_dir=WORKDIR/demo_data \\
      --checkpoint=WORKDIR/checkpoints/1800 [--checkpoint=...] [--random_init] \\
      [--seeds=0] --workdir=/tmp/suite

The tasks (configs/finetune/demo.py, doc_area.py and word_area.py):
  same_document  sentence pairs: from the same document or not (accuracy). It
                 asks what next-sentence prediction trains.
  doc_area       single sentence: which of nine parts of Python it documents
                 (accuracy).
  word_area      token tagging: each word that several parts of Python use,
                 tagged with the part its sentence documents (span F1).
Train and dev are split by document: dev comes from the demo's held-out
documents, which pretraining never reads. The suite's summary figure is the
mean over the tasks that do not ask NSP's question (NON_NSP: doc_area and
word_area). --random_init scores random initialisation with the same
budget, the floor a pretrained checkpoint must clear. Each (checkpoint,
seed) is fine-tuned once per task; prints one row per checkpoint (the median
over seeds where there are several) and writes workdir/suite.json and
workdir/suite.md. time_to_quality and ablation score their checkpoints
with `score`.
"""

import argparse
import os
import statistics
import sys
from typing import Optional

from bertjax import downstream
from bertjax.studies import recipes
from bertjax.create import demo_tasks
from bertjax.tasks import loop as task_loop
from bertjax.tasks import registry
from bertjax.train import cli
from bertjax.train import profiling

TASKS = ("same_document", "doc_area", "word_area")
NON_NSP = ("doc_area", "word_area")  # The tasks the non-NSP mean is over.
_CONFIGS = {"same_document": "demo", "doc_area": "doc_area", "word_area": "word_area"}


def task_config(task: str):
  """configs/finetune/{demo,doc_area,word_area}.py's config for `task`."""
  sys.path.insert(0, os.path.join(recipes.REPO, "configs", "finetune"))
  return __import__(_CONFIGS[task]).get_config()


def non_nsp_mean(scores: dict[str, float]) -> float:
  return statistics.fmean(scores[t] for t in NON_NSP)


def finetune_task(task: str, checkpoint: str, data_dir: str, workdir: str, *, seed: int = 0,
                  vocab_file: Optional[str] = None, num_epochs: Optional[float] = None,
                  segment_b_init: Optional[str] = None) -> float:
  """`task`'s dev score (its config's primary metric) fine-tuned in `workdir`
  from `checkpoint` (a pretraining checkpoint directory; "" for random
  initialisation with the demo model's architecture) on the demo data in
  `data_dir`, with the task config's budget unless num_epochs says otherwise
  (segment_b_init, if given, replaces the config's)."""
  config = task_config(task)
  config.within_workdir = False
  config.random_init_baseline = False
  config.init_from = checkpoint
  config.seed = seed
  config.data_dir = data_dir
  config.vocab_file = vocab_file or os.path.join(data_dir, "vocab.txt")
  if num_epochs is not None:
    config.num_epochs = num_epochs
  if segment_b_init is not None:
    config.segment_b_init = segment_b_init
  results = downstream.finetune(config, workdir)
  if "preempted_at_step" in results:
    raise SystemExit(f"{task} in {workdir}: stopped at step {results['preempted_at_step']} "
                     "by a signal; rerun to resume.")
  return task_loop.primary_score(registry.get_task(task), results)


def score(checkpoint: str, data_dir: str, workdir: str, *, seed: int = 0,
          vocab_file: Optional[str] = None, tasks=TASKS) -> dict[str, float]:
  """Each of `tasks`' dev score fine-tuned from `checkpoint` (finetune_task),
  each in workdir/TASK, after writing the tasks' files from the demo data's
  text where absent; with every NON_NSP task among `tasks`, also
  "non_nsp_mean"."""
  demo_tasks.ensure_tasks(data_dir)
  scores = {task: finetune_task(task, checkpoint, data_dir, os.path.join(workdir, task),
                                seed=seed, vocab_file=vocab_file) for task in tasks}
  if all(t in scores for t in NON_NSP):
    scores["non_nsp_mean"] = non_nsp_mean(scores)
  return scores


def table(rows: dict[str, list[dict[str, float]]], command: str) -> str:
  """Markdown: one row per checkpoint, each column's median (range) over its seeds."""
  columns = [*TASKS, "non_nsp_mean"]
  lines = [f"`{command}`", "",
           "| checkpoint | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
  for name, runs in rows.items():
    cells = []
    for c in columns:
      values = [r[c] for r in runs]
      cells.append(f"{statistics.median(values):.3f}" + (
          f" ({min(values):.3f}-{max(values):.3f})" if len(values) > 1 else ""))
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += ["", "same_document: accuracy (NSP's question); doc_area: accuracy over nine "
            "areas; word_area: span F1 of the area tags; non_nsp_mean: the mean of the last two."]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data_dir", required=True,
                      help="The demo data directory of the checkpoints' pretraining "
                      "(text/, vocab.txt).")
  parser.add_argument("--checkpoint", action="append", default=[],
                      help="A pretraining checkpoint directory, or NAME=DIR; repeat for more.")
  parser.add_argument("--random_init", action="store_true",
                      help="Also score random initialisation (the demo model's architecture).")
  parser.add_argument("--seeds", default="0", help="Fine-tuning seeds, comma-separated.")
  parser.add_argument("--workdir", required=True)
  args = parser.parse_args()
  cli.quiet_library_logs()
  if not os.path.isfile(os.path.join(args.data_dir, "vocab.txt")):
    parser.error(f"--data_dir={args.data_dir}: no vocab.txt there (the demo data directory "
                 "of the checkpoints' pretraining)")
  checkpoints = {}
  for spec in args.checkpoint:
    name, sep, path = spec.partition("=")
    name, path = (name, path) if sep else (spec, spec)
    if not os.path.isdir(path):
      parser.error(f"--checkpoint={spec}: {path} is not a directory")
    checkpoints[name] = os.path.abspath(path)
  if args.random_init:
    checkpoints["random init"] = ""
  if not checkpoints:
    parser.error("give at least one --checkpoint or --random_init")
  seeds = recipes.parse_seeds(parser, args.seeds)
  root = os.path.abspath(args.workdir)
  # Fine-tuning compiles the same programs for every checkpoint: cached (the
  # pretraining runs are other processes, untouched).
  profiling.enable_compilation_cache(os.path.join(root, "compile_cache"))
  rows = {}
  for i, (name, path) in enumerate(checkpoints.items()):
    rows[name] = [score(path, os.path.abspath(args.data_dir),
                        os.path.join(root, f"run{i}_seed{seed}"), seed=seed)
                  for seed in seeds]
  command = "python -m bertjax.studies.suite " + " ".join(sys.argv[1:])
  text = table(rows, command)
  print(text)
  with open(os.path.join(root, "suite.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  recipes.write_json(os.path.join(root, "suite.json"),
                     {"scores": rows, "checkpoints": checkpoints, "command": command})


if __name__ == "__main__":
  main()
