"""A user's mistake on a command line is one line naming the flag, with a non-zero
exit status and no traceback; a bug keeps its traceback. Commands print their
own lines, not orbax's routine chatter, and a real failure still shows."""

import logging
import os
import shutil
import subprocess
import sys

import pytest
from absl import app
from absl import logging as absl_logging

from bertjax.train import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(module, *flags):
  return subprocess.run([sys.executable, "-m", module, *flags], cwd=REPO,
                        capture_output=True, text=True, timeout=300, check=False,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO))


@pytest.mark.parametrize("module,flags,named", [
    ("bertjax.finetune", ["--config=configs/finetune/glue.py", "--config.task=nosuch",
                          "--workdir=WORKDIR"], "--config.task='nosuch'"),
    ("bertjax.finetune", ["--config=configs/finetune/glue.py"], "--workdir"),
    ("bertjax.finetune", ["--config=configs/finetune/glue.py", "--config.model.nosuch=3",
                          "--workdir=WORKDIR"], "--config.model.nosuch"),
    ("bertjax.finetune", ["--config=configs/finetune/glue.py", "--config.mode=predict",
                          "--workdir=WORKDIR"], "--config.predict_from="),
    ("bertjax.main", ["--config=configs/tiny.py", "--config.nosuch=3", "--workdir=WORKDIR"],
     "--config.nosuch"),
    ("bertjax.convert.export", ["--checkpoint=WORKDIR/checkpoints", "--output=WORKDIR/out"],
     "--do_lower_case"),
    ("bertjax.create_data", ["--output_dir=WORKDIR/out"], "--vocab_file"),
    ("bertjax.fit", ["--config=configs/large.py", "--phase=seq1024"], "--phase=seq1024"),
    ("bertjax.fit", ["--config=configs/large.py", "--num_slices=2"], "--num_slices=2"),
    ("bertjax.fit", ["--config=configs/finetune/squad.py", "--find_max_batch"],
     "--find_max_batch"),
])
def test_a_bad_flag_is_one_line_naming_it(module, flags, named, tmp_path):
  result = _run(module, *(f.replace("WORKDIR", str(tmp_path)) for f in flags))
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert named in result.stderr, result.stderr[-3000:]


def test_user_errors_print_one_line_and_bugs_keep_their_traceback(capsys):
  def bad_flag(argv):
    raise ValueError("--config.seed: must be >= 0")

  def bug(argv):
    raise ValueError("operands could not be broadcast together")

  with pytest.raises(SystemExit) as e:
    cli.one_line_errors(bad_flag)([])
  assert e.value.code == 1
  assert capsys.readouterr().err == "Error: --config.seed: must be >= 0\n"
  with pytest.raises(SystemExit):
    cli.one_line_errors(lambda argv: (_ for _ in ()).throw(app.UsageError("--x: bad")))([])
  assert capsys.readouterr().err == "Error: --x: bad\n"
  with pytest.raises(ValueError, match="broadcast"):
    cli.one_line_errors(bug)([])
  assert cli.is_user_error(ValueError(f"{REPO}/README.md:3: bad row"))
  assert not cli.is_user_error(TypeError("--config.seed"))


ORBAX_NOISE = ("Given directory is read only", "CheckpointManager created",
               "Restoring checkpoint from")


@pytest.mark.slow
def test_commands_reading_a_checkpoint_print_no_orbax_noise_but_real_errors(tmp_path):
  from test_export_hf import make_run  # pylint: disable=g-import-not-at-top
  run = make_run(tmp_path, True)
  runs = {"predict": _run("bertjax.fill_mask", f"--checkpoint={run['checkpoints']}",
                          "--text=the quick [MASK] fox", "--top_k=2"),
          "export": _run("bertjax.convert.export", f"--checkpoint={run['checkpoints']}",
                         f"--output={tmp_path / 'hf'}")}
  for name, result in runs.items():
    assert result.returncode == 0, (name, result.stderr[-3000:])
    for noise in ORBAX_NOISE:
      assert noise not in result.stderr, (name, result.stderr[-3000:])
  assert runs["predict"].stdout.startswith("the quick [MASK] fox\n  [MASK] #1: ")
  assert "Reading parameters of step 0" in runs["export"].stderr  # bertjax's own log line.

  # A checkpoint whose array data is gone: the restore's error still reaches the user.
  shutil.rmtree(os.path.join(run["checkpoints"], "0", "params", "ocdbt.process_0", "d"))
  broken = _run("bertjax.convert.export", f"--checkpoint={run['checkpoints']}",
                f"--output={tmp_path / 'hf2'}")
  assert broken.returncode != 0
  assert "Error reading" in broken.stderr and "OCDBT" in broken.stderr, broken.stderr[-3000:]
  assert "Given directory is read only" not in broken.stderr


def test_library_filter_drops_orbax_info_and_read_only_warning_only():
  cli.quiet_library_logs()
  cli.quiet_library_logs()
  absl_logger = absl_logging.get_absl_logger()
  filters = [f for f in absl_logger.filters if isinstance(f, cli._LibraryNoiseFilter)]  # pylint: disable=protected-access
  assert len(filters) == 1  # Installed once.

  def record(path, level, msg):
    return logging.LogRecord("absl", level, path, 1, msg, (), None)

  orbax = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
  keep = [record(orbax, logging.WARNING, "%s is read only, save will be skipped"),
          record(orbax, logging.ERROR, "Given directory is read only=%s"),
          record("/bertjax/train/checkpoint.py", logging.INFO, "Reading parameters")]
  drop = [record(orbax, logging.WARNING, "Given directory is read only=%s"),
          record(orbax, logging.INFO, "CheckpointManager created")]
  assert [filters[0].filter(r) for r in keep] == [True] * 3
  assert [filters[0].filter(r) for r in drop] == [False] * 2
