"""Pretrains BERT: python -m bertjax.main --config=configs/base.py --workdir=DIR.

With the demo config (configs/tiny.py, the default) it also builds the demo
data first and runs the demo's downstream fine-tuning step afterwards.

Any config field can be overridden, e.g. --config.total_steps=1000 or
--config.phases.seq128.global_batch_size=512.
"""

# glibc reads its malloc tunables at start-up: on the CPU, `python -m` re-executes
# with them before the imports below (bertjax/hostmem.py).
if __name__ == "__main__":
  from bertjax import hostmem  # pylint: disable=g-import-not-at-top
  hostmem.reexec_for_cpu()

import os

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from bertjax import downstream
from bertjax import hostmem
from bertjax.convert.weights import load_weights
from bertjax.create import demo
from bertjax.train import loop
from bertjax.train import profiling
from bertjax.train import usage

_DEMO_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "configs", "tiny.py")
_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEMO_CONFIG, "Run config file (configs/base.py, configs/large.py, ...).",
    lock_config=True)
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "on", "off"],
    "Call jax.distributed.initialize(): auto does so when a multi-host environment "
    "(TPU pod slice, JAX_COORDINATOR_ADDRESS, SLURM) is detected.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/bertjax_demo",
                               "Checkpoints, TensorBoard events and the summary go here "
                               "(local path or gs://).")


def _multihost_env() -> bool:
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return ("," in hosts or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
          or int(os.environ.get("SLURM_NTASKS", "1")) > 1)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _DISTRIBUTED.value == "on" or (_DISTRIBUTED.value == "auto" and _multihost_env()):
    jax.distributed.initialize()
  logging.info("JAX process %d of %d, %d devices (%s).", jax.process_index(),
               jax.process_count(), jax.device_count(), jax.devices()[0].device_kind)
  config = _CONFIG.value
  if config.compile_cache_dir:  # Before the first compile of the process.
    profiling.enable_compilation_cache(profiling.cache_dir(config.compile_cache_dir,
                                                           _WORKDIR.value))
  demo.prepare_config(config, _WORKDIR.value)  # Builds the demo data if the config asks.
  summary = loop.train_and_evaluate(config, _WORKDIR.value, weights_loader=load_weights)
  if config.data.demo_dir and "preempted_at_step" not in summary:
    # The demo's downstream step: fine-tunes from the pretrained checkpoint and from
    # random initialisation; both dev scores go into WORKDIR/summary.json.
    downstream.demo_downstream(_WORKDIR.value)


def run():
  hostmem.reexec_for_cpu()  # The `bertjax-train` entry point comes in here.
  usage.run(main)


if __name__ == "__main__":
  run()
