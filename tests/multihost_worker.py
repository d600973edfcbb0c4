"""One process of a multi-process CPU run (driven by test_multihost.py).

usage: multihost_worker.py PROCESS_ID NUM_PROCESSES PORT WORKDIR DATA_DIR STOP_AT

Runs train_and_evaluate on a tiny model over DATA_DIR with the global data
order. With STOP_AT > 0 the run takes a preemption at that step (on every
process at once, as TPU preemption notices do), saving a checkpoint.
Writes this host's files of the default (files) order to WORKDIR/files-<id>.json.
"""

import json
import os
import sys

import jax
from absl import logging

# Outside absl.app.run, absl logging drops INFO lines; the driving test reads
# the run's own INFO lines (e.g. where it resumed) from this process's output.
logging.set_verbosity(logging.INFO)

process_id, num_processes, port = (int(a) for a in sys.argv[1:4])
workdir, data_dir, stop_at = sys.argv[4], sys.argv[5], int(sys.argv[6])
if num_processes > 1:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                             num_processes=num_processes, process_id=process_id)

import ml_collections  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "configs"))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position

from bertjax.input import pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.train import loop  # pylint: disable=g-import-not-at-top,wrong-import-position

config = base.get_config()
config.total_steps = 6
config.model.update(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                    intermediate_size=64, dtype="float32")
phase = config.phases.seq128
phase.update(fraction=1.0, max_seq_length=32, max_predictions_per_seq=5,
             global_batch_size=16, train_files=os.path.join(data_dir, "*.tfrecord"))
config.phases = ml_collections.ConfigDict({"seq32": phase})
config.data.order = "global"
config.optimizer.update(learning_rate=1e-3, warmup_steps=2)
config.mesh.update(data=2, fsdp=2, tensor=2)
config.checkpoint.update(every_steps=100, async_save=True)
config.logging.update(every_steps=1, eval_every_steps=0)

if stop_at:
  ckpt_lib.Checkpointer.reached_preemption = lambda self, step: step == stop_at

files_order = pipeline.TrainSource(
    phase.train_files, 16, max_seq_length=32, max_predictions_per_seq=5, seed=0)
with open(os.path.join(workdir, f"files-{process_id}.json"), "w") as f:
  json.dump(files_order.host_files, f)

summary = loop.train_and_evaluate(config, workdir)
print("SUMMARY", json.dumps(summary))
