"""bertjax/benchmarks/flash_gpu_check.py on a host without a GPU: its rows,
its reading of a stalled child's stack dump. On a GPU, test_gpu.py runs its
rows for real."""

import json
import subprocess
import sys
import textwrap

import jax
import pytest

from bertjax.benchmarks import row_process


def test_a_stalled_childs_innermost_frames_are_its_main_threads():
  """faulthandler dumps every thread, a helper thread first; the row names the
  frames of the main thread, innermost first (row_process.innermost, which the
  device suite's rows use too)."""
  stall = textwrap.dedent("""
      import faulthandler, threading, time
      def compile_for_a_long_time():
        time.sleep(30)
      threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
      faulthandler.dump_traceback_later(0.5, exit=True)
      compile_for_a_long_time()
      """)
  done = subprocess.run([sys.executable, "-c", stall], capture_output=True, text=True,
                        timeout=20, check=False)
  assert "Timeout (" in done.stderr and done.stderr.count("most recent call first") == 2
  frames = row_process.innermost(done.stderr)
  assert frames[0].endswith("compile_for_a_long_time") and frames[1].endswith("<module>")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="test_gpu.py runs the rows on a GPU")
def test_a_row_that_fails_says_its_stage_and_error_and_is_written(tmp_path):
  """Without a GPU the Pallas kernels have no lowering (outside interpret
  mode): the row fails while lowering, and its JSON and the child's stderr
  are written under --out."""
  done = subprocess.run([sys.executable, "-m", "bertjax.benchmarks.flash_gpu_check",
                         f"--out={tmp_path}", "--rows=dq", "--timeout_s=120"],
                        capture_output=True, text=True, timeout=300, check=True)
  row = json.loads(done.stdout.strip().splitlines()[-1])
  assert row["row"] == "dq" and row["status"] == "failed" and row["stage"] == "lower", row
  assert "interpret mode" in row["error"], row
  assert json.loads((tmp_path / "flash_gpu_check" / "dq.json").read_text()) == row
  assert (tmp_path / "flash_gpu_check" / "dq.stderr.txt").exists()


def test_an_unknown_row_is_a_usage_error():
  done = subprocess.run([sys.executable, "-m", "bertjax.benchmarks.flash_gpu_check",
                         "--rows=forward,backward"], capture_output=True, text=True,
                        timeout=60, check=False)
  assert done.returncode == 2 and "--rows: unknown row(s) backward" in done.stderr
