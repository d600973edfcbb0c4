"""The run's config, recorded in the workdir, and the check that a resume is the same run.

A run writes its resolved config to WORKDIR/config.json when it starts. A
rerun in that workdir compares its own config with the record before it
resumes: a change to anything the run computes (total_steps, phase fractions
and batch sizes, seed, model, optimizer, data order, the number of hosts
when each reads its own files, ...) would silently move phase boundaries,
the data position or the learning rate, so it is refused with the changed
fields named. Fields in ALWAYS_SAFE change nothing the run computes and may
differ. Any other change can be made deliberately by naming it in
--config.allow_changes (comma-separated field names, with `*` as a wildcard
as in phases.*.train_files; a group's name, e.g. optimizer, covers its
fields); it is logged, and the record is updated. A change that
moves the resumed step into another phase or data position is refused even
then.
"""

import dataclasses
import fnmatch
import json
import os
from typing import Any, Optional

from absl import logging
import ml_collections

from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.train import run_config

RECORD_FILENAME = "config.json"
# Fields that change nothing the run computes: how often it logs, evaluates
# and saves, what it evaluates on, where it starts from when not resuming,
# where compiled programs are cached, how the state is laid out on the
# devices (restores reshard), and how many non-finite steps in a row stop it.
ALWAYS_SAFE = ("allow_changes", "init_from", "compile_cache_dir", "logging.*", "checkpoint.*",
               "data.prefetch", "data.demo_dir", "mesh.*", "phases.*.eval_files",
               "optimizer.max_nonfinite_in_a_row")
# Not a config field: the number of processes, which decides each host's
# files when data.order is "files".
PROCESS_COUNT = "process_count"


def record(config: ml_collections.ConfigDict, model_config: BertConfig,
           process_count: int) -> dict[str, Any]:
  """The run as recorded: its config with the model resolved (e.g. vocab from the data)."""
  out = json.loads(config.to_json())
  out["model"] = dataclasses.asdict(model_config)
  if config.data.order == "files" and config.data.source == "tfrecord":
    out[PROCESS_COUNT] = process_count
  return out


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(_flatten(value, f"{name}."))
    else:
      out[name] = value
  return out


def changed_fields(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple]:
  """field -> (saved value, current value) for every field that differs."""
  a, b = _flatten(saved), _flatten(current)
  missing = "<absent>"
  return {k: (a.get(k, missing), b.get(k, missing)) for k in sorted(set(a) | set(b))
          if a.get(k, missing) != b.get(k, missing)}


def _matches(field: str, patterns) -> bool:
  """`field` is named by a pattern, or lies in a group a pattern names."""
  return any(fnmatch.fnmatchcase(field, p) or fnmatch.fnmatchcase(field, p + ".*")
             for p in patterns)


def allowed_changes(config: ml_collections.ConfigDict) -> list[str]:
  return [f.strip() for f in config.allow_changes.split(",") if f.strip()]


def check_resume(workdir: str, current: dict[str, Any],
                 config: ml_collections.ConfigDict) -> None:
  """Refuses (ConfigError naming the fields) a rerun whose config differs unsafely.

  Logs each change that is let through. The caller then writes the current
  config as the new record (`write`).
  """
  path = os.path.join(workdir, RECORD_FILENAME)
  if not fileio.exists(path):
    logging.warning("%s has checkpoints but no %s: the config cannot be checked against "
                    "the run's; recording this one.", workdir, RECORD_FILENAME)
    return
  saved = json.loads(fileio.read_text(path))
  changes = changed_fields(saved, current)
  allowed = allowed_changes(config)
  refused = {k: v for k, v in changes.items()
             if not _matches(k, ALWAYS_SAFE) and not _matches(k, allowed)}
  if refused:
    lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
    raise run_config.ConfigError(
        f"--config: this run differs from the one recorded in {path}: {lines}. "
        "Resuming would silently change what the run computes. Rerun with the "
        "recorded values, start in a new workdir, or make the change deliberately "
        f"with --config.allow_changes={','.join(refused)}")
  for k, (a, b) in changes.items():
    how = "always allowed" if _matches(k, ALWAYS_SAFE) else "allowed by --config.allow_changes"
    logging.warning("Config change on resume, %s: %s: %r -> %r", how, k, a, b)


def write(workdir: str, current: dict[str, Any]) -> None:
  """Records the run's config (process 0 writes; the others would write the same)."""
  fileio.makedirs(workdir)
  fileio.write_text(os.path.join(workdir, RECORD_FILENAME),
                    json.dumps(current, indent=2, sort_keys=True))


def check_position(plan: list[run_config.Phase], step: int,
                   meta: Optional[dict[str, Any]]) -> None:
  """Refuses a plan that puts the resumed step in another phase or data position."""
  if meta is None or step >= plan[-1].end:
    return
  phase = run_config.phase_at(plan, step)
  if (phase.name, step - phase.start) != (meta["phase"], meta["data_step"]):
    raise run_config.ConfigError(
        f"--config.allow_changes: the checkpoint at step {step} is in phase "
        f"{meta['phase']} at data step {meta['data_step']}, but with this config step "
        f"{step} is in phase {phase.name} at data step {step - phase.start}: the change "
        "moves the phase boundaries before the resumed step, which would repeat or skip "
        "data. Keep the phases' step ranges up to the resumed step (e.g. extend only "
        "the last phase) or start in a new workdir.")
