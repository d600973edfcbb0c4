"""One process of a multi-process CPU run (driven by test_multihost.py).

usage: multihost_worker.py WORKDIR DATA_DIR SIGTERM_AT [SLICES]

Launched as SLURM launches tasks: SLURM_* variables give the process count,
this process's id and the coordinator (jax.distributed.initialize() finds
them itself), and CPU collectives go through gloo. Runs train_and_evaluate
on a tiny model over DATA_DIR with the global data order. With SIGTERM_AT > 0
the last process sends itself a real SIGTERM once step SIGTERM_AT is logged,
as a platform's preemption notice reaches one host, and every process then
waits a second after each logged step, as slower steps would. With SLICES=2
the processes play two slices (each process one, as CPU devices name no
slice): the mesh is data=2 across them (mesh.dcn_data) and fsdp=2 x tensor=2
inside each, the same sizes as the one-slice data=2 x fsdp=2 x tensor=2.
Prints the summary, the processes that hold each row of the mesh's data axis,
and a digest of the parameters of the last checkpoint (equal digests:
bitwise equal parameters); writes those parameters to WORKDIR/params.npz
(first process) and this host's files of the default (files) order to
WORKDIR/files-<id>.json.
"""

import hashlib
import json
import os
import signal
import sys
import time

import jax
from absl import logging

# Outside absl.app.run, absl logging drops INFO lines; the driving test reads
# the run's own INFO lines (e.g. where it resumed) from this process's output.
logging.set_verbosity(logging.INFO)

workdir, data_dir, sigterm_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
slices = int(sys.argv[4]) if len(sys.argv) > 4 else 1
if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize()

import ml_collections  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "configs"))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position

from bertjax.input import pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.train import loop  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

config = base.get_config()
config.total_steps = 6
config.model.update(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                    intermediate_size=64, dtype="float32")
phase = config.phases.seq128
phase.update(fraction=1.0, max_seq_length=32, max_predictions_per_seq=5,
             global_batch_size=16, train_files=os.path.join(data_dir, "*.tfrecord"),
             eval_files=os.path.join(data_dir, "*.tfrecord"))
config.phases = ml_collections.ConfigDict({"seq32": phase})
config.data.order = "global"
config.optimizer.update(learning_rate=1e-3, warmup_steps=2)
config.mesh.update(data=2, fsdp=2, tensor=2)
if slices > 1:
  config.mesh.update(data=1, dcn_data=slices)
config.checkpoint.update(every_steps=100, async_save=True)
config.logging.update(every_steps=1, eval_every_steps=0, eval_batches=0)

if sigterm_at:
  log_train = loop.MetricLogger.log_train

  def log_then_signal(self, step, *args, **kwargs):
    out = log_train(self, step, *args, **kwargs)
    if step == sigterm_at and jax.process_index() == jax.process_count() - 1:
      os.kill(os.getpid(), signal.SIGTERM)
    if step >= sigterm_at:
      # Steps of a few milliseconds could all finish before the notice has
      # gone through the coordination service; a pod's steps take longer.
      time.sleep(1.0)
    return out
  loop.MetricLogger.log_train = log_then_signal

files_order = pipeline.TrainSource(
    phase.train_files, 16, max_seq_length=32, max_predictions_per_seq=5, seed=0)
with open(os.path.join(workdir, f"files-{jax.process_index()}.json"), "w") as f:
  json.dump(files_order.host_files, f)

summary = loop.train_and_evaluate(config, workdir)
print("SUMMARY", json.dumps(summary))

# The last checkpoint's parameters, gathered from every host's shards.
run, model, tx, _ = loop._setup(config)  # pylint: disable=protected-access
abstract, shardings = state_lib.abstract_train_state(model, tx, run.mesh,
                                                     sharding_lib.rules(config.mesh))
checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=5,
                                     async_save=False)
print("MESH_DATA_PROCESSES", json.dumps(
    [sorted({d.process_index for d in row.ravel()}) for row in run.mesh.devices]))
state, meta = checkpointer.restore(abstract, shardings)
checkpointer.close()
leaves = [np.asarray(x) for x in jax.tree.leaves(multihost_utils.process_allgather(
    state.params, tiled=True))]
if jax.process_index() == 0:
  np.savez(os.path.join(workdir, "params.npz"), *leaves)
print("DIGEST", meta["step"], hashlib.sha256(b"".join(x.tobytes() for x in leaves)).hexdigest())
