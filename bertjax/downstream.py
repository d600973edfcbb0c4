"""Fine-tuning runs for the command line and the demo: the run a config asks for,
with bertjax.convert.weights.load_weights for init_from, and the demo's downstream step.

Kept apart from bertjax/finetune.py's flags so that other entry points (the
demo after pretraining) call it too.
"""

import json
import os
import sys

import jax

from bertjax.convert.weights import load_weights
from bertjax.records import fileio
from bertjax.tasks import loop

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def finetune(config, workdir: str) -> dict:
  """The run the config asks for: one fine-tuning, the sweep, or the comparison
  with random initialisation. With config.within_workdir, the run goes to
  workdir/downstream and its results also into workdir/summary.json (the
  pretraining run's summary) under "downstream"."""
  if not config.within_workdir:
    return _run(config, workdir)
  for field in ("init_from", "data_dir", "vocab_file"):
    config[field] = fileio.under(workdir, config[field])
  result = _run(config, os.path.join(workdir, "downstream"))
  summary_path = os.path.join(workdir, "summary.json")
  if jax.process_index() == 0 and fileio.exists(summary_path):
    summary = json.loads(fileio.read_text(summary_path))
    summary["downstream"] = result
    fileio.write_text(summary_path, json.dumps(summary, indent=2, sort_keys=True))
  return result


def _run(config, workdir: str) -> dict:
  if config.sweep.enabled:
    return loop.sweep(config, workdir, weights_loader=load_weights)
  if config.random_init_baseline:
    return loop.compare_with_random_init(config, workdir, weights_loader=load_weights)
  return loop.finetune_and_evaluate(config, workdir, weights_loader=load_weights)


def demo_config():
  """configs/finetune/demo.py's config."""
  sys.path.insert(0, os.path.join(_REPO, "configs", "finetune"))
  import demo  # pylint: disable=g-import-not-at-top
  return demo.get_config()


def demo_downstream(workdir: str, config=None) -> dict:
  """The demo's downstream step (`config`, default demo_config()) after the demo's
  pretraining in `workdir`: both dev scores go into workdir/summary.json."""
  return finetune(config or demo_config(), workdir)
