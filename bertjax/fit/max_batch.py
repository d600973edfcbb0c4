"""The largest per-device batch whose train step fits a TPU slice (or this machine's
devices), searched by compiles.

Each try is an ahead-of-time compile (bertjax/fit/aot.py) of the step at one
per-device batch; memory grows close to linearly with the batch, so a few
compiles predict the answer and two neighbouring ones confirm it. Used by
`python -m bertjax.fit --find_max_batch` and the fit table
(bertjax/fit/table.py).
"""

import fractions
import math
from typing import NamedTuple

import jax

from bertjax.fit import aot
from bertjax.fit import topology as topology_lib
from bertjax.train import sharding as sharding_lib


MAX_SEARCHED_BATCH = 65536  # Per device; the search stops here.
BATCH_STEP = 8  # The search's resolution: per-device batches are multiples of this.


def packing_factor(config) -> fractions.Fraction | None:
  """data.packing_factor as a fraction (None without packing)."""
  data = config.get("data", {})
  if not data.get("packing", False):
    return None
  return fractions.Fraction(float(data.packing_factor)).limit_denominator(1000)


def search_step(config) -> int:
  """The search's resolution in rows per device: BATCH_STEP, or with packing
  its least multiple that holds a whole number of examples at
  data.packing_factor (8 at 1.25, 40 at 1.1)."""
  factor = packing_factor(config)
  return BATCH_STEP if factor is None else math.lcm(BATCH_STEP, factor.denominator)


def examples_for_rows(config, rows: int) -> int:
  """The global batch size (examples) whose step has `rows` rows:
  rows x data.packing_factor with packing."""
  factor = packing_factor(config)
  return rows if factor is None else int(rows * factor)


class MaxBatch(NamedTuple):
  """find_max_batch's answer: the batch, its compile, and memory per row near it."""
  batch: int  # Largest per-device batch that fits, in rows (packed rows with packing; 0: none).
  result: aot.AotResult | None  # The compile at `batch`.
  bytes_per_item: float | None  # Memory per row, from the two compiles nearest it.


def find_max_batch(make_config, topology: str, phase_name: str, start: int,
                   log=print, known: aot.AotResult | None = None,
                   per_item_hint: float | None = None, vocab_size: int = 30522,
                   num_slices: int = 1, guess: int | None = None,
                   available_bytes: int | None = None) -> MaxBatch:
  """Largest per-device batch (a multiple of search_step) that fits: search over compiles.

  `make_config()` gives a fresh run config (`vocab_size`, `num_slices` and
  `available_bytes` as in aot_compile; vocab_size is used where its model.vocab_size is 0);
  the batch per device is the rows of the step per data-parallel device
  (global batch / (mesh.data x mesh.fsdp); with data.packing, packed rows,
  each compiled with rows x data.packing_factor examples: examples_for_rows),
  and the search starts from a compile at `start` (`known`, when that
  compile is already done). Memory is close to linear in the batch: the first compile
  predicts the answer, from `per_item_hint` (bytes per sequence, e.g. a
  similar search's bytes_per_item) and then the neighbouring batch is
  compiled too, or else as if all but the arguments (parameters and
  optimizer state) grew with the batch. A `guess` (a per-device batch, e.g.
  the answer of a search of the same config and phase on one slice) takes
  the place of that prediction, neighbour included: a right guess costs two
  compiles beyond `known` (one when it is `start`). A compile at that
  prediction fits a line, the line predicts again and compiles around the
  prediction confirm it. The answer is always bracketed by a compile that
  fits and one (search_step larger) that does not; where the predictions
  were off, the bracket narrows by interpolating between its ends
  (bisecting when that did not halve it). The hint and the guess change how
  many compiles that takes, not the answer. A compile that the compiler
  itself stops for lack of HBM (RESOURCE_EXHAUSTED) counts as one that does
  not fit.
  """
  tried: dict[int, aot.AotResult | None] = {}  # None: the compiler ran out of HBM.
  step = search_step(make_config())

  def compile_at(per_device: int) -> aot.AotResult | None:
    if per_device not in tried:
      config = make_config()
      dp = math.prod(sharding_lib.mesh_shape(
          config.mesh, num_devices(topology, num_slices), num_slices)[:2])
      try:
        tried[per_device] = aot.aot_compile(config, topology, phase_name,
                                        examples_for_rows(config, per_device * dp),
                                        vocab_size=vocab_size, num_slices=num_slices,
                                        available_bytes=available_bytes)
        log(f"  per-device batch {per_device}: {aot.gib(tried[per_device].total_bytes)} -> "
            f"{'fits' if tried[per_device].fits else 'does not fit'}")
      except jax.errors.JaxRuntimeError as e:
        if not topology_lib.is_out_of_memory(e):
          raise
        tried[per_device] = None
        log(f"  per-device batch {per_device}: the compiler ran out of HBM -> does not fit")
    return tried[per_device]

  def fits(n: int) -> bool:
    return tried[n] is not None and tried[n].fits

  def to_batch(x: float) -> int:
    return int(min(max(x, step), MAX_SEARCHED_BATCH)) // step * step

  a = max(step, start // step * step)
  if known is not None and start == a:
    tried[a] = known
  ra = compile_at(a)
  while ra is None and a > step:  # Start where the compiler gets through.
    a = max(step, a // 2 // step * step)
    ra = compile_at(a)
  if ra is None or ra.hbm_bytes is None:
    return MaxBatch(0, None, None)
  hbm = ra.hbm_bytes
  growing = ra.total_bytes - ra.argument_bytes
  if guess:
    b = to_batch(guess)
  elif per_item_hint:
    b = to_batch(a + (hbm - ra.total_bytes) / per_item_hint)
  else:
    b = to_batch(a * (hbm - ra.argument_bytes) / growing) if growing > 0 else 2 * a
  if b == a:
    b = a + step if ra.fits else max(step, a - step if guess else a // 2 // step * step)
  if b == a:  # a == step and it does not fit.
    return MaxBatch(0, None, None)
  rb = compile_at(b)
  if guess or per_item_hint:  # An informed guess is usually within a step: try its neighbour.
    neighbour = b + step if fits(b) else b - step
    if neighbour >= step:
      compile_at(neighbour)
  on_line = None  # Where the line through the first two compiles meets the HBM.
  if rb is not None:
    (a1, r1), (b1, r2) = sorted([(a, ra), (b, rb)], key=lambda t: t[0])
    per_item = (r2.total_bytes - r1.total_bytes) / (b1 - a1)
    on_line = (to_batch(a1 + (hbm - r1.total_bytes) / per_item) if per_item > 0
               else MAX_SEARCHED_BATCH)
  lo, hi = 0, None  # lo fits (0: nothing yet); hi does not.
  for n in sorted(tried):
    if fits(n):
      lo = max(lo, n)
    elif hi is None or n < hi:
      hi = n
  for probe in (() if on_line is None else (on_line, on_line + step)):
    if lo < probe and (hi is None or probe < hi):
      compile_at(probe)
      lo, hi = (probe, hi) if fits(probe) else (lo, probe)
  while hi is None and lo < MAX_SEARCHED_BATCH:
    # Still fitting above the line's prediction: extrapolate from the two largest
    # fitting compiles (at least one step, at most doubling).
    below = max(n for n in tried if n < lo)
    slope = (tried[lo].total_bytes - tried[below].total_bytes) / (lo - below)
    room = (hbm - tried[lo].total_bytes) / slope if slope > 0 else lo
    probe = min(max(lo + step, int(lo + room) // step * step), lo * 2, MAX_SEARCHED_BATCH)
    compile_at(probe)
    lo, hi = (probe, None) if fits(probe) else (lo, probe)
  interpolate = True
  while hi is not None and hi - lo > step:
    # Between a fit and a miss: where the line through both meets the HBM,
    # or the midpoint after a step that did not halve the interval.
    mid = (lo + hi) // 2
    if interpolate and lo and tried[hi] is not None:
      slope = (tried[hi].total_bytes - tried[lo].total_bytes) / (hi - lo)
      if slope > 0:
        mid = lo + int((hbm - tried[lo].total_bytes) / slope)
    mid = min(max(lo + step, mid // step * step), hi - step)
    compile_at(mid)
    width = hi - lo
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    interpolate = 2 * (hi - lo) <= width
  measured = sorted((n for n in tried if tried[n] is not None), key=lambda n: abs(n - lo))
  per_item = None
  if len(measured) >= 2:
    (n0, r0), (n1, r1) = sorted((n, tried[n]) for n in measured[:2])
    per_item = (r1.total_bytes - r0.total_bytes) / (n1 - n0)
  return MaxBatch(lo, tried.get(lo), per_item if per_item and per_item > 0 else None)


def num_devices(topology: str, num_slices: int = 1) -> int:
  return len(topology_lib.devices(topology, num_slices))
