"""A user's mistake on a command line is one line naming the flag, with a non-zero
exit status and no traceback; a bug keeps its traceback."""

import os
import subprocess
import sys

import pytest
from absl import app

from bertjax.train import usage

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(module, *flags):
  return subprocess.run([sys.executable, "-m", module, *flags], cwd=REPO,
                        capture_output=True, text=True, timeout=300, check=False)


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
    usage.one_line_errors(bad_flag)([])
  assert e.value.code == 1
  assert capsys.readouterr().err == "Error: --config.seed: must be >= 0\n"
  with pytest.raises(SystemExit):
    usage.one_line_errors(lambda argv: (_ for _ in ()).throw(app.UsageError("--x: bad")))([])
  assert capsys.readouterr().err == "Error: --x: bad\n"
  with pytest.raises(ValueError, match="broadcast"):
    usage.one_line_errors(bug)([])
  assert usage.is_user_error(ValueError(f"{REPO}/README.md:3: bad row"))
  assert not usage.is_user_error(TypeError("--config.seed"))
