"""launch/tpu_vm.sh against a stand-in gcloud that plays a two-host slice, or two of them.

The remote commands the launcher builds run for real, once per host (see
tests/fake_gcloud.py): the detached training command, the multi-host checks,
the status probe, and the preemption -> re-create -> resume path of `watch`.
"""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "launch", "tpu_vm.sh")
FAKE = os.path.join(REPO, "tests", "fake_gcloud.py")
sys.path.insert(0, os.path.join(REPO, "tests"))


def test_script_parses():
  result = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr


class Slice:
  """A world for fake_gcloud and a way to run the launcher against it."""

  def __init__(self, tmp_path, **world):
    self.dir = tmp_path / "world"
    (self.dir / "hosts").mkdir(parents=True)
    (self.dir / "train_starts").write_text("")
    self.world = {"hosts": ["host0", "host1"], "slice_states": ["READY"],
                  "commits": {"host0": "abc123", "host1": "abc123"},
                  "rounds": [{"exit": 0, "summary": True}], **world}
    (self.dir / "world.json").write_text(json.dumps(self.world))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f'#!/usr/bin/env bash\nexec {sys.executable} {FAKE} "$@"\n')
    gcloud.chmod(0o755)
    self.env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TPU_NAME="bert",
                    ZONE="us-central2-b", PROJECT="proj", ACCELERATOR="v4-16",
                    REPO_URL="https://example.com/bertjax.git", WATCH_INTERVAL="0",
                    FAKE_GCLOUD_WORLD=str(self.dir))
    self.env.pop("LOG_LINES", None)
    os.environ["FAKE_GCLOUD_WORLD"] = str(self.dir)
    import fake_gcloud  # pylint: disable=g-import-not-at-top
    fake_gcloud.WORLD = str(self.dir)
    for hosts in self.world.get("nodes", {"": self.world["hosts"]}).values():
      for host in hosts:
        fake_gcloud.install_host(host)

  def run(self, *args, **env):
    return subprocess.run(["bash", SCRIPT, *args], env=dict(self.env, **env),
                          capture_output=True, text=True, check=False, timeout=120)

  def calls(self):
    lines = (self.dir / "calls.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]

  def main_calls(self, host):
    path = self.dir / "hosts" / host / "main_calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]

  def host_file(self, host, name):
    return (self.dir / "hosts" / host / "bertjax_run" / name).read_text()


def test_train_runs_detached_with_the_arguments_intact(tmp_path):
  s = Slice(tmp_path)
  overrides = ["--config.phases.seq128.train_files=gs://bucket/data/train_128/*.tfrecord",
               "--config.optimizer.learning_rate=5e-5", "--config.seed=$HOME"]
  result = s.run("train", "configs/large.py", str(tmp_path / "runs" / "a b"), *overrides)
  assert result.returncode == 0, result.stderr
  for host in ("host0", "host1"):
    assert s.main_calls(host) == [[
        "-m", "bertjax.main", "--config=configs/large.py",
        f"--workdir={tmp_path / 'runs' / 'a b'}", "--distributed=on", *overrides]]
    assert s.host_file(host, "exit_code").strip() == "0"
    assert f"training output of {host}" in s.host_file(host, "train.log")
  ssh = [c for c in s.calls() if c[3] == "ssh"]
  assert all("--worker=all" in c and "--zone=us-central2-b" in c for c in ssh)
  assert any("tmux new-session -d -s bertjax" in c[-3] for c in ssh)


def test_train_refuses_to_start_twice(tmp_path):
  s = Slice(tmp_path)
  (s.dir / "hosts" / "host1" / "tmux_running").touch()
  result = s.run("train", "configs/large.py", str(tmp_path / "run"))
  assert result.returncode != 0
  assert "training is already running" in result.stderr


@pytest.mark.parametrize("world, message", [
    ({"commits": {"host0": "abc123", "host1": "def456"}}, "hosts run different commits"),
    ({"answering": ["host0"]}, "1 of 2 hosts answered"),
    ({"unreachable_bucket": ["host1"]}, "cannot reach gs://bucket"),
])
def test_check_names_what_differs_between_hosts(tmp_path, world, message):
  s = Slice(tmp_path, **world)
  result = s.run("check", "configs/large.py", "gs://bucket/runs/large")
  assert result.returncode != 0
  assert message in result.stderr, result.stderr
  result = s.run("train", "configs/large.py", "gs://bucket/runs/large")
  assert result.returncode != 0
  assert not (s.dir / "hosts" / "host0" / "main_calls.jsonl").exists()


def test_check_passes_and_pins_the_commit(tmp_path):
  s = Slice(tmp_path)
  result = s.run("check", "configs/large.py", "gs://bucket/runs/large")
  assert result.returncode == 0, result.stderr
  assert "2 hosts, commit=abc123" in result.stderr
  result = s.run("check", "configs/large.py", "gs://bucket/runs/large", COMMIT="fff")
  assert result.returncode != 0 and "not COMMIT=fff" in result.stderr


def test_check_names_a_config_file_missing_on_the_hosts(tmp_path):
  s = Slice(tmp_path)
  result = s.run("check", "configs/nonexistent.py", str(tmp_path / "run"))
  assert result.returncode != 0
  assert "configs/nonexistent.py differs between hosts or is missing" in result.stderr


def test_watch_recreates_a_preempted_spot_slice_and_resumes(tmp_path):
  # Round 1 stops for a preemption notice (exit 0, no summary); the slice is
  # then preempted; round 2 runs on the re-created slice and finishes.
  s = Slice(tmp_path, slice_states=["READY", "PREEMPTED"],
            rounds=[{"exit": 0, "summary": False}, {"exit": 0, "summary": True}])
  workdir = str(tmp_path / "run")
  result = s.run("watch", "configs/large.py", workdir, "--config.total_steps=10", SPOT="1")
  assert result.returncode == 0, result.stderr
  assert "slice bert is PREEMPTED: re-creating it" in result.stderr
  assert f"training finished: {workdir}/summary.json" in result.stderr
  verbs = [(c[2], c[3]) for c in s.calls() if c[0] == "compute"]
  delete = verbs.index(("queued-resources", "delete"))
  create = verbs.index(("queued-resources", "create"))
  assert delete < create
  create_call = [c for c in s.calls() if c[2:4] == ["queued-resources", "create"]][0]
  assert "--spot" in create_call and "--node-id=bert" in create_call
  assert "--accelerator-type=v4-16" in create_call
  starts = [i for i, c in enumerate(s.calls())
            if c[3] == "ssh" and "tmux new-session" in c[-3]]
  setups = [i for i, c in enumerate(s.calls()) if c[3] == "ssh" and "git clone" in c[-3]]
  assert len(starts) == 2 and len(setups) == 1 and starts[0] < setups[0] < starts[1]
  # The re-created hosts got the same command, which resumes from the workdir.
  for host in ("host0", "host1"):
    assert s.main_calls(host) == [[
        "-m", "bertjax.main", "--config=configs/large.py", f"--workdir={workdir}",
        "--distributed=on", "--config.total_steps=10"]]


def test_watch_restarts_after_a_preemption_notice_on_a_live_slice(tmp_path):
  s = Slice(tmp_path, rounds=[{"exit": 0, "summary": False}, {"exit": 0, "summary": True}])
  result = s.run("watch", "configs/large.py", str(tmp_path / "run"))
  assert result.returncode == 0, result.stderr
  assert (s.dir / "train_starts").read_text() == "xx"
  assert not any(c[3] == "delete" for c in s.calls() if c[0] == "compute")


def test_watch_stops_when_training_fails(tmp_path):
  s = Slice(tmp_path, rounds=[{"exit": 1, "summary": False}])
  result = s.run("watch", "configs/large.py", str(tmp_path / "run"))
  assert result.returncode != 0
  assert "training failed on a host" in result.stderr
  assert "host0 exited 1" in result.stderr


def test_status_stop_and_logs(tmp_path):
  s = Slice(tmp_path, rounds=[{"exit": 3, "summary": False}])
  assert s.run("train", "configs/large.py", str(tmp_path / "run")).returncode == 0
  (s.dir / "hosts" / "host1" / "bertjax_run" / "exit_code").unlink()
  (s.dir / "hosts" / "host1" / "tmux_running").touch()
  result = s.run("status")
  assert result.returncode == 0, result.stderr
  assert "slice bert: READY" in result.stdout
  assert "bertjax-status host0 exited 3" in result.stdout
  assert "bertjax-status host1 running" in result.stdout
  assert s.run("stop").returncode == 0
  for host in ("host0", "host1"):
    assert (s.dir / "hosts" / host / "pkill_calls").read_text() == "-TERM -f bertjax.main\n"
  assert s.run("logs", WORKER="1").returncode == 0
  (logs,) = [c for c in s.calls() if c[3] == "ssh" and "--worker=1" in c]
  assert "tail -n 100 -F ~/bertjax_run/train.log" in logs[-3]


def test_create_waits_for_the_queued_resource(tmp_path):
  s = Slice(tmp_path)
  result = s.run("create", QUEUED="1")
  assert result.returncode == 0, result.stderr
  (create,) = [c for c in s.calls() if c[2:4] == ["queued-resources", "create"]]
  assert "--spot" not in create
  s.world["qr_state_after_create"] = "FAILED"
  (s.dir / "world.json").write_text(json.dumps(s.world))
  result = s.run("create", SPOT="1")
  assert result.returncode != 0 and "queued resource bert-qr is FAILED" in result.stderr


def test_logs_are_copied_into_a_gs_workdir(tmp_path):
  s = Slice(tmp_path, rounds=[{"exit": 0, "summary": False}])
  result = s.run("train", "configs/large.py", "gs://bucket/runs/x")
  assert result.returncode == 0, result.stderr
  copies = {c[-1] for c in s.calls() if c[:2] == ["storage", "cp"]}
  assert copies == {"gs://bucket/runs/x/logs/host0.log", "gs://bucket/runs/x/logs/host1.log"}


def _two_slices(tmp_path, **world):
  """Two slices of two hosts each, as one queued resource with --node-count=2 books them."""
  nodes = {"bert-0": ["host0", "host1"], "bert-1": ["host2", "host3"]}
  # tpu-env as the TPU runtime writes it on the nodes of a two-slice job.
  tpu_env = {h: f"MEGASCALE_SLICE_ID: '{i}'\nMEGASCALE_NUM_SLICES: '2'"
             for i, hosts in enumerate(nodes.values()) for h in hosts}
  world = {"nodes": nodes, "slice_states": {n: ["READY"] for n in nodes},
           "commits": {h: "abc123" for hosts in nodes.values() for h in hosts},
           "tpu_env": tpu_env, **world}
  return Slice(tmp_path, **world)


@pytest.mark.slow
def test_watch_books_two_slices_runs_every_host_and_recreates_them_after_a_preemption(
    tmp_path):
  s = _two_slices(tmp_path, slice_states={"bert-0": ["READY"], "bert-1": ["READY", "PREEMPTED"]},
                  rounds=[{"exit": 0, "summary": False}, {"exit": 0, "summary": True}])
  workdir = str(tmp_path / "run")
  result = s.run("watch", "configs/large.py", workdir, NUM_SLICES="2", SPOT="1")
  assert result.returncode == 0, result.stderr
  assert "check: 2 slices joined (slice/slices: megascale=0/2 megascale=1/2 )" in result.stderr
  assert "check: 4 hosts, commit=abc123" in result.stderr
  # Preempting one slice re-creates the whole queued resource: the job needs both.
  assert "slice bert is PREEMPTED (bert-1): re-creating it" in result.stderr
  (create,) = [c for c in s.calls() if c[2:4] == ["queued-resources", "create"]]
  assert "--node-count=2" in create and "--node-prefix=bert" in create
  assert "--spot" in create and not any(a.startswith("--node-id") for a in create)
  verbs = [c[2:4] for c in s.calls() if c[0] == "compute"]
  assert verbs.index(["queued-resources", "delete"]) < verbs.index(["queued-resources", "create"])
  # Both slices were set up again, and every host of both, fresh, got the same
  # command, which resumes from the workdir.
  setups = {c[4] for c in s.calls() if c[3] == "ssh" and "git clone" in c[-3]}
  assert setups == {"bert-0", "bert-1"}
  assert (s.dir / "train_starts").read_text() == "xx" * 2  # One start per slice, twice.
  for host in ("host0", "host1", "host2", "host3"):
    assert s.main_calls(host) == [["-m", "bertjax.main", "--config=configs/large.py",
                                   f"--workdir={workdir}", "--distributed=on"]]
  assert s.run("status", NUM_SLICES="2").stdout.count("bertjax-status host") == 4


@pytest.mark.slow
@pytest.mark.parametrize("world, message", [
    ({"tpu_env": {"host0": "MEGASCALE_SLICE_ID: '0'\nMEGASCALE_NUM_SLICES: '2'",
                  "host1": "MEGASCALE_SLICE_ID: '0'\nMEGASCALE_NUM_SLICES: '2'",
                  "host2": "MEGASCALE_SLICE_ID: '0'\nMEGASCALE_NUM_SLICES: '2'",
                  "host3": "MEGASCALE_SLICE_ID: '0'\nMEGASCALE_NUM_SLICES: '2'"}},
     "MEGASCALE_SLICE_IDs are not 0 ... 1"),
    ({"tpu_env": {"host0": "MEGASCALE_SLICE_ID: '0'\nMEGASCALE_NUM_SLICES: '2'"}},
     "do not all name NUM_SLICES=2 slices"),
    ({"answering": ["host0", "host1", "host2"]}, "3 of 4 hosts answered"),
])
def test_check_refuses_slices_that_are_not_joined(tmp_path, world, message):
  s = _two_slices(tmp_path, **world)
  result = s.run("train", "configs/large.py", str(tmp_path / "run"), NUM_SLICES="2")
  assert result.returncode != 0
  assert message in result.stderr, result.stderr
  assert not (s.dir / "hosts" / "host0" / "main_calls.jsonl").exists()


def test_num_slices_must_be_a_positive_number(tmp_path):
  result = Slice(tmp_path).run("status", NUM_SLICES="two")
  assert result.returncode != 0
  assert "NUM_SLICES=two: give a positive number of slices" in result.stderr
