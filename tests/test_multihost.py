"""Two processes x 4 CPU devices (jax.distributed, gloo) against one process x 8.

The processes are launched as SLURM launches tasks (see multihost_worker.py).
The hosts read disjoint files whose union is the dataset; in the global data
order the 2-process run sees the same global batches as the 1-process run, so
its losses equal the 1-process losses step for step. A real SIGTERM sent to
one of the two processes stops both at the same step, each having saved it,
and the resumed run ends with the parameters of the uninterrupted one, bit
for bit. The two processes then play two slices (mesh.dcn_data=2, fsdp x
tensor inside each) and train to the one-process parameters.
"""

import glob
import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

import data_utils
import jax_child

pytestmark = pytest.mark.slow

WORKER = os.path.join(os.path.dirname(__file__), "multihost_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# SLURM's coordinator port is derived from the job id: 61440 + id % 4096.
_SLURM_PORTS = 61440


def _free_slurm_port() -> int:
  for port in range(_SLURM_PORTS + os.getpid() % 2048, _SLURM_PORTS + 4096):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
      return port
  raise RuntimeError("no free port for the coordinator")


def _run(num_processes: int, workdir: str, data_dir: str, cache: str, sigterm_at: int = 0,
         slices: int = 1):
  """Runs the worker as `num_processes` SLURM tasks; returns their outputs."""
  devices = 8 // num_processes
  port = _free_slurm_port()
  env = dict(os.environ, **jax_child.child_env(devices, cache),
             SLURM_JOB_ID=str(port - _SLURM_PORTS), SLURM_STEP_NODELIST="localhost",
             SLURM_NTASKS=str(num_processes), SLURM_STEP_NUM_NODES="1")
  procs = [subprocess.Popen(
      [sys.executable, WORKER, workdir, data_dir, str(sigterm_at), str(slices)],
      env=dict(env, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(num_processes)]
  outputs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=600)
      outputs.append(out)
  finally:
    for p in procs:
      p.kill()
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-4000:]
  return outputs


def _summary(output: str) -> dict:
  return json.loads(re.search(r"^SUMMARY (.*)$", output, re.M).group(1))


def _digest(output: str) -> tuple[int, str]:
  step, digest = re.search(r"^DIGEST (\d+) (\w+)$", output, re.M).groups()
  return int(step), digest


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
def dataset(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("data"))
  examples = data_utils.write_dataset(d, num_files=4, records_per_file=24,
                                      max_seq_length=32, max_pred=5, vocab_size=128, seed=3)
  return d, examples


def _baselines(examples) -> tuple[float, float]:
  """Accuracies of always predicting the most frequent masked token, and NSP label."""
  targets = np.concatenate([e["masked_lm_ids"][e["masked_lm_weights"] > 0] for e in examples])
  labels = np.concatenate([e["next_sentence_labels"] for e in examples])
  return (np.bincount(targets).max() / len(targets), np.bincount(labels).max() / len(labels))


def test_two_processes_match_one_and_a_sigterm_to_one_stops_both_at_one_step(
    dataset, tmp_path, tmp_path_factory):
  data_dir, examples = dataset
  cache = jax_child.cache_dir(tmp_path_factory)
  single, multi, preempted, two_slices = (
      str(tmp_path / d) for d in ("single", "multi", "preempted", "two_slices"))
  for d in (single, multi, preempted, two_slices):
    os.makedirs(d)
  single_eval = _summary(_run(1, single, data_dir, cache)[0])["phases"]["seq32"]["eval"]
  reference = _losses(single)
  assert sorted(reference) == [1, 2, 3, 4, 5, 6]
  uninterrupted = _run(2, multi, data_dir, cache)
  losses = _losses(multi)
  np.testing.assert_allclose([losses[s] for s in range(1, 7)],
                             [reference[s] for s in range(1, 7)], rtol=1e-5)
  final = {_digest(out) for out in uninterrupted}
  assert len(final) == 1 and next(iter(final))[0] == 6
  # Held-out baselines are those of the whole eval set, on either host.
  mlm, nsp = _baselines(examples)
  for out in uninterrupted:
    multi_eval = _summary(out)["phases"]["seq32"]["eval"]
    assert multi_eval["num_examples"] == single_eval["num_examples"] == len(examples)
    assert multi_eval["mlm_baseline_accuracy"] == single_eval["mlm_baseline_accuracy"]
    assert multi_eval["nsp_baseline_accuracy"] == single_eval["nsp_baseline_accuracy"]
    np.testing.assert_allclose([multi_eval["mlm_baseline_accuracy"],
                                multi_eval["nsp_baseline_accuracy"]], [mlm, nsp], rtol=1e-6)

  # SIGTERM to the second process after step 2: both stop at the step JAX's
  # preemption sync picks, each saving it, and exit cleanly.
  first = _run(2, preempted, data_dir, cache, sigterm_at=2)
  stops = {re.search(r'"preempted_at_step": (\d+)', out).group(1) for out in first}
  assert len(stops) == 1, stops
  stop = int(stops.pop())
  assert 2 <= stop < 6
  assert sorted(os.listdir(os.path.join(preempted, "checkpoints"))) == [str(stop)]
  assert all(_digest(out)[0] == stop for out in first)
  second = _run(2, preempted, data_dir, cache)
  assert all(f"Resumed from the checkpoint at step {stop}" in out for out in second)
  assert {_digest(out) for out in second} == final
  losses = _losses(preempted)
  assert sorted(losses) == [1, 2, 3, 4, 5, 6]

  # The default order gives each host its own files, and together all of them.
  files = [json.load(open(os.path.join(multi, f"files-{i}.json"))) for i in range(2)]
  assert not set(files[0]) & set(files[1])
  assert sorted(files[0] + files[1]) == sorted(glob.glob(os.path.join(data_dir, "*.tfrecord")))
  single_files = json.load(open(os.path.join(single, "files-0.json")))
  assert sorted(single_files) == sorted(files[0] + files[1])

  # Two slices, one per process: the data axis runs across them, process 0's
  # devices holding its first row and process 1's its second, and the run
  # ends with the one-process parameters. Gloo's all-reduce across the
  # processes adds in another order than one process's, so parameters agree
  # to float32 rounding over 6 Adam steps (atol 1e-6 on values of order 0.02
  # to 1), not bit for bit.
  sliced = _run(2, two_slices, data_dir, cache, slices=2)
  assert all(re.search(r"^MESH_DATA_PROCESSES \[\[0\], \[1\]\]$", out, re.M) for out in sliced)
  assert {_digest(out)[0] for out in sliced} == {6}
  losses = _losses(two_slices)
  np.testing.assert_allclose([losses[s] for s in range(1, 7)],
                             [reference[s] for s in range(1, 7)], rtol=1e-5)
  one, two = (np.load(os.path.join(d, "params.npz")) for d in (single, two_slices))
  assert len(one.files) == len(two.files) > 10
  for name in one.files:
    np.testing.assert_allclose(two[name], one[name], rtol=0, atol=1e-6, err_msg=name)
