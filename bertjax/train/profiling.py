"""Seeing where a run's time goes: the compilation cache, profiler traces, utilisation.

- `enable_compilation_cache(directory)`: JAX's persistent compilation cache,
  so that the second start of the same program on the same devices loads
  its executables instead of compiling them. Call it before the first
  compile of the process.
- `ProfileWindow(start, count, logdir)`: a `jax.profiler` trace of steps
  [start, start + count), written where TensorBoard's profile plugin finds
  it (logdir/plugins/profile/...).
- `compiled_flops(compiled)`: the FLOPs of one call of a compiled program
  per device, from XLA's cost analysis (None where the backend gives none);
  `utilisation(...)`: achieved over peak FLOP/s by two counts, under two
  names. `mfu` (model FLOPs utilisation) always takes bertjax's analytic
  count (flops.py). `hfu` (hardware FLOPs utilisation) takes XLA's count,
  which includes everything the program computes (recomputation under
  remat, softmax, LayerNorm, the optimizer), and only where XLA counts the
  whole step (a compiled program without loops: `whole_step_flops`).
"""

import os
import re
from typing import Any

from absl import logging
import jax

from bertjax.model import layers
from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.train import flops as flops_lib

CACHE_EVENTS = ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses")


def cache_dir(setting: str, workdir: str) -> str:
  """config.compile_cache_dir resolved: relative paths are inside the workdir."""
  return fileio.under(workdir, setting)


def enable_compilation_cache(directory: str, min_compile_seconds: float = 1.0) -> str:
  """Keeps every executable that took at least `min_compile_seconds` to compile in `directory`.

  Local paths and gs:// both work. Entries are keyed by the program, the
  devices and the JAX/XLA versions, so a changed config or a new slice
  simply compiles again. Returns the directory.
  """
  if not directory:
    raise ValueError("enable_compilation_cache: the directory is empty")
  if "://" not in directory:
    os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_seconds)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  logging.info("compilation cache: %s", directory)
  return directory


class CacheCounter:
  """Counts persistent-cache hits and misses from JAX's monitoring events."""

  def __init__(self):
    self.hits = 0
    self.misses = 0
    jax.monitoring.register_event_listener(self._on_event)

  def _on_event(self, event: str, **_):
    if event == CACHE_EVENTS[0]:
      self.hits += 1
    elif event == CACHE_EVENTS[1]:
      self.misses += 1


class ProfileWindow:
  """Traces steps [start, start + count) into `logdir` (count 0: never).

  Call `before_step(step)` before dispatching each step and
  `after_step(step, outputs)` after it; the trace stops once the last
  traced step's outputs are ready, so it holds whole steps.
  """

  def __init__(self, start: int, count: int, logdir: str):
    if start < 0 or count < 0:
      raise ValueError(f"logging.profile_steps: start and count must be >= 0, got "
                       f"({start}, {count})")
    self.start, self.count, self.logdir = start, count, logdir
    self.active = False
    self.done = count == 0

  def before_step(self, step: int):
    if not self.done and not self.active and self.start <= step < self.start + self.count:
      jax.profiler.start_trace(self.logdir)
      self.active = True
      logging.info("profiler: tracing steps %d-%d into %s", step,
                   self.start + self.count - 1, self.logdir)

  def after_step(self, step: int, outputs: Any = None):
    if self.active and step + 1 >= self.start + self.count:
      self.stop(outputs)

  def stop(self, outputs: Any = None):
    """Ends the trace (also when the run stops inside the window)."""
    if self.active:
      jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self.active = False
      self.done = True


def compiled_flops(compiled) -> float | None:
  """FLOPs of one call of `compiled` on one device, from XLA's cost analysis."""
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return None  # Some backends implement no cost analysis.
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  flops = (analysis or {}).get("flops")
  return float(flops) if flops and flops > 0 else None


def count_loops(compiled) -> int | None:
  """`while` loops in the optimized program (None when its text is unavailable).

  XLA's cost analysis counts each loop body once. Besides scanned layers and
  micro-batches, XLA makes loops of its own: on TPU, FSDP's all-gathered
  matmuls become windowed einsums, a loop over the shards, so such a step is
  counted at a fraction of its FLOPs.
  """
  try:
    text = compiled.as_text()
  except Exception:  # pylint: disable=broad-except
    return None
  return len(re.findall(r"\swhile\(", text or ""))


def has_loops(compiled) -> bool:
  """Whether XLA's count may miss loop trips (a loop, or a program it cannot show)."""
  loops = count_loops(compiled)
  return loops is None or loops > 0


def whole_step_flops(compiled) -> float | None:
  """compiled_flops where XLA counts the whole program (no loops), else None."""
  return None if has_loops(compiled) else compiled_flops(compiled)


def complete_count(model_config: BertConfig, grad_accum_steps: int) -> bool:
  """Whether XLA's cost analysis counts the whole train step.

  It counts a loop's body once, whatever the trip count, so with layers run
  in a loop (scanned, model.layer_loop scan) or scanned micro-batches it
  sees one layer of many (or one micro-batch of many). A check before
  compiling, for the platform being compiled for; loops XLA makes itself
  show only in the compiled program (has_loops).
  """
  looped = model_config.scan_layers and not layers.unrolls(model_config)
  return not looped and grad_accum_steps == 1


def utilisation(*, step_seconds: float, num_chips: int, peak_tflops_per_chip: float | None,
                model_config: BertConfig, seq_len: int, num_predictions: int,
                global_batch_size: int, compiled_step_flops: float | None = None,
                grad_accum_steps: int = 1, num_examples: int = 1) -> dict[str, float]:
  """Achieved over peak FLOP/s: {"mfu": ..., "hfu": ...}, each where it is known.

  "mfu", model FLOPs utilisation: bertjax's analytic count of the global
  batch (flops.mfu) of `global_batch_size` rows, each with `num_predictions`
  masked-LM and `num_examples` [CLS] slots (packed rows hold several
  examples: run_config.row_slots). "hfu", hardware FLOPs utilisation: compiled_step_flops
  (XLA's count per device, whole_step_flops: None where the program has
  loops), only where it is given and the config has no scanned loops
  (complete_count). Empty when the chip's peak is unknown (e.g. CPU).
  """
  if not peak_tflops_per_chip:
    return {}
  sequences_per_second = global_batch_size / step_seconds
  out = {"mfu": flops_lib.mfu(model_config, seq_len, num_predictions, sequences_per_second,
                              num_chips, peak_tflops_per_chip, num_examples)}
  if compiled_step_flops and complete_count(model_config, grad_accum_steps):
    out["hfu"] = compiled_step_flops / step_seconds / (peak_tflops_per_chip * 1e12)
  return out
