"""glibc malloc settings for a process whose JAX computation runs on the CPU.

XLA's CPU runtime allocates a train step's buffers with malloc on every
execution and frees them afterwards. With glibc's defaults, a buffer over the
adaptive mmap threshold (at most 32 MiB; the masked-LM logits of one batch are
more) is a fresh mmap each step, and a worker thread's arena heap is unmapped
once it empties, so each step page-faults its buffers in again: 138,240 minor
faults a step for the L=4/H=256 step of `bertjax.benchmarks.step_vs_hf`,
which prints them (docs/performance.md).

`TUNABLES` keep freed memory in the process instead: one arena (every thread
allocates from the main heap), no mmap for large blocks, and a 2 GiB trim
threshold. glibc reads GLIBC_TUNABLES when the process starts, before any
thread has its own arena, so `reexec_for_cpu()` re-executes the command
line once with them set; the command-line programs call it before anything
else. The price is that the process keeps its peak heap until it exits.

Only where JAX will run on the CPU alone: JAX_PLATFORMS lists only `cpu`, or
is unset and no accelerator plugin (libtpu, a jax_plugins package) is
installed. On a TPU or GPU host the step's buffers live on the device and the
host's threads are the input pipeline's, for which one arena is not measured.
BERTJAX_HOST_MALLOC=default turns it off.

`one_arena()` is the one-arena part alone, set from inside a running
process for a block: data creation's in-process run starts its serialising
threads inside one.
"""

import contextlib
import functools
import os
import platform
import sys
from typing import Iterator, Mapping, Optional

TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int
TUNABLES = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
            f"glibc.malloc.trim_threshold={TRIM_THRESHOLD}")
OPT_OUT = "BERTJAX_HOST_MALLOC"  # "default": keep glibc's defaults

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


@functools.cache  # bertjax.main asks at start-up and again in run()
def accelerator_installed() -> bool:
  """Whether a JAX accelerator plugin (libtpu, a jax_plugins package) is installed."""
  # Imported here: importlib.metadata alone takes 60 ms, which data creation
  # (one_arena, below) does not need.
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  import pkgutil  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec("libtpu") is not None:
    return True
  try:
    import jax_plugins  # pylint: disable=g-import-not-at-top
    if any(pkgutil.iter_modules(jax_plugins.__path__)):
      return True
  except ImportError:
    pass
  return bool(importlib.metadata.entry_points(group="jax_plugins"))


def cpu_only(environ: Mapping[str, str]) -> bool:
  """Whether JAX in a process with this environment runs on the CPU alone."""
  platforms = [p.strip() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
  if platforms:
    return all(p == "cpu" for p in platforms)
  return not accelerator_installed()


def wanted_tunables(environ: Mapping[str, str]) -> Optional[str]:
  """The GLIBC_TUNABLES value to run with, or None where it is not wanted or already set."""
  if environ.get(OPT_OUT, "") == "default" or platform.libc_ver()[0] != "glibc":
    return None
  current = environ.get("GLIBC_TUNABLES", "")
  if TUNABLES in current or not cpu_only(environ):
    return None
  return f"{current}:{TUNABLES}" if current else TUNABLES


def reexec_for_cpu() -> None:
  """Re-executes this command line with `TUNABLES` where they are wanted; else returns."""
  tunables = wanted_tunables(os.environ)
  if tunables is None:
    return
  os.environ["GLIBC_TUNABLES"] = tunables
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(sys.executable, list(sys.orig_argv))


def active() -> bool:
  """Whether this process started with `TUNABLES`."""
  return TUNABLES in os.environ.get("GLIBC_TUNABLES", "")


def restore_malloc_thresholds() -> bool:
  """Undoes the fixed glibc thresholds that tf.data's generator dataset sets.

  Its first iterator calls mallopt(M_TRIM_THRESHOLD, 128 KiB), which also
  fixes the mmap threshold at 128 KiB: from then on every buffer over 128 KiB
  that XLA's CPU runtime allocates is a fresh mmap, page-faulted in and
  unmapped again, each step (the demo's CPU train step ran 15-20% slower).
  Under `TUNABLES` this sets their trim threshold again (mmap stays off);
  otherwise the ceilings that glibc's own adaptive thresholds reach. A no-op
  where libc has no mallopt; returns whether both were set.
  """
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    mallopt = ctypes.CDLL(None).mallopt
  except (AttributeError, OSError):
    return False
  trim = TRIM_THRESHOLD if active() else 64 << 20
  mmap_set = mallopt(_M_MMAP_THRESHOLD, 32 << 20)
  trim_set = mallopt(_M_TRIM_THRESHOLD, trim)
  return bool(mmap_set and trim_set)


@contextlib.contextmanager
def one_arena() -> Iterator[bool]:
  """mallopt(M_ARENA_MAX, 1) inside the block: threads that first allocate
  there use the main heap for good instead of an arena each, whose freed
  memory glibc keeps per thread (data creation's serialising threads: a peak
  25 MiB higher without it). On leaving, threads started later may take
  arenas again, up to glibc's own limit (8 per core), unless the process
  runs with `TUNABLES`. Yields whether it was set (not where libc has no
  mallopt)."""
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    mallopt = ctypes.CDLL(None).mallopt
  except (AttributeError, OSError):
    yield False
    return
  was_set = bool(mallopt(_M_ARENA_MAX, 1))
  try:
    yield was_set
  finally:
    if was_set and not active():
      mallopt(_M_ARENA_MAX, 8 * (os.cpu_count() or 1))
