"""Pretraining recipes at demo scale, measured the same way: the pieces that
studies/time_to_quality.py and studies/ablation.py share.

A recipe's run is bertjax.main's pretraining on the demo corpus
(configs/tiny.py's model and data) with checkpoints every few hundred steps,
kept. Each checkpoint's wall time is its directory's modification time
since the run began (saves are synchronous here, so the time is that of the
finished save; compiles, input and saves count, as they would for a user).
Afterwards every checkpoint is scored on the same held-out records, the
demo's eval_128 (the paper's records, 15% of tokens masked, the same masked
positions for every recipe), and fine-tuned on the downstream suite
(studies/suite.py).
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Optional

import jax
import numpy as np

from bertjax.convert import export
from bertjax.create import demo
from bertjax.input import evaluation
from bertjax.model.bert import BertForPreTraining
from bertjax.train import flops
from bertjax.train import loop
from bertjax.train import run_config
from bertjax.train import step as step_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVAL_BATCH = 50


def config_module(name: str):
  """configs/{name}.py's module."""
  sys.path.insert(0, os.path.join(REPO, "configs"))
  return __import__(name)


def paper_config(total_steps: int):
  """The demo: configs/tiny.py, the paper's recipe at demo scale."""
  config = config_module("tiny").get_config()
  config.total_steps = total_steps
  return config


def scaled_to_demo(config, total_steps: int):
  """`config` (a recipe for BERT-BASE built on configs/base.py) at the demo's
  scale: tiny.py's model, data, batch sizes, step count, checkpoints and
  logging; everything else (objective, masking, phases kept or dropped,
  optimizer shape, schedule shape) the recipe's own.

  The peak learning rate keeps the recipe's ratio to the paper's (configs/
  base.py's) at equal batch size: a recipe's rate goes with its batch, and
  at the demo both recipes train with tiny.py's batch. The rates are
  compared at equal batch by the square-root rule (a batch k times larger
  takes sqrt(k) times the rate): MosaicBERT's 5e-4 at batch 4,096 is
  1.25x the paper's 1e-4 at 256, so the demo's modern rate is 1.25x
  tiny.py's.
  """
  tiny = paper_config(total_steps)
  base = config_module("base").get_config()

  def per_batch(c):  # The peak rate over the root of the first phase's batch.
    return c.optimizer.learning_rate / next(iter(c.phases.values())).global_batch_size ** 0.5

  config.optimizer.learning_rate = (tiny.optimizer.learning_rate
                                    * per_batch(config) / per_batch(base))
  config.total_steps = total_steps
  config.model = tiny.model
  config.data.demo_dir = tiny.data.demo_dir
  for name, phase in config.phases.items():
    phase.global_batch_size = tiny.phases[name].global_batch_size
    if len(config.phases) == 1:
      phase.fraction = 1.0
  config.checkpoint = tiny.checkpoint
  config.logging = tiny.logging
  return config


def modern(total_steps: int, *, lr_scale: float = 0.0, warmup_pct: float = 0.0,
           mask_rate: float = 0.0):
  """configs/modern.py at the demo's scale (scaled_to_demo). lr_scale > 0 sets
  the peak rate to that multiple of tiny.py's; warmup_pct > 0 the warmup to
  that percentage of total_steps; mask_rate > 0 the dynamic masking rate, with
  prediction slots for that share of a 128-token row (rounded up to a
  multiple of 4, as configs/modern.py's 40 for 30%)."""
  config = scaled_to_demo(config_module("modern").get_config(), total_steps)
  if lr_scale:
    config.optimizer.learning_rate = paper_config(total_steps).optimizer.learning_rate * lr_scale
  if warmup_pct:
    config.optimizer.warmup_steps = int(round(total_steps * warmup_pct / 100))
  if mask_rate:
    config.data.masked_lm_prob = mask_rate
    for phase in config.phases.values():
      slots = mask_rate * phase.max_seq_length
      phase.max_predictions_per_seq = int(-(-slots // 4) * 4)
  return config


@dataclasses.dataclass
class Curve:
  """One recipe's run: checkpoint steps, their wall seconds and scores."""
  name: str
  workdir: str
  steps: list[int]
  seconds: list[float]
  mlm_accuracy: list[float] = dataclasses.field(default_factory=list)


def pretrain(name: str, config, workdir: str, *, checkpoints: int) -> Curve:
  """Runs the recipe in workdir (demo data under workdir/../demo_data, shared);
  returns its checkpoints' steps and wall times."""
  config.data.demo_dir = data_dir(os.path.dirname(workdir), config)
  config.checkpoint.every_steps = max(1, config.total_steps // checkpoints)
  config.checkpoint.keep = checkpoints + 2
  config.checkpoint.async_save = False
  config.logging.eval_every_steps = 0
  config.logging.eval_batches = 1  # The run's own phase-end evaluation: kept short.
  demo.prepare_config(config, workdir)  # Data first: not in the recipe's time.
  start = time.time()
  summary = loop.train_and_evaluate(config, workdir)
  if "preempted_at_step" in summary:
    raise SystemExit(f"{name}: stopped at step {summary['preempted_at_step']} by a "
                     "signal; its wall times would not be those of one run. Rerun.")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  steps = sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
  seconds = [os.path.getmtime(os.path.join(ckpt_dir, str(s))) - start for s in steps]
  return Curve(name, workdir, steps, seconds)


def pretrain_in_processes(module: str, names: list[str], root: str, argv: list[str], *,
                          side_by_side: bool) -> dict[str, Curve]:
  """Pretrains every recipe in `names`, each in its own process (`python -m
  module --_pretrain=NAME ARGV...`); returns each recipe's Curve (read from
  root/NAME/curve.json).

  side_by_side: all at the same time, none pinned to a CPU, so that
  whatever else loads the machine falls on all of them. The scheduler
  need not share the CPUs evenly between processes whose steps differ,
  so the wall times of recipes with different steps are not comparable
  this way (docs/recipes.md has a measured case). Otherwise
  one after another in the order of `names`, each alone on the machine, as
  a user would run it.

  The child process builds its recipe's config from its name and calls
  `pretrain_child`. The demo data must exist before (prepare_data). A recipe
  whose root/NAME/curve.json exists (written when its run finished) is not run
  again: a rerun of a study in the same root scores the finished runs anew
  without changing their wall times. Only with the same `argv`
  (root/NAME/argv.json): other arguments are an error naming the directory.
  """
  def start(name):
    os.makedirs(os.path.join(root, name), exist_ok=True)
    write_json(os.path.join(root, name, "argv.json"), argv)
    log = open(os.path.join(root, name, "pretrain.log"), "w", encoding="utf-8")  # pylint: disable=consider-using-with
    command = [sys.executable, "-m", module, f"--_pretrain={name}"] + argv
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log  # pylint: disable=consider-using-with

  todo = []
  for name in names:
    if not os.path.exists(os.path.join(root, name, "curve.json")):
      todo.append(name)
      continue
    with open(os.path.join(root, name, "argv.json"), encoding="utf-8") as f:
      before = json.load(f)
    if before != argv:
      raise SystemExit(f"{os.path.join(root, name)}: a finished run of {' '.join(before)}, "
                       f"not {' '.join(argv)}; use another workdir")
  for group in [todo] if side_by_side else [[name] for name in todo]:
    procs = {name: start(name) for name in group}
    failed = []
    for name, (proc, log) in procs.items():
      if proc.wait() != 0:
        failed.append(f"{name} (exit {proc.returncode}; see {log.name})")
      log.close()
    if failed:
      raise SystemExit("pretraining failed: " + ", ".join(failed))
  curves = {}
  for name in names:
    with open(os.path.join(root, name, "curve.json"), encoding="utf-8") as f:
      curves[name] = Curve(**json.load(f))
  return curves


def pretrain_child(name: str, label: str, config, root: str, *, checkpoints: int) -> None:
  """The child side of pretrain_in_processes: runs one recipe, writes its curve."""
  curve = pretrain(label, config, os.path.join(root, name), checkpoints=checkpoints)
  write_json(os.path.join(root, name, "curve.json"), curve)


def data_dir(root: str, config) -> str:
  """root/demo_data, the demo data every recipe shares; for a config whose
  training records hold other prediction slots than its recipe's own (recipes.
  modern with another mask_rate), root/demo_data_p{slots}: its own training
  records beside demo_data's text, vocab and held-out records (linked), so
  that every run reads the same text, vocab and held-out examples."""
  shared = os.path.join(root, "demo_data")
  slots = {p.max_seq_length: p.max_predictions_per_seq for p in config.phases.values()}
  own = (paper_config(100) if config.objective == "mlm+nsp" else modern(100)).phases
  if slots == {p.max_seq_length: p.max_predictions_per_seq for p in own.values()}:
    return shared
  path = os.path.join(root, "demo_data_p" + "_".join(str(s) for s in slots.values()))
  os.makedirs(path, exist_ok=True)
  for name in os.listdir(shared):
    if name in ("text", "vocab.txt", "tasks") or name.startswith("eval_"):
      link = os.path.join(path, name)
      if not os.path.lexists(link):
        os.symlink(os.path.join(shared, name), link)
  return path


def prepare_data(configs, root: str) -> None:
  """Builds the demo data every config reads (root/demo_data), before any clock starts."""
  for config in configs:
    config.data.demo_dir = data_dir(root, config)
    demo.prepare_config(config.copy_and_resolve_references(), root)


def eval_pattern(root: str) -> str:
  """The held-out records every recipe is scored on: the paper's, at 15%."""
  return os.path.join(root, "demo_data", "eval_128", "part-*.tfrecord")


def mlm_accuracy(checkpoint: str, pattern: str, max_batches: Optional[int] = None) -> float:
  """Held-out masked-LM accuracy of a checkpoint (any objective but ltr)."""
  params, config, _ = export.read_checkpoint(checkpoint)
  model = BertForPreTraining(config)
  # Masked-LM figures only: an mlm+nsp model's NSP terms are left out.
  run = jax.jit(lambda p, b: step_lib.loss_sums(p, model.apply, b, None, True,
                                                objective="mlm"))
  hits = weight = 0.0
  for batch in evaluation.eval_batches(pattern, EVAL_BATCH, max_seq_length=128,
                                     max_predictions_per_seq=20, max_batches=max_batches,
                                     process_index=0, process_count=1):
    sums = run(params, batch)
    hits += float(sums["mlm_hits"])
    weight += float(sums["mlm_weight"])
  return hits / max(weight, 1.0)


def score_curve(curve: Curve, pattern: str, max_batches: Optional[int]) -> None:
  curve.mlm_accuracy = [
      mlm_accuracy(os.path.join(curve.workdir, "checkpoints", str(s)), pattern, max_batches)
      for s in curve.steps]


def phase_steps(config, step: int) -> dict[str, int]:
  """Steps of each phase of `config` that the run has taken by `step`."""
  return {p.name: max(0, min(step, p.end) - p.start) for p in run_config.phases(config)}


def train_flops(config, model_config, step: int) -> float:
  """Analytic model FLOPs (bertjax.train.flops, what the logs' MFU counts) of
  the run's first `step` steps: each phase's steps x global batch x one row's
  forward and backward at the phase's length and prediction slots."""
  total = 0.0
  for p in run_config.phases(config):
    steps = max(0, min(step, p.end) - p.start)
    total += steps * p.global_batch_size * flops.train_flops_per_sequence(
        model_config, p.max_seq_length, p.max_predictions_per_seq)
  return total


def write_json(path: str, data: Any) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=2, sort_keys=True, default=lambda o: dataclasses.asdict(o))


def first_reaching(curve: Curve, target: float) -> Optional[float]:
  """Wall seconds of the first checkpoint whose accuracy is at least `target`."""
  for t, a in zip(curve.seconds, curve.mlm_accuracy):
    if a >= target:
      return t
  return None


def at_or_before(curve: Curve, seconds: float) -> int:
  """Index of the last checkpoint saved by `seconds` (0 if none)."""
  return max([i for i, t in enumerate(curve.seconds) if t <= seconds] or [0])


def parse_seeds(parser, text: str) -> list[int]:
  """A --seeds flag's comma-separated integers; a parser error otherwise."""
  try:
    seeds = [int(s) for s in text.split(",") if s]
  except ValueError:
    parser.error(f"--seeds={text}: expected integers separated by commas")
  if not seeds:
    parser.error("--seeds: give at least one seed")
  return seeds


def cell(values, fmt: str = "{:.3f}") -> str:
  """The median of the known `values` (None: a seed that never reached a
  target), their range where there are several, and how many are unknown."""
  known = [v for v in values if v is not None]
  if not known:
    return "not reached"
  text = fmt.format(statistics.median(known))
  if len(known) > 1:
    text += " (" + fmt.format(min(known)) + "-" + fmt.format(max(known)) + ")"
  if len(known) < len(values):
    text += f", {len(values) - len(known)} of {len(values)} seeds not reached"
  return text


def median(x) -> float:
  return float(np.median(np.asarray(x, np.float64)))
