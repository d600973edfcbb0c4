"""The metrics of dispatched steps: kept on the devices, read back in batches.

Steps are dispatched asynchronously, so their metrics are device arrays that
are not ready yet. Reading them all after every step would stall the
pipeline; instead they wait in `pending` and are read back together
(`drain`) when a log line is due or before a checkpoint. Whether a step was
finite is read sooner: `add` keeps at most `max_in_flight` steps unfinished,
and reads the one-element `finite` flag of each step it has waited for. So
non-finite steps are counted as they finish: the train step skipped their
updates (step.apply_gradients), and a NonFiniteError naming the step that
makes --config.optimizer.max_nonfinite_in_a_row of them in a row stops the
run once that step finishes, with at most `max_in_flight` later steps
dispatched (and never saved). Before a checkpoint, `drain_for_save` also
refuses parameters whose norm is not finite.
"""

import math
from typing import Any

from absl import logging
import jax

NONFINITE_FIELD = "optimizer.max_nonfinite_in_a_row"


class NonFiniteError(FloatingPointError):
  """Too many non-finite steps in a row, or non-finite parameters to save; names the step."""


class StepMetrics:
  """Pending device metrics and the host metrics of the current logging window.

  Args:
    max_in_flight: steps dispatched but not finished before `add` waits for
      the oldest; enough to keep the devices busy, few enough that a
      preemption is acted on promptly.
    on_nonfinite: what to tell the user after the message that stops the run
      (e.g. where the last checkpoint is).
    max_nonfinite_in_a_row: the run stops at the step that makes this many
      non-finite steps in a row (--config.optimizer.max_nonfinite_in_a_row).
    skipped, in_a_row: the counts to go on from (a resumed checkpoint's).
  """

  def __init__(self, max_in_flight: int = 2, on_nonfinite: str = "",
               max_nonfinite_in_a_row: int = 1, skipped: int = 0, in_a_row: int = 0):
    self._max_in_flight = max_in_flight
    self._advice = on_nonfinite
    self._max_in_a_row = max_nonfinite_in_a_row
    self.skipped = skipped  # Non-finite (skipped) steps, all together.
    self.in_a_row = in_a_row  # Non-finite steps since the last finite one.
    self._param_norm: float | None = None  # Of the latest step read back.
    # (step, device metrics), oldest first; the first `_counted` of them have
    # had their `finite` flag read and counted.
    self._pending: list[tuple[int, dict[str, Any]]] = []
    self._counted = 0
    self._window: list[dict[str, Any]] = []

  def add(self, step: int, metrics: dict[str, Any]):
    """Keeps the (device) metrics of the step that ends at `step`.

    Waits for the step `max_in_flight` before it and counts it if it was not
    finite (raising NonFiniteError at the one that makes too many in a row).
    """
    self._pending.append((step, metrics))
    oldest = len(self._pending) - 1 - self._max_in_flight
    if oldest >= 0:
      # Without this wait the loop would run up to a logging interval ahead
      # of the devices, and a preemption (or a run of non-finite steps) would
      # be acted on only when they caught up. Steps are added one at a time,
      # so every earlier pending step is counted already.
      done_step, done = self._pending[oldest]
      self._count(done_step, bool(jax.device_get(done["finite"])))
      self._counted = oldest + 1

  def drain(self):
    """Reads the pending metrics back and counts the non-finite steps among them.

    Raises NonFiniteError at the step that makes max_nonfinite_in_a_row
    non-finite steps in a row.
    """
    if not self._pending:
      return
    pending, counted = self._pending, self._counted
    self._pending, self._counted = [], 0
    host = jax.device_get([m for _, m in pending])
    for i, ((step, _), m) in enumerate(zip(pending, host)):
      if "param_norm" in m:
        self._param_norm = float(m["param_norm"])
        if bool(m["finite"]) and not math.isfinite(self._param_norm):
          raise NonFiniteError(
              f"the update of step {step} made the parameters non-finite (param_norm "
              f"{self._param_norm}) from a finite loss and gradient: they are lost, and "
              f"nothing after the latest checkpoint is saved. {self._advice}".rstrip())
      self._window.append(m)
      if i >= counted:
        self._count(step, bool(m["finite"]))

  def _count(self, step: int, finite: bool):
    """Counts one finished step; raises NonFiniteError at the one that makes
    max_nonfinite_in_a_row non-finite steps in a row."""
    if finite:
      self.in_a_row = 0
      return
    self.skipped += 1
    self.in_a_row += 1
    if self.in_a_row >= self._max_in_a_row:
      raise NonFiniteError(self._stop_message(step))
    logging.warning("Step %d: non-finite loss or gradient; its update "
                    "was skipped (%d in a row, %d in all; --config.%s=%d in a row stop "
                    "the run).", step, self.in_a_row, self.skipped, NONFINITE_FIELD,
                    self._max_in_a_row)

  def _stop_message(self, step: int) -> str:
    first = step - self.in_a_row + 1
    steps, skipped = ((f"at step {step}", "its update was") if first == step else
                      (f"in {self.in_a_row} steps in a row, {first}-{step}",
                       "their updates were"))
    return (f"non-finite loss or gradient {steps} "
            f"(--config.{NONFINITE_FIELD}={self._max_in_a_row}); {skipped} skipped, so "
            f"the parameters are those of step {first - 1}. {self._advice}").rstrip()

  def drain_for_save(self, step: int):
    """Drains; raises NonFiniteError if the parameters of `step` are not finite.

    The train step keeps the parameters of a step with a non-finite loss or
    gradient, and drain stops the run at an update that made them
    non-finite, so this refuses a state that started non-finite (e.g. loaded
    weights).
    """
    self.drain()
    if self._param_norm is not None and not math.isfinite(self._param_norm):
      raise NonFiniteError(
          f"the parameters at step {step} are not finite (param_norm {self._param_norm}): "
          f"not checkpointing them. {self._advice}".rstrip())

  def counts(self) -> dict[str, int]:
    """The non-finite steps so far: all together, and in a row up to the latest."""
    return {"skipped_steps": self.skipped, "nonfinite_in_a_row": self.in_a_row}

  def take_window(self) -> list[dict[str, Any]]:
    """Drains, then returns and forgets the window's host metrics."""
    self.drain()
    window, self._window = self._window, []
    return window
