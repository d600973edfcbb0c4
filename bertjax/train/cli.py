"""How every command line reports a user's mistake: one line on stderr, a non-zero exit.

`run(main)` is absl's app.run(main), except that
  * an app.UsageError prints as one line (`Error: <message>`) instead of the
    program's help text, and exits with its exitcode (1 unless set), and
  * a ValueError (run_config.ConfigError included) or FileNotFoundError whose
    message names a flag (`--name`) or starts with an existing file's path
    (`path: ...` or `path:line: ...`) is taken for bad input, prints the same
    way and exits with 1.
Any other exception is a bug and keeps its traceback. `run` also quiets
libraries' routine log lines (quiet_library_logs), so that a command's own
output and its warnings and errors are what it prints. Flag parsing errors are
absl's own "FATAL Flags parsing error: ..." line (a missing required flag), or,
for an error that ml_collections' --config.* parsing raises naming a field
given on the command line (an unknown field), the same `Error: ...` line.
"""

import functools
import os
import re
import sys
from typing import Callable, Optional, Sequence

from absl import app
from absl import flags
from absl import logging

_FLAG = re.compile(r"(?:^|[\s'\"(=,;])--[A-Za-z]")
_PATH_PREFIX = re.compile(r"^(.+?)(?::\d+)?: ")


def is_user_error(error: BaseException) -> bool:
  """A ValueError or FileNotFoundError about the input: naming a flag or a file."""
  if not isinstance(error, (ValueError, FileNotFoundError)):
    return False
  message = str(error)
  if _FLAG.search(message):
    return True
  match = _PATH_PREFIX.match(message)
  return bool(match) and (match.group(1).startswith("gs://")
                          or os.path.exists(match.group(1)))


class _LibraryNoiseFilter:
  """Drops orbax's INFO lines (per-save and per-restore chatter that buries the
  run's own log) and its warning that a checkpoint directory is read only, which
  bertjax's readers (export, predict, init_from) open it as on purpose. orbax's
  other warnings and every error still show."""

  def filter(self, record) -> bool:
    if "/orbax/" not in record.pathname:
      return True
    if record.levelno <= logging.converter.STANDARD_INFO:
      return False
    return not (record.levelno == logging.converter.STANDARD_WARNING
                and str(record.msg).startswith("Given directory is read only"))


def quiet_library_logs() -> None:
  """Installs _LibraryNoiseFilter on absl's logger (once)."""
  absl_logger = logging.get_absl_logger()
  if not any(isinstance(f, _LibraryNoiseFilter) for f in absl_logger.filters):
    absl_logger.addFilter(_LibraryNoiseFilter())


def _exit(message: str, exitcode: int) -> None:
  sys.stderr.write(f"Error: {message}\n")
  sys.stderr.flush()
  sys.exit(exitcode)


def one_line_errors(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """`main` with user errors reported as one line (module docstring)."""
  @functools.wraps(main)
  def wrapped(argv):
    try:
      return main(argv)
    except app.UsageError as e:
      _exit(str(e), e.exitcode)
    except (ValueError, FileNotFoundError) as e:
      if not is_user_error(e):
        raise
      _exit(str(e), 1)
  return wrapped


def _one_line_parse_errors(parser: Callable[[list[str]], list[str]]):
  """`parser` (absl's flags_parser) with a parsing error that names one of the
  command line's flags reported as one line naming that flag."""
  def parse(argv):
    try:
      return parser(argv)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
      name = str(e).strip("'\" ")
      flags = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--")]
      named = [f for f in flags if name in f.lstrip("-").split(".")[1:]]
      if not named:
        raise
      if isinstance(e, (AttributeError, KeyError)):
        _exit(f"{', '.join(named)}: the config has no field {name!r}; check the name "
              "(the config file lists its fields)", 1)
      _exit(f"{', '.join(named)}: {e}", 1)
  return parse


def known_flags(argv: list[str]) -> list[str]:
  """A flags_parser for `run` that parses the program's flags and leaves the
  rest (Apache Beam's pipeline options) to it."""
  return flags.FLAGS(argv, known_only=True)


def beam_runner(runner: str, extra_args: Sequence[str]) -> Optional[str]:
  """The Beam runner of `--runner=beam:<Runner>`, or None for `local`; a
  UsageError for another value, or for arguments left over without Beam."""
  if runner != "local" and not runner.startswith("beam:"):
    raise app.UsageError(f"--runner={runner}: use local or beam:<Runner>.")
  if runner == "local":
    if extra_args:
      raise app.UsageError(f"Unknown arguments {list(extra_args)}; only "
                           "--runner=beam:... passes extra options on.")
    return None
  return runner[len("beam:"):]


def run(main: Callable[[list[str]], None], **kwargs) -> None:
  """absl's app.run(main, **kwargs) with user errors as one line."""
  parser = kwargs.pop("flags_parser", app.parse_flags_with_usage)
  quiet_library_logs()
  app.run(one_line_errors(main), flags_parser=_one_line_parse_errors(parser), **kwargs)
