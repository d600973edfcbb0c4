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
threshold. The one-arena part pays off for a CPU step with large
temporaries (an L=4/H=256 step: 37.7 sequences/s against 32.5 with glibc's
defaults in `python -m bertjax.benchmarks.malloc_bench`; without the one
arena it gains nothing, its worker threads' arenas still being unmapped)
and costs a small one (the demo's L=2/H=128 step: 305 against 364, its
threads then sharing one arena's lock; `KEEP_FREED`, the tunables without
the one arena, 345). docs/performance.md has the table. So BERTJAX_HOST_MALLOC=auto, the
default, chooses by the model: `TUNABLES` for hidden sizes of
AUTO_MIN_HIDDEN (256) or more, glibc's defaults below.
`tuned` and `default` force either. glibc reads GLIBC_TUNABLES when the
process starts, before any thread has its own arena, so the process
re-executes once with them: `reexec_for_cpu(module)` at start-up, before
the heavy imports, where the setting is `tuned`, and
`reexec_for_model(module, hidden_size)` once the program knows its model
(after reading its config, before its work), where it is `auto`. The
command-line programs `bertjax.main`, `bertjax.finetune` and
`bertjax.benchmarks.step_bench` call them, and they act only where the
process is that program's own command line (`entry_module`: `python -m
bertjax.main ...` or a console script of `CONSOLE_SCRIPTS`); imported or
called from Python (`main.run()` in a script, a notebook or a test) they
never re-execute. The price is that the process keeps its peak heap until
it exits, and under `auto` a large model's run starts its imports twice.

At most once: the re-executed process finds `REEXECUTED` in its environment
and does not execute again, whatever GLIBC_TUNABLES holds by then. It then
puts GLIBC_TUNABLES back as it was before (kept in `TUNABLES_BEFORE`, absent
where it was unset) and takes both variables out, so the processes it starts
(data creation's spawned workers, a benchmark's children) start with the
environment the command was given; its own malloc read the tunables already.

Only where JAX will run on the CPU alone: JAX_PLATFORMS lists only `cpu`, or
is unset and no accelerator plugin (libtpu, a jax_plugins package) is
installed. On a TPU or GPU host the step's buffers live on the device and the
host's threads are the input pipeline's, for which one arena is not measured.
Unset, BERTJAX_HOST_MALLOC is `auto`; any other value than `auto`, `tuned`
or `default` is an error that names the variable. `describe()` says what
this process runs with, for the benchmarks to print.

`one_arena()` is the one-arena part alone, set from inside a running
process for a block: data creation's in-process run starts its serialising
threads inside one.
"""

import contextlib
import functools
import os
import platform
import re
import sys
from typing import Iterator, Mapping, MutableMapping, Optional, Sequence

TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int
# No mmap for large blocks and a 2 GiB trim threshold: freed blocks stay in the
# process for the next step (malloc_bench compares it; no setting picks it alone).
KEEP_FREED = f"glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={TRIM_THRESHOLD}"
# The same and one arena for every thread: what `auto` runs a large model with.
TUNABLES = f"glibc.malloc.arena_max=1:{KEEP_FREED}"
SETTING = "BERTJAX_HOST_MALLOC"  # auto (unset): TUNABLES for large models; tuned: always; default: never
_CHOICES = ("auto", "tuned", "default")
# `auto` re-executes with TUNABLES for models of this hidden size or more.
AUTO_MIN_HIDDEN = 256
# Set in the environment of the re-execution only; the re-executed process
# takes them out again at start-up.
REEXECUTED = "BERTJAX_HOST_MALLOC_REEXECUTED"
TUNABLES_BEFORE = "BERTJAX_GLIBC_TUNABLES_BEFORE"  # absent: GLIBC_TUNABLES was unset
# setup.py's console scripts whose module calls reexec_for_cpu.
CONSOLE_SCRIPTS = {"bertjax-train": "bertjax.main"}

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
# Interpreter options that may come before `-m MODULE` or a script: flags
# without a value; -X, -W and --check-hash-based-pycs with theirs.
_FLAGS = re.compile(r"-[bBdEiIOPqsSuvx]+|-[XW].+")
_VALUE_OPTIONS = ("-X", "-W", "--check-hash-based-pycs")

# Read when this module is first imported, which the command-line programs do
# at start-up, before reexec_for_cpu changes the environment: what this
# process's malloc read, and whether it is the re-executed process.
_STARTED_WITH = os.environ.get("GLIBC_TUNABLES")
_REEXECUTED_HERE = REEXECUTED in os.environ


@functools.cache  # A process's plugins do not change while it runs.
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


def choice(environ: Mapping[str, str]) -> str:
  """BERTJAX_HOST_MALLOC's value (auto where unset); ValueError naming it otherwise."""
  value = environ.get(SETTING, "auto")
  if value not in _CHOICES:
    raise ValueError(f"{SETTING}={value!r}: expected one of {', '.join(_CHOICES)} "
                     "(or unset: auto)")
  return value


def wanted_tunables(environ: Mapping[str, str], hidden_size: Optional[int] = None
                    ) -> Optional[str]:
  """The GLIBC_TUNABLES value to run with, or None where it is not wanted or
  already set. `hidden_size`: the model's, which `auto` chooses by (None:
  not known yet, so only `tuned` wants them)."""
  value = choice(environ)
  if value == "default" or platform.libc_ver()[0] != "glibc":
    return None
  if value == "auto" and (hidden_size is None or hidden_size < AUTO_MIN_HIDDEN):
    return None
  current = environ.get("GLIBC_TUNABLES", "")
  if TUNABLES in current or not cpu_only(environ):
    return None
  return f"{current}:{TUNABLES}" if current else TUNABLES


def _interpreter_options(options: Sequence[str]) -> bool:
  """Whether `options` (between the interpreter and `-m`) are only options
  that take no module or code: not `-m pdb`, `-c CODE`."""
  i = 0
  while i < len(options):
    if options[i] in _VALUE_OPTIONS:
      i += 2
    elif _FLAGS.fullmatch(options[i]):
      i += 1
    else:
      return False
  return i == len(options)


def entry_module(orig_argv: Sequence[str], argv: Sequence[str], main_module) -> Optional[str]:
  """The module whose own command line this process is, or None.

  `python [options] -m MODULE ARGS` gives MODULE where `main_module` (the
  process's __main__) runs it; a console script of `CONSOLE_SCRIPTS`, run
  as `python [options] PATH ARGS` (as its #! line runs it) with
  `main_module` its file, gives its module. `orig_argv` is the
  interpreter's command line (sys.orig_argv) and `argv` sys.argv, whose
  ARGS it must end in. A test run or a notebook kernel gives its own module
  (pytest, ipykernel_launcher); python -c, a script that imports a bertjax
  program and a debugger's `-m pdb -m MODULE` give None.
  """
  args = list(argv[1:])
  if len(orig_argv) <= len(args) + 1 or list(orig_argv[len(orig_argv) - len(args):]) != args:
    return None
  head = list(orig_argv[:len(orig_argv) - len(args)])
  spec = getattr(main_module, "__spec__", None)
  if len(head) >= 3 and head[-2] == "-m":
    if _interpreter_options(head[1:-2]) and spec is not None and spec.name == head[-1]:
      return head[-1]
    return None
  module = CONSOLE_SCRIPTS.get(os.path.basename(head[-1]))
  path = getattr(main_module, "__file__", None)
  if (module is None or spec is not None or not path or not _interpreter_options(head[1:-1])
      or os.path.abspath(path) != os.path.abspath(head[-1])):
    return None
  return module


def reexec_environ(environ: Mapping[str, str], tunables: str) -> dict[str, str]:
  """The environment to re-execute with: `tunables`, and what puts the
  environment from before back in the re-executed process (restore_environ)."""
  env = dict(environ, GLIBC_TUNABLES=tunables, **{REEXECUTED: "1"})
  env.pop(TUNABLES_BEFORE, None)
  if "GLIBC_TUNABLES" in environ:
    env[TUNABLES_BEFORE] = environ["GLIBC_TUNABLES"]
  return env


def restore_environ(environ: MutableMapping[str, str]) -> None:
  """In the re-executed process: GLIBC_TUNABLES as it was before the
  re-execution (unset where it was), without REEXECUTED and TUNABLES_BEFORE.
  Elsewhere (REEXECUTED absent) a no-op."""
  if environ.pop(REEXECUTED, None) is None:
    return
  before = environ.pop(TUNABLES_BEFORE, None)
  if before is None:
    environ.pop("GLIBC_TUNABLES", None)
  else:
    environ["GLIBC_TUNABLES"] = before


def reexec_for_cpu(module: str) -> None:
  """The command-line programs' start-up, before their heavy imports.

  Where this process is `module`'s own command line (entry_module) and the
  tunables are wanted whatever the model (wanted_tunables:
  BERTJAX_HOST_MALLOC=tuned, JAX on the CPU alone, the tunables not yet
  set), it re-executes the process (same id, same command line) with
  `TUNABLES`. In the re-executed process it puts the environment from before
  back for the processes this one starts, and returns; it never executes
  twice. Anywhere else it returns at once.
  """
  if _REEXECUTED_HERE:
    restore_environ(os.environ)
    return
  _reexec_where_wanted(module, None)


def reexec_for_model(module: str, hidden_size: int) -> None:
  """What `auto` chooses, once the program knows its model: as reexec_for_cpu,
  with `TUNABLES` where the model's hidden size is AUTO_MIN_HIDDEN or more.
  Call it after reading the config and before the work (a re-execution
  starts the command again)."""
  if _REEXECUTED_HERE:
    return
  _reexec_where_wanted(module, hidden_size)


def _reexec_where_wanted(module: str, hidden_size: Optional[int]) -> None:
  if entry_module(sys.orig_argv, sys.argv, sys.modules.get("__main__")) != module:
    return
  tunables = wanted_tunables(os.environ, hidden_size)
  if tunables is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, list(sys.orig_argv), reexec_environ(os.environ, tunables))


def describe() -> str:
  """What malloc this process runs with, and why, in a line for a benchmark."""
  setting = os.environ.get(SETTING, "auto")
  if active():
    return f"glibc malloc: bertjax's tunables ({TUNABLES}; {SETTING}={setting})"
  if keeps_freed():
    return (f"glibc malloc: bertjax's tunables without the one arena ({KEEP_FREED}; "
            f"{SETTING}={setting})")
  started = f"GLIBC_TUNABLES={_STARTED_WITH}" if _STARTED_WITH else "glibc's defaults"
  return f"glibc malloc: {started} ({SETTING}={setting})"


def tunables_at_start() -> Optional[str]:
  """GLIBC_TUNABLES as this process started with it (None: unset), whatever
  its environment holds now."""
  return _STARTED_WITH


def active() -> bool:
  """Whether this process started with `TUNABLES`."""
  return TUNABLES in (_STARTED_WITH or "")


def keeps_freed() -> bool:
  """Whether this process started with `KEEP_FREED` (alone or in `TUNABLES`)."""
  return KEEP_FREED in (_STARTED_WITH or "")


def restore_malloc_thresholds() -> bool:
  """Undoes the fixed glibc thresholds that tf.data's generator dataset sets.

  Its first iterator calls mallopt(M_TRIM_THRESHOLD, 128 KiB), which also
  fixes the mmap threshold at 128 KiB: from then on every buffer over 128 KiB
  that XLA's CPU runtime allocates is a fresh mmap, page-faulted in and
  unmapped again, each step (the demo's CPU train step ran 15-20% slower).
  Under `KEEP_FREED` (alone or in `TUNABLES`) this sets their trim threshold
  again (mmap stays off); otherwise the ceilings that glibc's own adaptive
  thresholds reach. A no-op
  where libc has no mallopt; returns whether both were set.
  """
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    mallopt = ctypes.CDLL(None).mallopt
  except (AttributeError, OSError):
    return False
  trim = TRIM_THRESHOLD if keeps_freed() else 64 << 20
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
