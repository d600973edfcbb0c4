"""--distributed: whether a command line joins a JAX job of several processes.

`python -m bertjax.main` and `python -m bertjax.finetune` take
--distributed=auto|on|off and pass it to `initialize`; `auto` calls
jax.distributed.initialize() where the environment names such a job
(`multiprocess_env`), which then finds the coordinator and this process's
place from the same environment or the TPU VM's metadata.
"""

import os
from typing import Mapping

import jax
from absl import logging

MODES = ("auto", "on", "off")
HELP = ("Call jax.distributed.initialize(): auto does so where the environment names a "
        "job of several processes (a TPU slice of several hosts, several TPU slices, "
        "JAX_COORDINATOR_ADDRESS, SLURM with several tasks).")


def _count(environ: Mapping[str, str], name: str) -> int:
  value = environ.get(name, "").strip()
  if not value:
    return 1
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"{name}={value!r} in the environment is not a whole number, which "
                     "--distributed=auto reads; fix it, or pass --distributed=on or off"
                     ) from None


def multiprocess_env(environ: Mapping[str, str]) -> bool:
  """Whether `environ` is that of one process of a JAX job of several.

  * a TPU slice of several hosts: a comma in TPU_PROCESS_ADDRESSES or
    TPU_WORKER_HOSTNAMES (the hosts of this slice, as GKE sets them);
  * several TPU slices, also of one host each: MEGASCALE_NUM_SLICES above 1
    or MEGASCALE_COORDINATOR_ADDRESS set (as GKE's multi-slice JobSets set
    them);
  * JAX_COORDINATOR_ADDRESS set;
  * SLURM_NTASKS above 1.

  One host of one slice (one worker, MEGASCALE_NUM_SLICES unset or 1 and no
  MEGASCALE_COORDINATOR_ADDRESS), as a machine without any of these, is one
  process.
  """
  hosts = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES", "")
  return ("," in hosts
          or _count(environ, "MEGASCALE_NUM_SLICES") > 1
          or bool(environ.get("MEGASCALE_COORDINATOR_ADDRESS", "").strip())
          or bool(environ.get("JAX_COORDINATOR_ADDRESS", "").strip())
          or _count(environ, "SLURM_NTASKS") > 1)


def initialize(mode: str, environ: Mapping[str, str] = os.environ) -> bool:
  """Calls jax.distributed.initialize() for --distributed=`mode` (MODES),
  logs this process's place among the processes and devices, and returns
  whether it initialized."""
  if mode not in MODES:
    raise ValueError(f"--distributed={mode}: expected one of {', '.join(MODES)}")
  joined = mode == "on" or (mode == "auto" and multiprocess_env(environ))
  if joined:
    jax.distributed.initialize()
  logging.info("JAX process %d of %d, %d devices (%s).", jax.process_index(),
               jax.process_count(), jax.device_count(), jax.devices()[0].device_kind)
  return joined
