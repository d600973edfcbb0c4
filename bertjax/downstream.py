"""Fine-tuning runs for the command line and the demo: the run a config asks for,
with bertjax.convert.weights.finetuning_loader's weights for init_from, and the demo's
downstream step.

Kept apart from bertjax/finetune.py's flags so that other entry points (the
demo after pretraining) call it too.
"""

import json
import os
import sys

from absl import logging
import jax
import ml_collections

from bertjax.convert import weights
from bertjax.records import fileio
from bertjax.tasks import loop
from bertjax.tasks import submissions

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def take_checkpoint_settings(config, explicit=frozenset()) -> None:
  """Sets config.model's architecture fields (but vocab_size, which comes from
  the vocab and must equal the checkpoint's) and config.do_lower_case to what
  the checkpoint in config.init_from says (weights.checkpoint_settings).

  `explicit` names the fields the user set (e.g. {"model.hidden_size"}, the
  command line's --config.* overrides); those keep their value, and one that
  contradicts the checkpoint is refused naming the field: here for the
  casing, by load_weights for the architecture.
  """
  if not config.init_from:
    return
  settings = weights.checkpoint_settings(config.init_from)
  for field, value in settings.model.items():
    if field != "vocab_size" and f"model.{field}" not in explicit:
      if config.model[field] != value:
        logging.info("model.%s=%s from %s.", field, value, config.init_from)
      config.model[field] = value
  lower = settings.do_lower_case
  if lower is None:
    return
  if "do_lower_case" in explicit and bool(config.do_lower_case) != lower:
    raise ValueError(
        f"--config.do_lower_case={config.do_lower_case}, but {config.init_from} is "
        f"{'an uncased' if lower else 'a cased'} model ({settings.casing_source}); drop "
        f"the flag or pass --config.do_lower_case={lower}")
  if bool(config.do_lower_case) != lower:
    logging.info("do_lower_case=%s: %s.", lower, settings.casing_source)
  config.do_lower_case = lower


def hidden_size(config, workdir: str, explicit=frozenset()) -> int:
  """The hidden size `finetune` will run with (the checkpoint's unless set),
  read without changing `config`."""
  if "model.hidden_size" in explicit or not config.init_from:
    return int(config.model.hidden_size)
  init_from = (fileio.under(workdir, config.init_from) if config.within_workdir
               else config.init_from)
  return int(weights.checkpoint_settings(init_from).model.get("hidden_size",
                                                               config.model.hidden_size))


def finetune(config, workdir: str, explicit=frozenset()) -> dict:
  """The run the config asks for: one fine-tuning, the sweep, or the comparison
  with random initialisation, with the architecture and casing of init_from's
  checkpoint but for the fields in `explicit` (take_checkpoint_settings).
  Returns {"preempted_at_step": step} when a SIGTERM stopped it (saved; a rerun
  resumes). With config.within_workdir, the run goes to workdir/downstream and its
  results also into workdir/summary.json (the pretraining run's summary)
  under "downstream"."""
  if not config.within_workdir:
    take_checkpoint_settings(config, explicit)
    return _run(config, workdir)
  for field in ("init_from", "data_dir", "vocab_file"):
    config[field] = fileio.under(workdir, config[field])
  take_checkpoint_settings(config, explicit)
  result = _run(config, os.path.join(workdir, "downstream"))
  if "preempted_at_step" in result:
    return result
  summary_path = os.path.join(workdir, "summary.json")
  if jax.process_index() == 0 and fileio.exists(summary_path):
    summary = json.loads(fileio.read_text(summary_path))
    summary["downstream"] = result
    fileio.write_text(summary_path, json.dumps(summary, indent=2, sort_keys=True))
  return result


def _run(config, workdir: str) -> dict:
  """config.mode: train (fine-tune and score dev), predict (test-set files from the
  checkpoint in predict_from or WORKDIR/checkpoints) or train_and_predict (the
  test-set files from the checkpoint that earned the run's best dev score,
  loop.prediction_checkpoint; a sweep's best run's, a random_init_baseline's
  pretrained run's)."""
  submissions.check_mode(config)
  if config.mode == "predict":
    return submissions.predict_test(config, workdir)
  loader = weights.finetuning_loader(config.segment_b_init)
  # The run to predict with: its best evaluation and its workdir.
  if config.sweep.enabled:
    result = loop.sweep(config, workdir, weights_loader=loader)
    best_run = result.get("best", {})
    best, run_dir = best_run.get("best"), best_run.get("workdir")
  elif config.random_init_baseline:
    result = loop.compare_with_random_init(config, workdir, weights_loader=loader)
    best, run_dir = result.get("pretrained_best"), os.path.join(workdir, "pretrained")
  else:
    result = loop.finetune_and_evaluate(config, workdir, weights_loader=loader)
    best, run_dir = result.get("best"), workdir
  if config.mode == "train_and_predict" and "preempted_at_step" not in result:
    predict_config = ml_collections.ConfigDict(config.to_dict())
    predict_config.predict_from = (config.predict_from
                                   or loop.prediction_checkpoint(best, run_dir))
    result = dict(result, test=submissions.predict_test(predict_config, workdir))
  return result


def demo_config():
  """configs/finetune/demo.py's config."""
  sys.path.insert(0, os.path.join(_REPO, "configs", "finetune"))
  import demo  # pylint: disable=g-import-not-at-top
  return demo.get_config()


def demo_downstream(workdir: str, config=None, demo_dir: str = "") -> dict:
  """The demo's downstream step (`config`, default demo_config()) after the demo's
  pretraining in `workdir`: both dev scores go into workdir/summary.json.
  `demo_dir`, if given, is the demo data the pretraining read (its
  data.demo_dir: relative to the workdir or absolute), in place of the
  config's data_dir and its vocab."""
  config = config or demo_config()
  if demo_dir:
    config.data_dir = demo_dir
    config.vocab_file = os.path.join(demo_dir, "vocab.txt")
  return finetune(config, workdir)
