"""The demo's downstream suite: tasks from the demo corpus, fine-tuned from any
demo-scale checkpoint with one command, each beside random initialisation and a
bag-of-words baseline trained on the same rows.

  python -m bertjax.studies.suite --data_dir=WORKDIR/demo_data \\
      --checkpoint=WORKDIR/checkpoints [--checkpoint=...] [--random_init] \\
      [--seeds=0] --workdir=/tmp/suite

The tasks (configs/finetune/demo.py and the task's name .py):
  same_document  sentence pairs: is sentence B the one after sentence A in its
                 document, or from another document (accuracy)? It asks what
                 next-sentence prediction trains.
  related_words  word pairs: do two words belong to the same part of Python
                 (accuracy)? The dev pairs hold only words that no training
                 pair holds.
  doc_area       single sentence: which of nine parts of Python it documents
                 (accuracy); a reference column: a bag of words does it well.
  word_area      token tagging: each word that several parts of Python use,
                 tagged with the part its sentence documents (span F1); a
                 reference column, as doc_area.
On the first two a bag of words has nothing to go on by construction: whether two
sentences belong together is a relation between the segments, which no
weighting of their word counts expresses, and the dev words of related_words
never occur in its training rows. The suite's summary figure is the transfer
mean over those two (TRANSFER). same_document's and the reference columns'
train and dev are split by source file (a reference topic or a library
module): dev comes from the demo's held-out sources, which pretraining never
reads; related_words' by word. --random_init scores random initialisation with
the same budget, the floor a pretrained checkpoint must clear; the
bag-of-words row needs no checkpoint (bertjax/tasks/bag_of_words.py). Each
(checkpoint, seed) is fine-tuned once per task; prints one row per checkpoint
(the median over seeds where there are several) and writes workdir/suite.json
and workdir/suite.md. time_to_quality, recipe_grid and ablation score their
checkpoints with `score`.
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

TASKS = ("same_document", "related_words", "doc_area", "word_area")
TRANSFER = ("same_document", "related_words")  # The tasks the transfer mean is over.
SUMMARY = "transfer_mean"  # The suite's summary figure: the mean over TRANSFER.
REFERENCE = ("doc_area", "word_area")  # Lexical: a bag of words does them well.
_CONFIGS = {"same_document": "demo"}  # Else configs/finetune/TASK.py.
BAG_OF_WORDS = "bag of words"  # The baseline's row.


def task_config(task: str):
  """configs/finetune/demo.py's config for same_document, else configs/finetune/TASK.py's."""
  sys.path.insert(0, os.path.join(recipes.REPO, "configs", "finetune"))
  return __import__(_CONFIGS.get(task, task)).get_config()


def transfer_mean(scores: dict[str, float]) -> float:
  return statistics.fmean(scores[t] for t in TRANSFER)


def _config(task: str, checkpoint: str, data_dir: str, seed: int,
            vocab_file: Optional[str]):
  """`task`'s config fine-tuning from `checkpoint` ("": random initialisation)
  on the demo data in `data_dir`, the paths as given."""
  config = task_config(task)
  config.within_workdir = False
  config.random_init_baseline = False
  config.init_from = checkpoint
  config.seed = seed
  config.data_dir = data_dir
  config.vocab_file = vocab_file or os.path.join(data_dir, "vocab.txt")
  return config


def finetune_task(task: str, checkpoint: str, data_dir: str, workdir: str, *, seed: int = 0,
                  vocab_file: Optional[str] = None, num_epochs: Optional[float] = None,
                  segment_b_init: Optional[str] = None) -> float:
  """`task`'s dev score (its config's primary metric) fine-tuned in `workdir`
  from `checkpoint` (a pretraining checkpoint directory; "" for random
  initialisation with the demo model's architecture) on the demo data in
  `data_dir`, with the task config's budget unless num_epochs says otherwise
  (segment_b_init, if given, replaces the config's)."""
  config = _config(task, checkpoint, data_dir, seed, vocab_file)
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
  text where absent; with every TRANSFER task among `tasks`, also SUMMARY
  (transfer_mean)."""
  demo_tasks.ensure_tasks(data_dir)
  scores = {task: finetune_task(task, checkpoint, data_dir, os.path.join(workdir, task),
                                seed=seed, vocab_file=vocab_file) for task in tasks}
  if all(t in scores for t in TRANSFER):
    scores[SUMMARY] = transfer_mean(scores)
  return scores


def bag_of_words(data_dir: str, *, vocab_file: Optional[str] = None,
                 tasks=TASKS) -> dict[str, float]:
  """Each of `tasks`' dev score from the bag-of-words baseline
  (tasks.loop.bag_of_words_baseline) trained on the task's training rows, as
  the task's config reads them; with every TRANSFER task, also SUMMARY."""
  demo_tasks.ensure_tasks(data_dir)
  scores = {}
  for task in tasks:
    prepared = task_loop.prepare(_config(task, "", data_dir, 0, vocab_file))
    split = prepared.task.dev_splits[0]
    scores[task] = task_loop.bag_of_words_baseline(prepared)[split][prepared.task.primary]
  if all(t in scores for t in TRANSFER):
    scores[SUMMARY] = transfer_mean(scores)
  return scores


COLUMNS = (*TASKS, SUMMARY)
NOTE = ("same_document (NSP's question) and related_words (dev words unseen in training "
        "pairs): accuracy, 0.5 is chance; transfer_mean: their mean; doc_area: accuracy over "
        "nine areas and word_area: span F1 of the area tags, reference columns (a bag of words "
        "does them well). bag of words: logistic regression on each row's word-piece counts "
        "(a pair's two segments counted apart), trained on the same rows.")


def table(rows: dict[str, list[dict[str, float]]], command: str) -> str:
  """Markdown: one row per checkpoint, each column's median (range) over its seeds."""
  columns = [c for c in COLUMNS if all(c in r for runs in rows.values() for r in runs)]
  lines = [f"`{command}`", "",
           "| checkpoint | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
  for name, runs in rows.items():
    lines.append(f"| {name} | " + " | ".join(recipes.cell([r[c] for r in runs]) for c in columns)
                 + " |")
  lines += ["", NOTE]
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
  data_dir = os.path.abspath(args.data_dir)
  for i, (name, path) in enumerate(checkpoints.items()):
    rows[name] = [score(path, data_dir, os.path.join(root, f"run{i}_seed{seed}"), seed=seed)
                  for seed in seeds]
  rows[BAG_OF_WORDS] = [bag_of_words(data_dir)]
  command = "python -m bertjax.studies.suite " + " ".join(sys.argv[1:])
  text = table(rows, command)
  print(text)
  with open(os.path.join(root, "suite.md"), "w", encoding="utf-8") as f:
    f.write(text + "\n")
  recipes.write_json(os.path.join(root, "suite.json"),
                     {"scores": rows, "checkpoints": checkpoints, "command": command})


if __name__ == "__main__":
  main()
