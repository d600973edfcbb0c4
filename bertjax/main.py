"""Pretrains BERT: python -m bertjax.main --config=configs/base.py --workdir=DIR.

With the demo config (configs/tiny.py, the default) it also builds the demo
data first and runs the demo's downstream fine-tuning step afterwards.

Any config field can be overridden, e.g. --config.total_steps=1000 or
--config.phases.seq128.global_batch_size=512.
"""

# glibc reads its malloc tunables at start-up: on the CPU, this program's own
# command line re-executes itself once with them, before the imports below
# with BERTJAX_HOST_MALLOC=tuned, or once the model is known for a large one
# (auto, the default; bertjax/records/hostmem.py); imported from Python it
# does not.
from bertjax.records import hostmem  # pylint: disable=g-bad-import-order
hostmem.reexec_for_cpu("bertjax.main")

import os

from absl import app
from absl import flags
from ml_collections import config_flags

from bertjax import downstream
from bertjax.convert.weights import load_weights
from bertjax.create import demo
from bertjax.train import cli
from bertjax.train import distributed
from bertjax.train import loop
from bertjax.train import profiling

_DEMO_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "configs", "tiny.py")
_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEMO_CONFIG, "Run config file (configs/base.py, configs/large.py, ...).",
    lock_config=True)
_DISTRIBUTED = flags.DEFINE_enum("distributed", "auto", distributed.MODES, distributed.HELP)
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/bertjax_demo",
                               "Checkpoints, TensorBoard events and the summary go here "
                               "(local path or gs://).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  hostmem.reexec_for_model("bertjax.main", config.model.hidden_size)  # Before anything starts.
  distributed.initialize(_DISTRIBUTED.value)
  if config.compile_cache_dir:  # Before the first compile of the process.
    profiling.enable_compilation_cache(profiling.cache_dir(config.compile_cache_dir,
                                                           _WORKDIR.value))
  demo.prepare_config(config, _WORKDIR.value)  # Builds the demo data if the config asks.
  summary = loop.train_and_evaluate(config, _WORKDIR.value, weights_loader=load_weights)
  if config.data.demo_dir and "preempted_at_step" not in summary:
    # The demo's downstream step: fine-tunes from the pretrained checkpoint and from
    # random initialisation on the demo data this run read; the dev scores go
    # into WORKDIR/summary.json.
    downstream.demo_downstream(_WORKDIR.value, demo_dir=config.data.demo_dir)


def run():
  cli.run(main)


if __name__ == "__main__":
  run()
