"""The file layer: globs, gzip, atomic writes, retries of transient errors."""

import errno
import gzip
import os

import pytest

from bertjax.records import fileio


def test_glob_lists_files_sorted_without_directories(tmp_path):
  for name in ("b.txt", "a.txt"):
    (tmp_path / name).write_text("x")
  (tmp_path / "c.txt").mkdir()
  assert fileio.glob(str(tmp_path / "*.txt")) == [str(tmp_path / "a.txt"),
                                                   str(tmp_path / "b.txt")]


def test_gz_files_are_decompressed_when_read(tmp_path):
  path = str(tmp_path / "x.txt.gz")
  with gzip.open(path, "wb") as f:
    f.write(b"one\ntwo\n")
  assert fileio.read_bytes(path) == b"one\ntwo\n"
  assert list(fileio.iter_lines(path)) == [b"one\n", b"two\n"]
  assert fileio.size(path) == os.path.getsize(path)


def test_write_is_atomic_and_leaves_no_temporary(tmp_path):
  path = str(tmp_path / "sub" / "out.json")
  fileio.write_text(path, "first")
  fileio.write_text(path, "second")
  assert fileio.read_text(path) == "second"
  assert os.listdir(tmp_path / "sub") == ["out.json"]
  # The temporary name is hidden from `dir/*` globs.
  assert os.path.basename(fileio.temporary_path(path)).startswith(".")


def test_failed_write_keeps_the_old_file(tmp_path):
  path = str(tmp_path / "out.bin")
  fileio.write_bytes(path, b"old")

  with pytest.raises(TypeError):
    fileio.write_bytes(path, object())  # Not bytes: the write fails part-way.
  assert fileio.read_bytes(path) == b"old"
  assert os.listdir(tmp_path) == ["out.bin"]


def test_retry_cures_transient_errors_and_stops_on_permanent_ones():
  calls = []

  def flaky():
    calls.append(1)
    if len(calls) < 3:
      raise ConnectionResetError(errno.ECONNRESET, "reset by peer")
    return "ok"

  assert fileio.retry(flaky, "read", initial_delay=0.001) == "ok"
  assert len(calls) == 3

  def missing():
    calls.append(1)
    raise FileNotFoundError(errno.ENOENT, "gone")

  calls.clear()
  with pytest.raises(FileNotFoundError):
    fileio.retry(missing, "read", initial_delay=0.001)
  assert len(calls) == 1

  def always():
    calls.append(1)
    raise TimeoutError("slow")

  calls.clear()
  retries = []
  with pytest.raises(TimeoutError):
    fileio.retry(always, "read", attempts=4, initial_delay=0.001,
                 on_retry=lambda: retries.append(1))
  assert len(calls) == 4 and len(retries) == 3


def test_glob_leaves_out_temporaries_locally_and_remotely(tmp_path):
  tf = pytest.importorskip("tensorflow")
  names = ["part-0.tfrecord", "part-1.tfrecord.tmp-4242", "part-2.tfrecord.tmp",
           ".part-3.tfrecord.tmp-7", ".hidden", "part-4.tfrecord.tmp-9.index",
           "x.tmpl"]
  for name in names:
    (tmp_path / name).write_text("x")
    with tf.io.gfile.GFile(f"ram://tmpglob/{name}", "w") as f:
      f.write("x")
  want = ["part-0.tfrecord", "x.tmpl"]
  assert [os.path.basename(p) for p in fileio.glob(str(tmp_path / "*"))] == want
  assert [os.path.basename(p) for p in fileio.glob("ram://tmpglob/*")] == want
  assert fileio.is_temporary(fileio.temporary_path(str(tmp_path / "part-0.tfrecord")))


def test_registered_filesystem_serves_its_scheme(tmp_path):
  (tmp_path / "a.txt").write_text("hello")

  class Local:
    """tf.io.gfile's functions for mem://<local path>."""
    glob = staticmethod(lambda p: [p])
    isdir = staticmethod(lambda p: False)
    exists = staticmethod(lambda p: os.path.exists(p[len("mem://"):]))
    GFile = staticmethod(lambda p, mode="rb": open(p[len("mem://"):], mode))  # pylint: disable=consider-using-with

  fileio.register_filesystem("mem", Local)
  try:
    path = "mem://" + str(tmp_path / "a.txt")
    assert fileio.exists(path) and fileio.read_text(path) == "hello"
    assert fileio.glob(path) == [path]
  finally:
    fileio.register_filesystem("mem", None)
  with pytest.raises(Exception):  # Back to tf.io.gfile, which knows no mem://.
    fileio.read_text(path)


def test_walk_files_and_expand_leave_out_temporaries(tmp_path):
  sub = tmp_path / "docs" / "sub"
  sub.mkdir(parents=True)
  for name in ("a.txt", ".a.txt.tmp-42", "b.txt.tmp"):
    (tmp_path / "docs" / name).write_text("x")
  (sub / "c.txt").write_text("x")
  want = [str(tmp_path / "docs" / "a.txt"), str(sub / "c.txt")]
  assert fileio.walk_files(str(tmp_path / "docs")) == want
  assert fileio.expand(str(tmp_path / "docs"), "--input_file",
                       directories=True) == want
  pattern = f"{tmp_path}/docs/*.txt*, {tmp_path}/docs/a.txt"
  assert fileio.expand(pattern, "--input_file") == want[:1]
  with pytest.raises(ValueError, match=r"--input_file: .*nothing\*' matches no files"):
    fileio.expand(f"{tmp_path}/nothing*", "--input_file")
  with pytest.raises(ValueError, match="--in: .*a.txt is not a directory"):
    fileio.expand(want[0], "--in", directories=True)


def test_corrupt_gzip_is_named_and_not_retried(tmp_path):
  path = tmp_path / "bad.txt.gz"
  data = gzip.compress(b"".join(b"line %d\n" % i for i in range(1000)))
  path.write_bytes(data[:len(data) // 2])
  calls = []

  def read():
    calls.append(1)
    return fileio.read_bytes(str(path))

  with pytest.raises(ValueError, match=r"bad\.txt\.gz: not a valid gzip"):
    fileio.retry(read, "read", initial_delay=0.001)
  assert len(calls) == 1


def test_under_joins_only_relative_local_paths():
  assert fileio.under("/w", "demo_data") == "/w/demo_data"
  assert fileio.under("/w", "/abs/dir") == "/abs/dir"
  assert fileio.under("/w", "gs://bucket/dir") == "gs://bucket/dir"
  assert fileio.under("/w", "") == ""


TF_STARTUP_LINES = ("All log messages before absl::InitializeLog() is called",
                    "oneDNN custom operations are on", "cpu_feature_guard")


def _tensorflow_stderr(**env):
  """stderr of a process that imports TensorFlow through fileio and runs tf.data."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ("from bertjax.records import fileio\n"
          "tf = fileio.tensorflow()\n"
          "print(list(tf.data.Dataset.range(4).batch(2).as_numpy_iterator())[-1])\n")
  clean = {k: v for k, v in os.environ.items() if k not in fileio.TF_QUIET_ENV}
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True, env=dict(clean, **env))
  assert result.stdout == "[2 3]\n"
  return result.stderr


def test_tensorflow_loads_without_its_start_up_lines_unless_asked():
  stderr = _tensorflow_stderr()
  assert not [line for line in TF_STARTUP_LINES if line in stderr], stderr[-2000:]
  # The environment's own settings win: with oneDNN asked for, its notice shows.
  assert "oneDNN custom operations are on" in _tensorflow_stderr(TF_ENABLE_ONEDNN_OPTS="1")
