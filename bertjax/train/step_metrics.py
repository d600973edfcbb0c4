"""The metrics of dispatched steps: kept on the devices, read back in batches.

Steps are dispatched asynchronously, so their metrics are device arrays that
are not ready yet. Reading them after every step would stall the pipeline;
instead they wait in `pending` and are read back together (`drain`) when a
log line is due or before a checkpoint, which is also when a non-finite step
is found: a checkpoint is written only after every step before it was seen
to be finite.
"""

from typing import Any

import jax


class NonFiniteError(FloatingPointError):
  """A step's loss or gradient was not finite; names the step."""


class StepMetrics:
  """Pending device metrics and the host metrics of the current logging window.

  Args:
    max_in_flight: steps dispatched but not finished before `add` waits for
      the oldest; enough to keep the devices busy, few enough that a
      preemption is acted on promptly.
    on_nonfinite: what to tell the user after "non-finite loss or gradient at
      step N" (e.g. where the last checkpoint is).
  """

  def __init__(self, max_in_flight: int = 2, on_nonfinite: str = ""):
    self._max_in_flight = max_in_flight
    self._advice = on_nonfinite
    self._pending: list[tuple[int, dict[str, Any]]] = []
    self._window: list[dict[str, Any]] = []

  def add(self, step: int, metrics: dict[str, Any]):
    """Keeps the (device) metrics of the step that ends at `step`."""
    self._pending.append((step, metrics))
    if len(self._pending) > self._max_in_flight:
      # Without this wait the loop would run up to a logging interval ahead
      # of the devices, and a preemption would be acted on only when they
      # caught up.
      jax.block_until_ready(self._pending[-1 - self._max_in_flight][1]["loss"])

  def drain(self):
    """Reads the pending metrics back; raises NonFiniteError at the first bad step."""
    if not self._pending:
      return
    host = jax.device_get([m for _, m in self._pending])
    for (step, _), m in zip(self._pending, host):
      if not bool(m["finite"]):
        self._pending.clear()
        raise NonFiniteError(
            f"non-finite loss or gradient at step {step}; the state of step {step - 1} "
            f"is kept and nothing later is checkpointed. {self._advice}".rstrip())
    self._window.extend(host)
    self._pending.clear()

  def take_window(self) -> list[dict[str, Any]]:
    """Drains, then returns and forgets the window's host metrics."""
    self.drain()
    window, self._window = self._window, []
    return window
