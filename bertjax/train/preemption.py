"""The preemption guard: one decision to stop, taken at the same step on every host.

A platform announces a preemption with SIGTERM, often to one host only. The
guard turns that notice into a step at which every host saves and stops:

* Several processes (jax.distributed is initialised): JAX's preemption sync
  manager owns SIGTERM. Its C++ handler records the notice and shares it
  through the coordination service; each host reports the step it is at, and
  the sync point is the step after the furthest one, so every host reaches it
  (`multihost_utils.reached_preemption_sync_point`). The guard installs no
  handler of its own here: a Python handler would replace JAX's, and the
  notice would never reach the other hosts.
* One process: a Python SIGTERM handler sets a flag, read after each step.

`reached(step)` must be called after every step, with consecutive step
numbers, on every host; it is the only place the loop learns of a preemption.
"""

import signal
import threading

from absl import logging
import jax
from jax.experimental import multihost_utils


class PreemptionGuard:
  """Use as a context manager around the training loop."""

  def __init__(self):
    self._requested = threading.Event()
    self._previous = None
    self._multihost = jax.distributed.is_initialized()

  def __enter__(self) -> "PreemptionGuard":
    if not self._multihost and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM: saving a checkpoint and stopping after this step.")
    self._requested.set()

  def reached(self, step: int) -> bool:
    """True on every host at one and the same step once a preemption is announced."""
    if not self._multihost:
      return self._requested.is_set()
    try:
      return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError as e:  # The preemption service is off.
      logging.warning("No synchronised preemption (%s): a SIGTERM ends this process "
                      "without a checkpoint.", e)
      self._multihost = None
      return False
