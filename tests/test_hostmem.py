"""glibc malloc settings for CPU runs (bertjax/hostmem.py)."""

import json
import os
import platform
import subprocess
import sys

import pytest

from bertjax import hostmem

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc")


@glibc
def test_tunables_are_wanted_only_for_cpu_runs(monkeypatch):
  monkeypatch.setattr(hostmem, "accelerator_installed", lambda: False)
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu"}) == hostmem.TUNABLES
  assert hostmem.wanted_tunables({}) == hostmem.TUNABLES
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "tpu"}) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cuda,cpu"}) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", hostmem.OPT_OUT: "default"}) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu",
                                  "GLIBC_TUNABLES": hostmem.TUNABLES}) is None
  other = "glibc.pthread.rseq=0"
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": other}) == (
      f"{other}:{hostmem.TUNABLES}")
  monkeypatch.setattr(hostmem, "accelerator_installed", lambda: True)
  assert hostmem.wanted_tunables({}) is None
  assert hostmem.wanted_tunables({"JAX_PLATFORMS": "cpu"}) == hostmem.TUNABLES


# Re-executes itself with the tunables, then counts the minor page faults of
# a jitted gradient whose 640 x 30,592 logits (78 MB) are a temporary buffer,
# as the masked-LM decoder's are in a train step.
_PROBE = """
import json, os, resource
pid = os.getpid()
from bertjax import hostmem
hostmem.reexec_for_cpu()
import jax, jax.numpy as jnp
f = jax.jit(jax.grad(lambda h, w: jax.nn.logsumexp(h @ w, -1).sum(), argnums=(0, 1)))
h, w = jnp.ones((640, 256)), jnp.ones((256, 30592))
for _ in range(12):  # until the heap stops growing
  jax.block_until_ready(f(h, w))
counts = []
for _ in range(7):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  jax.block_until_ready(f(h, w))
  counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
faults = sorted(counts)[3]  # the median call
print(json.dumps({"pid": pid, "tunables": os.environ.get("GLIBC_TUNABLES"),
                  "faults": faults}))
"""


def _probe(**env_overrides):
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  env.update(JAX_PLATFORMS="cpu", **env_overrides)
  proc = subprocess.Popen([sys.executable, "-c", _PROBE], env=env, stdout=subprocess.PIPE,
                          text=True)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0
  result = json.loads(out.strip().splitlines()[-1])
  return proc.pid, result


@glibc
def test_a_cpu_process_reexecutes_itself_with_the_tunables_and_stops_page_faulting():
  pid, tuned = _probe()
  assert tuned["pid"] == pid  # the same process, executed again
  assert tuned["tunables"] == hostmem.TUNABLES
  _, default = _probe(**{hostmem.OPT_OUT: "default"})
  assert default["tunables"] is None
  # 78 MB is 19,000 pages of 4 KiB: with glibc's defaults each call maps its
  # temporaries afresh; with the tunables the freed blocks are reused.
  assert default["faults"] > 20_000
  assert tuned["faults"] < 1_000
