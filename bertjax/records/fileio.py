"""The one file layer: local paths and URLs (gs://...), gzip, atomic writes.

Every module that touches a data, checkpoint-side or export file goes
through here, so each path scheme and each write rule is written once:

* A path with "://" in it is remote and goes through `tf.io.gfile`
  (TensorFlow is imported only then, by `tensorflow()`, which hides every
  accelerator from it; tf.data input and TF1 checkpoints use the same
  import), or through the file system registered for its scheme with
  `register_filesystem`; anything else is local and uses the standard
  library.
* `glob` leaves out temporaries (hidden names, and names with a `.tmp` or
  `.tmp-PID` part, which interrupted writes leave behind), so a pattern such
  as `dir/*` matches only finished files.
* `open_read` (an `InputFile`) decompresses names ending in `.gz` and
  names the file in its errors; `open_binary` gives the stored bytes, for
  reads of byte ranges.
* `expand` turns a flag's comma-separated globs (or directories) into files,
  naming the flag and the pattern that matches nothing.
* `write_bytes` / `write_text` write a whole file at once: locally to a
  hidden temporary name in the same directory, then renamed, so a reader (or
  a training glob such as `dir/*`) never sees a partial file; remotely in one
  object write, which object stores make atomic.
* `retry` re-runs a read on transient I/O errors with exponential backoff;
  only errors that another try may cure count as transient.
"""

import glob as globlib
import gzip
import logging
import os
import re
import time
import zlib
from typing import Any, Callable, IO, Iterator, Optional, TypeVar

T = TypeVar("T")

# URL scheme ("gs") -> an object with tf.io.gfile's functions (GFile, glob,
# exists, isdir, stat, listdir, walk, makedirs, remove).
_FILESYSTEMS: dict[str, Any] = {}


def register_filesystem(scheme: str, filesystem: Optional[Any]) -> None:
  """Routes paths `scheme://...` to `filesystem` (None: back to tf.io.gfile).

  `filesystem` provides tf.io.gfile's functions; `stat` returns an object
  with `length` and `mtime_nsec`.
  """
  if filesystem is None:
    _FILESYSTEMS.pop(scheme, None)
  else:
    _FILESYSTEMS[scheme] = filesystem


def is_remote(path: str) -> bool:
  """True for URLs (gs://bucket/...), which go through tf.io.gfile."""
  return "://" in path


def under(base: str, path: str) -> str:
  """`path` taken relative to `base` unless it is absolute or a URL (or empty)."""
  if not path or os.path.isabs(path) or is_remote(path):
    return path
  return os.path.join(base, path)


_tf_module = None
# TensorFlow's start-up lines, which its C++ libraries print when they load:
# absl's "All log messages before absl::InitializeLog() is called are written
# to STDERR" and oneDNN's notice that its custom operations are on (each once
# per TensorFlow library that loads). bertjax computes nothing with TensorFlow,
# so oneDNN's kernels have nothing to do here; without them, the INFO level that
# TF_CPP_MIN_LOG_LEVEL=1 leaves out is all TensorFlow would print at start-up.
# Set only where the environment does not already say otherwise.
TF_QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1", "TF_ENABLE_ONEDNN_OPTS": "0"}


def tensorflow():
  """TensorFlow, imported on first use with every accelerator hidden from it
  (bertjax uses it for files, tf.data and TF1 checkpoints, never for compute
  on a device, whose memory it leaves to JAX) and without its start-up lines
  (TF_QUIET_ENV, unless the environment sets those variables)."""
  global _tf_module
  if _tf_module is None:
    for name, value in TF_QUIET_ENV.items():
      os.environ.setdefault(name, value)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    for kind in ("GPU", "TPU"):
      try:
        tf.config.set_visible_devices([], kind)
      except (RuntimeError, ValueError):  # Already initialised, or no such kind.
        pass
    if tf.config.get_visible_devices("GPU"):
      logging.warning("TensorFlow was initialised elsewhere first and sees GPUs; "
                      "call tf.config.set_visible_devices([], 'GPU') before any "
                      "other TensorFlow use so that it leaves their memory to JAX.")
    _tf_module = tf
  return _tf_module


def _gfile(path: str = ""):
  registered = _FILESYSTEMS.get(path.split("://", 1)[0]) if "://" in path else None
  if registered is not None:
    return registered
  return tensorflow().io.gfile


_TEMPORARY = re.compile(r"\.tmp(-\d+)?(\.|$)")


def is_temporary(path: str) -> bool:
  """True for names that writes in progress use: hidden (leading dot), or
  with a `.tmp` / `.tmp-PID` part (`part-00001.tfrecord.tmp-4242`)."""
  name = os.path.basename(path.rstrip("/"))
  return name.startswith(".") or bool(_TEMPORARY.search(name))


def glob(pattern: str) -> list[str]:
  """The files (not directories, not temporaries) matching a glob, sorted."""
  if is_remote(pattern):
    gfile = _gfile(pattern)
    found = [p for p in gfile.glob(pattern) if not gfile.isdir(p)]
  else:
    found = [p for p in globlib.glob(pattern) if not os.path.isdir(p)]
  return sorted(p for p in found if not is_temporary(p))


def exists(path: str) -> bool:
  return _gfile(path).exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _gfile(path).isdir(path) if is_remote(path) else os.path.isdir(path)


def readable(path: str) -> bool:
  return _gfile(path).exists(path) if is_remote(path) else os.access(path, os.R_OK)


def walk_files(directory: str) -> list[str]:
  """Every file under a directory, recursively, sorted; temporaries (see
  `is_temporary`) are left out, as `glob` leaves them out."""
  walk = _gfile(directory).walk if is_remote(directory) else os.walk
  return sorted(os.path.join(root, name) for root, _, names in walk(directory)
                for name in names if not is_temporary(name))


def expand(patterns: str, flag: str, directories: bool = False) -> list[str]:
  """The files of comma-separated globs, in order, each once.

  With `directories`, each pattern names a directory whose files (all, at
  any depth) are taken. ValueError naming `flag` when nothing is given, a
  pattern matches no files, a directory is not one, or a file is not
  readable.
  """
  if not patterns:
    raise ValueError(f"{flag} is required (comma-separated file globs).")
  files = []
  for pattern in patterns.split(","):
    pattern = pattern.strip()
    if not pattern:
      continue
    if directories and not isdir(pattern):
      raise ValueError(f"{flag}: {pattern} is not a directory (every file "
                       "under the given directories is read).")
    found = walk_files(pattern) if directories else glob(pattern)
    if not found:
      raise ValueError(f"{flag}: {pattern!r} matches no files.")
    for path in found:
      if not readable(path):
        raise ValueError(f"{flag}: {path} is not readable.")
    files.extend(found)
  return list(dict.fromkeys(files))


def listdir(directory: str) -> list[str]:
  """The names in a directory, sorted."""
  names = _gfile(directory).listdir(directory) if is_remote(directory) else os.listdir(directory)
  return sorted(n.rstrip("/") for n in names)


def stat(path: str) -> tuple[int, int]:
  """(size in bytes as stored, mtime in ns) of a local or remote file."""
  if is_remote(path):
    st = _gfile(path).stat(path)
    return int(st.length), int(st.mtime_nsec)
  st = os.stat(path)
  return st.st_size, st.st_mtime_ns


def size(path: str) -> int:
  """Size in bytes as stored (compressed for .gz)."""
  return stat(path)[0]


def makedirs(path: str) -> None:
  if is_remote(path):
    _gfile(path).makedirs(path)
  else:
    os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
  if is_remote(path):
    _gfile(path).remove(path)
  else:
    os.remove(path)


def open_binary(path: str, mode: str = "rb") -> IO[bytes]:
  """A raw (not decompressed) binary file object, local or remote."""
  if is_remote(path):
    return _gfile(path).GFile(path, mode)
  return open(path, mode)  # pylint: disable=consider-using-with


def open_text(path: str, mode: str = "r") -> IO[str]:
  """A UTF-8 text file object ("r" or "w"; not atomic), local or remote."""
  if is_remote(path):
    return _gfile(path).GFile(path, mode)
  return open(path, mode, encoding="utf-8")  # pylint: disable=consider-using-with


class InputFile:
  """A local or remote file read from its start, decompressed if its name
  ends in `.gz`.

  Iterating gives its lines as bytes; `read()` the rest of it.
  `stored_bytes_read` is how far into the stored (for .gz compressed) file
  reading has got, for progress reports. A corrupt .gz, or another error
  that a retry cannot cure, raises ValueError naming the file; transient
  errors (`is_transient`) are raised as they are, so `retry` can retry them.
  """

  def __init__(self, path: str):
    self.path = path
    self._raw = open_binary(path)
    self._file = self._raw
    if path.endswith(".gz"):
      self._file = gzip.GzipFile(fileobj=self._raw, mode="rb")

  def __enter__(self) -> "InputFile":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    if self._file is not self._raw:
      self._file.close()
    self._raw.close()

  def _check(self, e: Exception) -> None:
    """Raises ValueError naming the file unless `e` is transient."""
    if not is_transient(e):
      kind = "not a valid gzip file" if self.path.endswith(".gz") else "read error"
      raise ValueError(f"{self.path}: {kind} ({e}).") from e

  def __iter__(self) -> Iterator[bytes]:
    try:
      yield from self._file
    except (OSError, EOFError, zlib.error) as e:
      self._check(e)
      raise

  def read(self) -> bytes:
    try:
      return self._file.read()
    except (OSError, EOFError, zlib.error) as e:
      self._check(e)
      raise

  @property
  def stored_bytes_read(self) -> int:
    return self._raw.tell()


def open_read(path: str) -> InputFile:
  """A binary reader, decompressing names that end in `.gz`."""
  return InputFile(path)


def read_bytes(path: str) -> bytes:
  """A whole file's bytes (decompressed for .gz)."""
  with open_read(path) as f:
    return f.read()


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def temporary_path(path: str) -> str:
  """A hidden name beside `path` for a write in progress: it starts with a dot
  (so `dir/*` globs skip it) and carries the process id."""
  directory, name = os.path.split(path)
  return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def write_bytes(path: str, data: bytes) -> None:
  """Writes a whole file: atomically (hidden temporary, rename) when local, in
  one object write when remote. Creates the directory if needed."""
  if is_remote(path):
    with _gfile(path).GFile(path, "wb") as f:
      f.write(data)
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = temporary_path(path)
  try:
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode("utf-8"))


def iter_lines(path: str) -> Iterator[bytes]:
  """A file's lines as bytes (decompressed for .gz)."""
  with open_read(path) as f:
    yield from f


# Errors worth another try: the network or the store may recover. A missing
# file, a permission error, a full disk or a read-only file system will not.
_PERMANENT_ERRNOS = {2, 13, 20, 21, 28, 30}  # ENOENT EACCES ENOTDIR EISDIR ENOSPC EROFS
# tf.errors raised by tf.io.gfile on remote stores when the service is briefly
# unavailable, a request timed out or was aborted, or a rate limit was hit.
_TRANSIENT_TF_ERRORS = {"UnavailableError", "DeadlineExceededError", "AbortedError",
                        "ResourceExhaustedError"}


def is_transient(error: BaseException) -> bool:
  """True for I/O errors that a retry may cure (timeouts, resets, 5xx)."""
  if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError,
                        NotADirectoryError, gzip.BadGzipFile, EOFError,
                        zlib.error)):
    return False
  if isinstance(error, OSError):
    return getattr(error, "errno", None) not in _PERMANENT_ERRNOS
  return type(error).__name__ in _TRANSIENT_TF_ERRORS


def retry(fn: Callable[[], T], what: str, *, attempts: int = 6,
          initial_delay: float = 0.5, max_delay: float = 30.0,
          on_retry: Optional[Callable[[], Any]] = None) -> T:
  """fn(), tried again on transient I/O errors with exponential backoff.

  `what` names the operation in the log (e.g. "read of gs://b/x at 1024");
  `on_retry` is called before each further try (to count them). The last
  error is raised when `attempts` tries have failed, and at once for errors
  that are not transient.
  """
  delay = initial_delay
  for attempt in range(1, attempts + 1):
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      if attempt == attempts or not is_transient(e):
        raise
      logging.warning("%s failed (%s: %s); try %d of %d in %.1f s.", what,
                      type(e).__name__, e, attempt + 1, attempts, delay)
      if on_retry is not None:
        on_retry()
      time.sleep(delay)
      delay = min(2 * delay, max_delay)
  raise AssertionError("unreachable")
