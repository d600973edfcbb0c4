"""A real fine-tuning process (python -m bertjax.finetune) stopped by SIGTERM or killed by
SIGKILL mid-run, then rerun in the same workdir: it must end as the uninterrupted run
does, with bitwise equal final parameters and the same results.json (final and best dev
metrics; the best's step and score come through the checkpoint's meta).

The run: MRPC-shaped tiny data (64 training pairs), a tiny model with dropout on, batch
8, 10 epochs (80 steps), dev evaluation every 16 steps, checkpoints every 10. Every
process compiles cheaply into one persistent compilation cache (cheap_compiles.py), so
the first compiles the steps and the others load them.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import cheap_compiles
from test_finetune import MODEL, REPO, data  # pylint: disable=unused-import

pytestmark = pytest.mark.slow

NUM_EPOCHS = 10
NUM_STEPS = NUM_EPOCHS * 64 // 8  # test_finetune's 64 training pairs in batches of 8.


class _Run:
  """A fine-tuning process whose log lines a thread collects as they come."""

  def __init__(self, data, workdir, env):
    flags = [f"--config={REPO}/configs/finetune/glue.py", "--config.task=mrpc",
             f"--config.data_dir={data['mrpc']}", f"--config.vocab_file={data['vocab']}",
             "--config.max_seq_length=32", "--config.global_batch_size=8",
             "--config.eval_batch_size=16", f"--config.num_epochs={NUM_EPOCHS}",
             "--config.optimizer.learning_rate=1e-3", "--config.eval_every_steps=16",
             "--config.checkpoint.every_steps=10", "--config.checkpoint.keep=2",
             "--config.logging.every_steps=1", f"--workdir={workdir}"]
    flags += [f"--config.model.{k}={v}" for k, v in MODEL.items()]
    self.lines: list[str] = []
    self.proc = subprocess.Popen([sys.executable, "-m", "bertjax.finetune", *flags], cwd=REPO,
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stderr:
      self.lines.append(line)

  def wait_for(self, condition, timeout=300):
    """Waits until condition() holds while the process runs; fails if it ends first."""
    deadline = time.monotonic() + timeout
    while not condition():
      assert self.proc.poll() is None, "the run ended first:\n" + self.log()[-3000:]
      assert time.monotonic() < deadline, self.log()[-3000:]
      time.sleep(0.005)

  def finish(self, timeout=600) -> int:
    code = self.proc.wait(timeout=timeout)
    self._reader.join(timeout=10)
    return code

  def log(self) -> str:
    return "".join(self.lines)

  def step_logged(self, step: int) -> bool:
    return any(f"step {step}/{NUM_STEPS}" in line for line in self.lines)


def _steps(workdir):
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


def _final(workdir):
  """(final parameters, results.json) of a finished run; the best checkpoint's path
  relative to the workdir."""
  with ocp.StandardCheckpointer() as ckptr:
    params = ckptr.restore(os.path.join(workdir, "checkpoints", str(NUM_STEPS), "params"))
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    results = json.load(f)
  results["best"]["checkpoint"] = os.path.relpath(results["best"]["checkpoint"], workdir)
  return jax.tree.map(np.asarray, params), results


def _same_run(workdir, reference):
  params, results = _final(workdir)
  ref_params, ref_results = reference
  jax.tree.map(np.testing.assert_array_equal, params, ref_params)
  assert results == ref_results


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  return cheap_compiles.child_env(cheap_compiles.cache_dir(tmp_path_factory))


@pytest.fixture(scope="module")
def reference(data, env, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("reference"))
  run = _Run(data, workdir, env)
  assert run.finish() == 0, run.log()[-3000:]
  params, results = _final(workdir)
  best = results["best"]
  assert best["step"] % 16 == 0 or best["step"] == NUM_STEPS
  assert best["checkpoint"] == os.path.join("best", str(best["step"]))
  return params, results


def test_sigterm_saves_the_current_step_exits_0_and_the_rerun_ends_bitwise_equal(
    data, env, reference, tmp_path):
  workdir = str(tmp_path / "run")
  run = _Run(data, workdir, env)
  # After the first dev evaluation (step 16), so the best-so-far must come back too.
  run.wait_for(lambda: run.step_logged(17))
  run.proc.send_signal(signal.SIGTERM)
  assert run.finish() == 0, run.log()[-3000:]
  log = run.log()
  assert "Stopped for preemption at step " in log, log[-3000:]
  stopped = int(log.split("Stopped for preemption at step ")[1].split()[0])
  assert 17 <= stopped < NUM_STEPS
  assert _steps(workdir)[-1] == stopped  # Saved at the step it stopped at...
  assert not os.path.exists(os.path.join(workdir, "results.json"))  # ...and not finished.

  rerun = _Run(data, workdir, env)
  assert rerun.finish() == 0, rerun.log()[-3000:]
  assert f"Resumed fine-tuning from step {stopped}." in rerun.log()
  _same_run(workdir, reference)


def test_sigkill_mid_run_resumes_from_the_last_periodic_checkpoint(data, env, reference,
                                                                  tmp_path):
  workdir = str(tmp_path / "run")
  run = _Run(data, workdir, env)
  checkpoints = os.path.join(workdir, "checkpoints")
  run.wait_for(lambda: os.path.isdir(checkpoints) and any(
      n.isdigit() and int(n) >= 20 for n in os.listdir(checkpoints)))
  run.proc.send_signal(signal.SIGKILL)
  assert run.finish() == -signal.SIGKILL
  saved = _steps(workdir)[-1]
  assert saved % 10 == 0 and saved < NUM_STEPS

  rerun = _Run(data, workdir, env)
  assert rerun.finish() == 0, rerun.log()[-3000:]
  assert f"Resumed fine-tuning from step {saved}." in rerun.log()
  _same_run(workdir, reference)
