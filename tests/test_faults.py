"""Faults in real training processes, each followed by the rerun that must lose nothing.

The runs are test_train.py's child processes: a tiny model with dropout on,
synthetic data, two phases of 4 steps, checkpoints every 3 steps (3, 4, 6,
8). After each fault the rerun in the same workdir must end with the
parameters of an uninterrupted run, bit for bit (equal digests).
(A SIGTERM to one of two processes is in test_multihost.py.)
"""

import json
import os

import numpy as np
import pytest

import data_utils
from test_train import TOTAL_STEPS, losses, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run's final parameters and losses."""
  workdir = tmp_path_factory.mktemp("reference")
  result, _ = run(tmp_path_factory, workdir)
  assert result["summary"]["step"] == TOTAL_STEPS
  return {"digest": result["checkpoints"][str(TOTAL_STEPS)]["digest"],
          "losses": losses(workdir)}


def _resumes_to_the_end(tmp_path_factory, workdir, reference, from_step, **payload):
  result, log = run(tmp_path_factory, workdir, **payload)
  assert f"Resumed from the checkpoint at step {from_step} " in log
  assert result["summary"]["step"] == TOTAL_STEPS
  assert result["checkpoints"][str(TOTAL_STEPS)]["digest"] == reference["digest"]
  return result, log


def _unfinished(workdir):
  return sorted(n for n in os.listdir(os.path.join(workdir, "checkpoints"))
                if not n.isdigit())


def test_sigkill_during_an_async_save_resumes_from_the_last_complete_checkpoint(
    tmp_path_factory, reference):
  workdir = str(tmp_path_factory.mktemp("sigkill"))
  # Killed while the checkpoint of step 6 is being written.
  killed, _ = run(tmp_path_factory, workdir, returncode=-9, sigkill_in_save=6)
  assert killed is None
  names = os.listdir(os.path.join(workdir, "checkpoints"))
  assert "6" not in names and _unfinished(workdir), names
  result, _ = _resumes_to_the_end(tmp_path_factory, workdir, reference, from_step=4)
  assert sorted(result["checkpoints"], key=int) == ["3", "4", "6", "8"]


def test_sigterm_off_the_save_interval_saves_that_step_and_resumes_exactly(
    tmp_path_factory, reference):
  workdir = str(tmp_path_factory.mktemp("sigterm"))
  first, _ = run(tmp_path_factory, workdir, sigterm_at=5)  # Exits cleanly (code 0).
  assert first["summary"] == {"preempted_at_step": 5}
  assert sorted(first["checkpoints"], key=int) == ["3", "4", "5"]
  assert (first["checkpoints"]["5"]["phase"], first["checkpoints"]["5"]["data_step"]) == (
      "seq32", 1)

  # A rerun that changes what the run computes is refused, naming the fields.
  refused, _ = run(tmp_path_factory, workdir,
                   config={"seed": 1, "phases.seq16.global_batch_size": 16})
  assert "--config: this run differs" in refused["error"]
  assert "seed: 0 -> 1" in refused["error"]
  assert "phases.seq16.global_batch_size: 8 -> 16" in refused["error"]
  assert refused["sources"] == []
  # Changing how often it logs and saves is safe: logged, and resumed exactly.
  result, log = _resumes_to_the_end(tmp_path_factory, workdir, reference, from_step=5,
                                    config={"logging.every_steps": 2})
  assert "Config change on resume, always allowed: logging.every_steps: 1 -> 2" in log
  assert sorted(result["checkpoints"], key=int) == ["3", "4", "5", "6", "8"]


def test_nonfinite_loss_stops_naming_the_step_and_resumes_from_the_last_good_checkpoint(
    tmp_path_factory, reference):
  workdir = str(tmp_path_factory.mktemp("nonfinite"))
  # Metrics are read only at phase ends and checkpoints, so the NaN of step 6
  # is found when step 6 is about to be saved; a limit of 1 stops there.
  result, _ = run(tmp_path_factory, workdir, nan_at=[6],
                  config={"logging.every_steps": 100, "optimizer.max_nonfinite_in_a_row": 1})
  assert result["summary"] is None
  assert ("NonFiniteError: non-finite loss or gradient at step 6 "
          "(--config.optimizer.max_nonfinite_in_a_row=1)") in result["error"]
  assert sorted(result["checkpoints"], key=int) == ["3", "4"]
  assert all(c["finite"] for c in result["checkpoints"].values())
  _resumes_to_the_end(tmp_path_factory, workdir, reference, from_step=4,
                      config={"optimizer.max_nonfinite_in_a_row": 1})


def test_too_many_nonfinite_steps_stop_the_run_when_the_last_of_them_finishes(
    tmp_path_factory):
  # 40 steps, no log line or checkpoint before the phase ends at step 20: the
  # run stops at step 3's NaN within the steps in flight and prefetched
  # (StepMetrics' max_in_flight, data.prefetch), not at step 20's checkpoint.
  workdir = str(tmp_path_factory.mktemp("stops_at_once"))
  config = {"total_steps": 40, "logging.every_steps": 1000, "checkpoint.every_steps": 1000,
            "optimizer.max_nonfinite_in_a_row": 1}
  result, _ = run(tmp_path_factory, workdir, nan_at=[3], config=config)
  assert ("NonFiniteError: non-finite loss or gradient at step 3 "
          "(--config.optimizer.max_nonfinite_in_a_row=1)") in result["error"]
  assert result["batches_read"]["seq16"] <= 3 + 2 + 4, result["batches_read"]
  assert not result["checkpoints"]


def test_nonfinite_steps_are_skipped_and_counted_until_too_many_in_a_row(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("skipped"))
  # NaN masked-LM weights in the batches of steps 5, 6 and 7 make their losses NaN.
  config = {"optimizer.max_nonfinite_in_a_row": 3}
  result, log = run(tmp_path_factory, workdir, nan_at=[5, 6, 7], config=config)
  assert result["summary"] is None
  assert result["error"] == (
      "NonFiniteError: non-finite loss or gradient in 3 steps in a row, "
      "5-7 (--config.optimizer.max_nonfinite_in_a_row=3); their updates were skipped, so the "
      "parameters are those of step 4. Lower optimizer.learning_rate, check the data, or "
      f"resume from the last checkpoint in {os.path.join(workdir, 'checkpoints')}.")
  assert ("Step 6: non-finite loss or gradient; its update was skipped "
          "(2 in a row, 2 in all; --config.optimizer.max_nonfinite_in_a_row=3") in log
  # The run went on through steps 5 and 6 and saved step 6, whose parameters
  # are those of step 4 bit for bit.
  assert sorted(result["checkpoints"], key=int) == ["3", "4", "6"]
  assert result["checkpoints"]["6"]["digest"] == result["checkpoints"]["4"]["digest"]
  assert all(c["finite"] for c in result["checkpoints"].values())
  assert np.isnan(losses(workdir)[5]) and np.isnan(losses(workdir)[6])
  assert losses(workdir, tag="train/skipped_steps") == {1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 2}
  assert losses(workdir, tag="train/nonfinite_in_a_row") == {1: 0, 2: 0, 3: 0, 4: 0, 5: 1,
                                                             6: 2}

  # The rerun resumes at step 6 with the checkpoint's counts and trains to the end.
  resumed, log = run(tmp_path_factory, workdir, config=config)
  assert "Resumed from the checkpoint at step 6 " in log
  assert resumed["summary"]["step"] == TOTAL_STEPS
  assert (resumed["summary"]["skipped_steps"], resumed["summary"]["nonfinite_in_a_row"]) == (
      2, 0)
  assert losses(workdir, newest_only=True, tag="train/skipped_steps") == {7: 2, 8: 2}
  with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
    assert json.load(f)["skipped_steps"] == 2


def test_file_space_running_out_in_a_save_is_a_clear_error_and_loses_nothing(
    tmp_path_factory, reference):
  workdir = str(tmp_path_factory.mktemp("disk_full"))
  # From the save of step 6 on, no file may grow past 32 KiB: the
  # checkpoint's array files are larger, the run's other files are not.
  result, _ = run(tmp_path_factory, workdir, file_limit_in_save=[6, 32 * 1024])
  assert result["summary"] is None
  error = result["error"]
  assert error.startswith("CheckpointSaveError: the checkpoint of step 6 could not be "
                          f"written in {os.path.join(workdir, 'checkpoints')}"), error
  assert "File too large" in error
  assert "The last complete checkpoint, of step 4, is intact" in error
  assert sorted(result["checkpoints"], key=int) == ["3", "4"]
  _resumes_to_the_end(tmp_path_factory, workdir, reference, from_step=4)


def test_a_preemption_at_a_phase_end_keeps_that_phases_evaluation(
    tmp_path_factory, reference):
  eval_dir = str(tmp_path_factory.mktemp("eval16"))
  examples = data_utils.write_dataset(eval_dir, num_files=2, records_per_file=8,
                                      max_seq_length=16, max_pred=3, vocab_size=128, seed=5)
  config = {"phases.seq16.eval_files": os.path.join(eval_dir, "*.tfrecord"),
            "logging.eval_batches": 0}
  workdir = str(tmp_path_factory.mktemp("phase_end"))
  first, _ = run(tmp_path_factory, workdir, sigterm_at=4, config=config, source_stats=True)
  assert first["summary"] == {"preempted_at_step": 4}
  assert sorted(first["checkpoints"], key=int) == ["3", "4"]
  result, _ = _resumes_to_the_end(tmp_path_factory, workdir, reference, from_step=4,
                                  config=config, source_stats=True)
  # The input's counters: each phase's at its end (its 4 steps' batches and
  # at most 3 read ahead: 2 waiting on the devices, 1 on its way), and their total.
  phases = result["summary"]["phases"]
  assert all(4 <= phases[p]["data"]["batches_read"] <= 4 + 3 for p in ("seq16", "seq32"))
  assert result["summary"]["data"] == {
      "batches_read": sum(phases[p]["data"]["batches_read"] for p in phases)}
  evaluation = result["summary"]["phases"]["seq16"]["eval"]
  assert evaluation["num_examples"] == len(examples)
  targets = np.concatenate([e["masked_lm_ids"][e["masked_lm_weights"] > 0]
                            for e in examples])
  labels = np.concatenate([e["next_sentence_labels"] for e in examples])
  np.testing.assert_allclose(
      [evaluation["mlm_baseline_accuracy"], evaluation["nsp_baseline_accuracy"]],
      [np.bincount(targets).max() / len(targets), np.bincount(labels).max() / len(labels)],
      rtol=1e-6)
