"""Cheaper XLA:CPU compiles for the tests' small models.

Most of a small model's CPU compile is code generation: with LLVM's
optimisation off (XLA's backend optimisation level 0) it takes several times
less, and XLA's HLO passes are untouched, so a program's FLOP count and
buffer sizes are those of the default compile. Three ways in:

- `jit(fun)`, a test's own jax.jit compiled with `VALUES` (or `CODEGEN`) on
  the CPU. CODEGEN is the optimisation level alone (and one code module
  instead of several), for tests of FLOPs and memory. VALUES also takes the
  older emitter of fused loops, faster still, and keeps bf16 results rounded
  to bf16 between operations, as running op by op does; the emitter changes a
  few fusions, so XLA's bytes and FLOPs differ slightly from the default's,
  and VALUES serves tests that compare values.
- `in_process(cache)`, for code under test that builds its own jitted steps
  (a whole fine-tuning run): jax_disable_most_optimizations (the same
  optimisation level) and a persistent compilation cache, so a test's later
  runs load the program its first run compiled.
- `child_env(cache)`, the same settings for a child JAX process
  (`python -m bertjax.finetune`); jax_child.py gives its children the level
  through XLA_FLAGS and the same cache.

The tests compare runs made under the same settings with each other, so what
they assert does not change. On a backend other than the CPU, `jit` uses the
backend's defaults.
"""

import contextlib
import os

import jax
from jax.experimental.compilation_cache import compilation_cache

CODEGEN = {"xla_backend_optimization_level": 0, "xla_cpu_parallel_codegen_split_count": 1}
VALUES = {**CODEGEN, "xla_cpu_use_fusion_emitters": False, "xla_allow_excess_precision": False}


def jit(fun, *, which: dict = VALUES, **kwargs):
  """jax.jit(fun, **kwargs), compiled with `which` on the CPU."""
  options = which if jax.default_backend() == "cpu" else None
  return jax.jit(fun, compiler_options=options, **kwargs)


def cache_dir(tmp_path_factory) -> str:
  """A persistent compilation cache shared by the pytest workers of one run."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # The run's directory, above the per-worker ones.
  path = os.path.join(str(base), "xla-cache")
  os.makedirs(path, exist_ok=True)
  return path


def cache_settings(cache: str) -> dict:
  """JAX's settings for a persistent compilation cache in `cache`."""
  return {"jax_compilation_cache_dir": cache,
          "jax_persistent_cache_min_compile_time_secs": 0.2,
          "jax_persistent_cache_min_entry_size_bytes": 0,
          # A size limit makes the cache take a file lock around reads and writes,
          # so that processes running side by side never read a half-written entry.
          "jax_compilation_cache_max_size": 2**30}


def _settings(cache: str) -> dict:
  return {"jax_disable_most_optimizations": True, **cache_settings(cache)}


def as_environment(settings: dict) -> dict[str, str]:
  """JAX settings as the environment variables a JAX process reads at start-up."""
  return {name.upper(): "1" if value is True else str(value) for name, value in settings.items()}


@contextlib.contextmanager
def in_process(cache: str):
  """This process's compiles cheap and cached in `cache`; on exit the settings from
  before come back and the programs compiled meanwhile are dropped from memory, so
  that later tests compile theirs with the default optimisation."""
  settings = _settings(cache)
  before = {name: jax.config.values[name] for name in settings}
  for name, value in settings.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()  # The cache takes its directory when first used.
  try:
    yield
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()
    jax.clear_caches()


def child_env(cache: str) -> dict[str, str]:
  """This process's environment with the settings of `in_process(cache)`, for a child
  JAX process."""
  return dict(os.environ, **as_environment(_settings(cache)))
