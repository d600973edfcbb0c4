"""The metrics of dispatched steps: kept on the devices, read back in batches.

Steps are dispatched asynchronously, so their metrics are device arrays that
are not ready yet. Reading them after every step would stall the pipeline;
instead they wait in `pending` and are read back together (`drain`) when a
log line is due or before a checkpoint. That is also when non-finite steps
are counted: the train step skipped their updates (step.apply_gradients),
and a NonFiniteError naming the step that makes
--config.optimizer.max_nonfinite_in_a_row of them in a row stops the run.
Before a checkpoint, `drain_for_save` also refuses parameters whose norm is
not finite.
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
    """Reads the pending metrics back and counts the non-finite steps among them.

    Raises NonFiniteError at the step that makes max_nonfinite_in_a_row
    non-finite steps in a row.
    """
    if not self._pending:
      return
    pending, self._pending = self._pending, []
    host = jax.device_get([m for _, m in pending])
    for (step, _), m in zip(pending, host):
      if "param_norm" in m:
        self._param_norm = float(m["param_norm"])
      self._window.append(m)
      if bool(m["finite"]):
        self.in_a_row = 0
        continue
      self.skipped += 1
      self.in_a_row += 1
      if self.in_a_row >= self._max_in_a_row:
        raise NonFiniteError(self._stop_message(step))
      logging.warning("Step %d: non-finite loss, gradient or updated parameters; its update "
                      "was skipped (%d in a row, %d in all; --config.%s=%d in a row stop "
                      "the run).", step, self.in_a_row, self.skipped, NONFINITE_FIELD,
                      self._max_in_a_row)

  def _stop_message(self, step: int) -> str:
    first = step - self.in_a_row + 1
    steps, skipped = ((f"at step {step}", "its update was") if first == step else
                      (f"in {self.in_a_row} steps in a row, {first}-{step}",
                       "their updates were"))
    return (f"non-finite loss, gradient or updated parameters {steps} "
            f"(--config.{NONFINITE_FIELD}={self._max_in_a_row}); {skipped} skipped, so "
            f"the parameters are those of step {first - 1}. {self._advice}").rstrip()

  def drain_for_save(self, step: int):
    """Drains; raises NonFiniteError if the parameters of `step` are not finite.

    The train step never keeps non-finite parameters that were finite, so
    this refuses only a state that started non-finite (e.g. loaded weights).
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
