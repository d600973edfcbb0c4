"""Checkpoints with orbax: async, atomic, keep-the-last-K, local or gs://.

A checkpoint holds three items: `params`, `opt_state` (with the step) and
`meta` (JSON: phase, the data position within the phase, the run's seed and
base rng). Parameters are an item of their own so that `init_from` reads
them without the optimizer state. Orbax writes each checkpoint under a
temporary name and renames it when complete, so an interrupted save is never
picked up.
"""

import contextlib
import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from bertjax.train.state import TrainState


def _abstract(tree, shardings):
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


class _Manager(ocp.CheckpointManager):
  """A CheckpointManager that leaves JAX's preemption sync point to the loop.

  The sync point must be asked with consecutive step numbers (see
  preemption.py); orbax asks it too, when a save starts and, on process 0,
  from its finalize thread with the step of a save that may be several steps
  old, which would report a stale step when a preemption is announced and
  could let the hosts pick different stopping steps. The loop saves
  explicitly (force=True) at the step its PreemptionGuard picks.
  """

  def reached_preemption(self, step: int) -> bool:
    del step
    return False


class CheckpointSaveError(OSError):
  """A checkpoint could not be written; the ones before it are intact."""


class Checkpointer:
  """Saves and restores the full training state in `directory`.

  A save that fails (a full disk, a path that cannot be written) raises
  CheckpointSaveError, with an async save at the next save, wait or close.
  Orbax renames a checkpoint into place only when all of it is written, so
  the failed step is never resumed from and the previous ones stay intact.
  """

  def __init__(self, directory: str, *, keep: int, async_save: bool):
    self.directory = directory
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self._manager = _Manager(
        directory, options=options, item_names=("params", "opt_state", "meta"))
    self._saving: Optional[int] = None  # The step of the save last started.

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, state: TrainState, meta: dict[str, Any], *, force: bool = True) -> bool:
    """Starts saving `state` at its step; returns at once when async.

    A step that is already saved (e.g. a preemption right after a periodic
    save) is not written again; returns False then.
    """
    step = int(jax.device_get(state.step))
    if step in self._manager.all_steps():
      return False
    meta = dict(meta, step=step)
    args = ocp.args.Composite(
        params=ocp.args.StandardSave(state.params),
        opt_state=ocp.args.StandardSave({"opt_state": state.opt_state, "step": state.step}),
        meta=ocp.args.JsonSave(meta))
    with self._save_errors(step):
      return self._manager.save(step, args=args, force=force)

  @contextlib.contextmanager
  def _save_errors(self, step: Optional[int]):
    """Turns a failed save (of `step`, or of the async save before it) into a clear error."""
    failed = self._saving
    self._saving = step
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      failed = failed if failed is not None else step
      self._saving = None
      latest = self._manager.latest_step()
      raise CheckpointSaveError(
          f"the checkpoint of step {failed} could not be written in {self.directory}: "
          f"{e}. Is the disk full, or the directory not writable? "
          + (f"The last complete checkpoint, of step {latest}, is intact: make room "
             "and rerun to resume from it." if latest is not None else
             "No checkpoint was complete before it.")) from e

  def restore(self, state: TrainState, shardings: TrainState,
              step: Optional[int] = None) -> tuple[TrainState, dict[str, Any]]:
    """The checkpoint at `step` (default latest), placed by `shardings`.

    `state` gives the structure, shapes and dtypes: a TrainState of arrays or
    of jax.ShapeDtypeStructs (nothing needs to be initialised first).
    """
    step = self.latest_step() if step is None else step
    restored = self._manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(_abstract(state.params, shardings.params)),
        opt_state=ocp.args.StandardRestore(_abstract(
            {"opt_state": state.opt_state, "step": state.step},
            {"opt_state": shardings.opt_state, "step": shardings.step})),
        meta=ocp.args.JsonRestore()))
    new_state = state.replace(params=restored["params"],
                              opt_state=restored["opt_state"]["opt_state"],
                              step=restored["opt_state"]["step"])
    return new_state, dict(restored["meta"])

  def wait(self):
    """Waits for the async save in flight; raises CheckpointSaveError if it failed."""
    with self._save_errors(None):
      self._manager.wait_until_finished()

  def close(self):
    try:
      self.wait()
    except CheckpointSaveError:
      with contextlib.suppress(Exception):  # Orbax raises the same failure again.
        self._manager.close()
      raise
    self._manager.close()


def rng_to_json(rng) -> list[int]:
  return [int(x) for x in np.asarray(jax.random.key_data(rng)).ravel()]


def rng_from_json(data: list[int]):
  return jax.random.wrap_key_data(np.asarray(data, np.uint32))


# ---------------------------------------------------------------------------
# Reading one checkpoint elsewhere (export, init_from): read-only, through
# orbax's public API, local or gs://, into any abstract target, so that a
# checkpoint saved on one topology (a pod's mesh) restores on another (one
# workstation device, another mesh).

@contextlib.contextmanager
def _reader(directory: str):
  manager = ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(
          read_only=True, create=False, save_interval_steps=0),
      item_handlers={"params": ocp.StandardCheckpointHandler(),
                     "opt_state": ocp.StandardCheckpointHandler(),
                     "meta": ocp.JsonCheckpointHandler()})
  try:
    yield manager
  finally:
    manager.close()


def find_step(path: str) -> tuple[str, int]:
  """(checkpoints directory, step) for `path`: a checkpoints directory (its
  latest complete step) or one step directory of it."""
  from bertjax.records import fileio  # pylint: disable=g-import-not-at-top
  path = path.rstrip("/")
  if not fileio.isdir(path):
    raise ValueError(f"{path}: no such checkpoint directory")
  parent, name = os.path.split(path)
  if name.isdigit() and fileio.isdir(os.path.join(path, "params")):
    return parent, int(name)
  with _reader(path) as manager:
    step = manager.latest_step()
  if step is None:
    raise ValueError(f"{path}: holds no bertjax checkpoint (no complete step directory "
                     "with a params/ item)")
  return path, step


def read_meta(path: str) -> dict[str, Any]:
  """The `meta` item (JSON) of the checkpoint at `path` (see find_step)."""
  directory, step = find_step(path)
  with _reader(directory) as manager:
    restored = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
  return dict(restored["meta"], step=step)


def saved_params_shapes(path: str) -> Any:
  """The saved parameters' tree as jax.ShapeDtypeStructs (no sharding): what
  was saved, whatever the model code or mesh that saved it."""
  directory, step = find_step(path)
  with _reader(directory) as manager:
    saved = manager.metadata(step).item_metadata["params"]
  saved = getattr(saved, "tree", saved)
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), saved)


def restore_params(path: str, abstract_params) -> Any:
  """The parameters of the checkpoint at `path`, restored into `abstract_params`.

  `abstract_params` is a tree of jax.ShapeDtypeStructs whose shardings say
  where each array goes (one device, or any mesh whatever the mesh it was
  saved from); its shapes must be the saved ones.
  """
  directory, step = find_step(path)
  logging.info("Reading parameters of step %d from %s", step, directory)
  with _reader(directory) as manager:
    restored = manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params)))
  return restored["params"]
