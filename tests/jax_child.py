"""Runs a test file's JAX work in a fresh child process and returns its JSON result.

XLA reads its flags (the number of fake CPU devices among them) once, when
JAX starts, so work that needs its own device count runs in a child. Children
also compile with LLVM optimisation off, which makes the CPU compiles of the
tiny test models several times faster, and share a persistent compilation
cache, so a program compiled by one child is loaded, not compiled, by the
next. The child is the test file run as a script: its `__main__` block prints
its result as JSON on the last line of stdout.
"""

import json
import os
import subprocess
import sys
from typing import Any

import cheap_compiles

cache_dir = cheap_compiles.cache_dir  # The compilation cache the pytest workers of one run share.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(devices: int, cache: str) -> dict[str, str]:
  """The environment variables of a child JAX process on `devices` CPU devices."""
  return dict(
      JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
      XLA_FLAGS=(f"--xla_force_host_platform_device_count={devices} "
                 "--xla_backend_optimization_level=0"),
      **cheap_compiles.as_environment(cheap_compiles.cache_settings(cache)))


def run(script: str, payload: Any, *, cache: str, devices: int = 1,
        timeout: int = 400, returncode: int = 0) -> tuple[Any, str]:
  """Runs `python script JSON(payload)`; returns (its JSON result, its stderr).

  The child must end with `returncode` (e.g. -9 for one that kills itself
  with SIGKILL); the result is None when it printed none.
  """
  env = dict(os.environ, **child_env(devices, cache))
  done = subprocess.run([sys.executable, script, json.dumps(payload)], env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)
  assert done.returncode == returncode, f"{script} ended with {done.returncode}:\n" \
      f"{done.stderr[-6000:]}"
  lines = done.stdout.strip().splitlines()
  return (json.loads(lines[-1]) if lines else None), done.stderr
