"""Fine-tuning runs for the command line and the demo: the weights loader with its
architecture check, the run a config asks for, and the demo's downstream step.

Kept apart from bertjax/finetune.py's flags so that other entry points (the
demo after pretraining) call it too.
"""

import json
import os
import sys

import jax

from bertjax.convert.weights import load_weights
from bertjax.tasks import loop

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ARCHITECTURE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size")


def load_encoder_weights(path: str, abstract_params, model_config):
  """load_weights, after checking a bertjax checkpoint's recorded architecture
  against --config.model field by field (Hugging Face directories are checked
  by load_weights against their config.json)."""
  recorded = _recorded_architecture(path)
  for field in _ARCHITECTURE:
    if field in recorded and recorded[field] != getattr(model_config, field):
      raise ValueError(
          f"--config.model.{field}={getattr(model_config, field)} but the checkpoint "
          f"in --config.init_from={path} has {field}={recorded[field]}")
  return load_weights(path, abstract_params, model_config)


def _recorded_architecture(path: str) -> dict:
  """The model fields a bertjax checkpoint's meta records ({} for other formats)."""
  if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")):
    return {}
  steps = [path] if os.path.isdir(os.path.join(path, "meta")) else sorted(
      (os.path.join(path, d) for d in os.listdir(path)
       if d.isdigit() and os.path.isdir(os.path.join(path, d, "meta"))),
      key=lambda d: int(os.path.basename(d)))
  meta_path = os.path.join(steps[-1], "meta", "metadata") if steps else ""
  if not os.path.exists(meta_path):
    return {}
  with open(meta_path, encoding="utf-8") as f:
    return json.load(f).get("model", {})


def finetune(config, workdir: str) -> dict:
  """The run the config asks for: one fine-tuning, the sweep, or the comparison
  with random initialisation. With config.within_workdir, the run goes to
  workdir/downstream and its results also into workdir/summary.json (the
  pretraining run's summary) under "downstream"."""
  if not config.within_workdir:
    return _run(config, workdir)
  for field in ("init_from", "data_dir", "vocab_file"):
    if config[field] and not os.path.isabs(config[field]) and "://" not in config[field]:
      config[field] = os.path.join(workdir, config[field])
  result = _run(config, os.path.join(workdir, "downstream"))
  summary_path = os.path.join(workdir, "summary.json")
  if jax.process_index() == 0 and os.path.exists(summary_path):
    with open(summary_path, encoding="utf-8") as f:
      summary = json.load(f)
    summary["downstream"] = result
    with open(summary_path, "w", encoding="utf-8") as f:
      f.write(json.dumps(summary, indent=2, sort_keys=True))
  return result


def _run(config, workdir: str) -> dict:
  if config.sweep.enabled:
    return loop.sweep(config, workdir, weights_loader=load_encoder_weights)
  if config.random_init_baseline:
    return loop.compare_with_random_init(config, workdir, weights_loader=load_encoder_weights)
  return loop.finetune_and_evaluate(config, workdir, weights_loader=load_encoder_weights)


def demo_config():
  """configs/finetune/demo.py's config."""
  sys.path.insert(0, os.path.join(_REPO, "configs", "finetune"))
  import demo  # pylint: disable=g-import-not-at-top
  return demo.get_config()


def demo_downstream(workdir: str, config=None) -> dict:
  """The demo's downstream step (`config`, default demo_config()) after the demo's
  pretraining in `workdir`: both dev scores go into workdir/summary.json."""
  return finetune(config or demo_config(), workdir)
