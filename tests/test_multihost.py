"""Two processes x 4 CPU devices (jax.distributed, gloo) against one process x 8.

The hosts read disjoint files whose union is the dataset; in the global data
order the 2-process run sees the same global batches as the 1-process run, so
its losses equal the 1-process losses step for step; a checkpoint written by
both processes at a preemption resumes and continues those losses.
"""

import glob
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import data_utils

WORKER = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(num_processes: int, workdir: str, data_dir: str, stop_at: int = 0):
  devices = 8 // num_processes
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO,
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, WORKER, str(i), str(num_processes), str(port), workdir, data_dir,
       str(stop_at)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(num_processes)]
  outputs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=400)
      outputs.append(out)
  finally:
    for p in procs:
      p.kill()
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-4000:]
  return outputs


def _losses(workdir: str) -> dict[int, float]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  losses = {}
  for path in sorted(glob.glob(os.path.join(workdir, "tensorboard", "events.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "train/loss":
          losses[event.step] = value.simple_value
  return losses


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("data"))
  data_utils.write_dataset(d, num_files=4, records_per_file=24, max_seq_length=32,
                           max_pred=5, vocab_size=128, seed=3)
  return d


def test_two_processes_match_one_and_resume(data_dir, tmp_path):
  single = str(tmp_path / "single")
  multi = str(tmp_path / "multi")
  os.makedirs(single)
  os.makedirs(multi)
  _run(1, single, data_dir)
  reference = _losses(single)
  assert sorted(reference) == [1, 2, 3, 4, 5, 6]

  # Preempted at step 3, both processes writing the checkpoint, then resumed.
  first = _run(2, multi, data_dir, stop_at=3)
  assert all('"preempted_at_step": 3' in out for out in first)
  assert sorted(_losses(multi)) == [1, 2, 3]
  second = _run(2, multi, data_dir)
  assert all("Resumed from the checkpoint at step 3" in out for out in second)
  losses = _losses(multi)
  assert sorted(losses) == [1, 2, 3, 4, 5, 6]
  np.testing.assert_allclose([losses[s] for s in range(1, 7)],
                             [reference[s] for s in range(1, 7)], rtol=1e-5)

  # The default order gives each host its own files, and together all of them.
  files = [json.load(open(os.path.join(multi, f"files-{i}.json"))) for i in range(2)]
  assert not set(files[0]) & set(files[1])
  assert sorted(files[0] + files[1]) == sorted(glob.glob(os.path.join(data_dir, "*.tfrecord")))
  single_files = json.load(open(os.path.join(single, "files-0.json")))
  assert sorted(single_files) == sorted(files[0] + files[1])
