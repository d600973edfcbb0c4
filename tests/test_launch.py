"""launch/tpu_vm.sh: valid bash, and the command it sends to every host
passes the config overrides (globs included) through the remote shell intact."""

import ast
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "launch", "tpu_vm.sh")


def test_script_parses():
  result = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr


def _remote_command(tmp_path, *args):
  """Runs the script with a stand-in gcloud; returns the --command it was given."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "gcloud_args"
  gcloud = bin_dir / "gcloud"
  gcloud.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" > {log}\n')
  gcloud.chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TPU_NAME="bert",
             ZONE="us-central2-b", PROJECT="proj")
  result = subprocess.run(["bash", SCRIPT, *args], env=env, capture_output=True,
                          text=True, check=False, timeout=60)
  assert result.returncode == 0, result.stderr
  gcloud_args = log.read_text().split("\0")[:-1]
  assert gcloud_args[:4] == ["compute", "tpus", "tpu-vm", "ssh"]
  assert "--worker=all" in gcloud_args and "--zone=us-central2-b" in gcloud_args
  (command,) = [a[len("--command="):] for a in gcloud_args if a.startswith("--command=")]
  return command


def test_train_sends_the_overrides_intact(tmp_path):
  overrides = ["--config.phases.seq128.train_files=gs://bucket/data/train_128/*.tfrecord",
               "--config.optimizer.learning_rate=5e-5"]
  command = _remote_command(tmp_path, "train", "configs/large.py", "gs://bucket/runs/a b",
                            *overrides)
  prefix = "cd bertjax && .venv/bin/python -m bertjax.main "
  assert command.startswith(prefix)
  assert command.endswith(" 2>&1 | tee -a train.log")
  # What the host's shell makes of the arguments, in a folder where the glob
  # would match a file if it were expanded.
  args = command[len(prefix):-len(" 2>&1 | tee -a train.log")]
  match = tmp_path / "--config.phases.seq128.train_files=gs:" / "bucket" / "data" / "train_128"
  match.mkdir(parents=True)
  (match / "a.tfrecord").touch()
  result = subprocess.run(
      ["bash", "-c", f"python3 -c 'import sys; print(repr(sys.argv[1:]))' {args}"],
      cwd=tmp_path, capture_output=True, text=True, check=True)
  assert ast.literal_eval(result.stdout) == [
      "--config=configs/large.py", "--workdir=gs://bucket/runs/a b", "--distributed=on",
      *overrides]
