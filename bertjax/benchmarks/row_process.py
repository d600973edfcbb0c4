"""A device-suite row as a process of its own: its config, phases and time boxes.

Shared by the suite (bertjax/benchmarks/device_suite.py, the parent) and the
rows' processes (device_row.py, bertjax's train step; peer_row.py,
transformers' BertForPreTraining in PyTorch). Standard library only, so that
the peer's process imports it where JAX and ml_collections are absent.

A row's process reports the phase it is in, and each phase counts against
one of the row's two time boxes (the spec's `boxes`, in seconds):

  compile:  start (imports, the device's start), build (model, parameters,
            optimizer state), compile (XLA's compile of the step; the peer's
            torch.compile with its first step)
  steps:    steps (warm-up and timed steps), eager (the peer's eager steps),
            profile (traced steps and their summary)

A box opens when a phase of it follows one of the other box (the first at
the process's start), so a row that compiles twice (packed and unpacked,
eager and compiled) has a box for each compile and each run of steps. On
entering a phase the process writes it to the spec's `status` file (`Phases`)
and, when a box opens, arms faulthandler to print every thread's stack and
exit when the box or the suite's deadline runs out. It writes its result so
far to the spec's `result` file after each part it measures, so that a row
stopped in its second part keeps the first.

The parent (`run`) starts the process, in a process group of its own, with
its output appended to a log, reads the status file twice a second (telling
`on_phase` of each new phase) and kills a process still running GRACE_S
after its box or the deadline ran out; whatever the process left running in
its group is killed when it ends. A row that ends without a final result is reported "stopped in
<phase> after N s" with the box that ran out and the innermost frames of its
stack dump, or "failed" where no box or deadline ran out.
"""

import ast
import faulthandler
import importlib.util
import json
import os
import re
import signal
import subprocess
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPILE, STEPS = "compile", "steps"
BOX_OF = {"start": COMPILE, "build": COMPILE, "compile": COMPILE,
          "steps": STEPS, "eager": STEPS, "profile": STEPS}
GRACE_S = 10.0  # For the process's own stack dump and exit before the parent kills it.
FINAL = ("ok", "failed")  # Statuses a process writes when it has finished.


def load_config(path: str, overrides: dict):
  """The run config of a config file (relative to the repository) with
  dotted-field overrides ({"model.num_layers": 2}); a string value is read as
  a Python literal where it is one."""
  full = path if os.path.isabs(path) else os.path.join(REPO, path)
  spec = importlib.util.spec_from_file_location("suite_config", full)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  for field, value in overrides.items():
    *parents, leaf = field.split(".")
    node = config
    for name in parents:
      node = node[name]
    if leaf not in node:
      raise KeyError(f"--set={field}=...: {path} has no field {field}")
    if isinstance(value, str):
      try:
        value = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        pass
    node[leaf] = value
  return config


def write_json(path: str, value: dict):
  """Writes `value` to `path` whole or not at all (a reader never sees half)."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=1, default=float)
  os.replace(tmp, path)


def read_json(path: str) -> dict | None:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


class Phases:
  """The process's side: `enter` each phase as the row moves on."""

  def __init__(self, spec: dict):
    self.path, self.boxes = spec["status"], spec["boxes"]
    self.deadline = spec["deadline"]
    self.box, self.box_since = COMPILE, spec["started"]  # The start's box, opened by the parent.
    self._arm()

  def enter(self, phase: str, detail: str = ""):
    now = time.time()
    if BOX_OF[phase] != self.box:
      self.box, self.box_since = BOX_OF[phase], now
      self._arm()
    write_json(self.path, {"phase": phase, "detail": detail, "since": now, "box": self.box,
                           "box_since": self.box_since})
    print(f"phase {phase}{f' ({detail})' if detail else ''}", flush=True)

  def left(self) -> float:
    """Seconds until the box or the deadline runs out."""
    return min(self.box_since + self.boxes[self.box], self.deadline) - time.time()

  def finish(self):
    faulthandler.cancel_dump_traceback_later()

  def _arm(self):
    faulthandler.dump_traceback_later(max(self.left(), 1.0), exit=True)


def row_main(argv: list[str], run_row):
  """A row process's main: reads the spec (argv[1]), runs `run_row(spec, phases)`
  and writes its result, status "ok" with its figures or "failed" with the
  error and what was measured before it."""
  if len(argv) != 2:
    raise SystemExit(f"usage: python -m MODULE SPEC.json (as the device suite starts it), "
                     f"got {argv[1:]}")
  with open(argv[1], encoding="utf-8") as f:
    spec = json.load(f)
  phases = Phases(spec)
  try:
    result = {**run_row(spec, phases), "status": "ok"}
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    first = str(e).strip().splitlines()
    result = {**(read_json(spec["result"]) or {}), "status": "failed",
              "error": f"{type(e).__name__}: {first[0] if first else ''}"[:2000],
              "error_text": str(e)[:20000]}
  phases.finish()
  write_json(spec["result"], result)


def innermost(log: str, frames: int = 6) -> list[str]:
  """The innermost Python frames, most recent first, of the main thread in a
  faulthandler stack dump (the thread that threading.py did not start)."""
  dump = log.split("Timeout (", 1)[-1]
  threads = re.split(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$",
                     dump, flags=re.MULTILINE)[1:]
  main_thread = [t for t in threads if "threading.py" not in t] or threads or [""]
  calls = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', main_thread[0])
  return [f"{path.split('site-packages/')[-1]}:{line} {func}"
          for path, line, func in calls[:frames]]


def run(command: list[str], spec: dict, log_path: str, *, on_phase=None,
        grace_s: float = GRACE_S, env: dict | None = None) -> dict:
  """Runs one row's process (`command` + [spec file]) under its time boxes and
  the spec's deadline; returns its result, or why it has none.

  Writes the spec beside its `result`; the process's output is appended to
  `log_path`; `on_phase(status)` is called with each phase the process enters."""
  spec = {**spec, "started": time.time()}
  spec_path = spec["result"] + ".spec.json"
  write_json(spec_path, spec)
  write_json(spec["status"], {"phase": "start", "detail": "", "since": spec["started"],
                              "box": COMPILE, "box_since": spec["started"]})
  start = time.monotonic()
  with open(log_path, "a", encoding="utf-8") as log:
    offset = log.tell()
    # A process group of its own: what the row started (torch.compile's workers)
    # goes with it.
    proc = subprocess.Popen(command + [spec_path], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, env=env, process_group=0)
  seen, killed = None, ""
  while proc.poll() is None:
    status = read_json(spec["status"]) or {}
    if on_phase and status.get("since") != seen:
      seen = status.get("since")
      on_phase(status)
    now = time.time()
    if now > status.get("box_since", spec["started"]) + spec["boxes"][
        status.get("box", COMPILE)] + grace_s:
      killed = "box"
    elif now > spec["deadline"] + grace_s:
      killed = "deadline"
    if killed:
      break
    time.sleep(0.5)
  _kill_group(proc)
  wall = time.monotonic() - start
  result = read_json(spec["result"]) or {}
  if result.get("status") not in FINAL:
    result.update(_unfinished(spec, proc.returncode, killed, log_path, offset))
  result["wall_s"] = wall
  return result


def _kill_group(proc: subprocess.Popen):
  """Ends the process and whatever it left running in its group."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  proc.wait()


def _unfinished(spec: dict, code: int, killed: str, log_path: str, offset: int) -> dict:
  """Why a process left no final result: stopped by a time box or the deadline
  (by its own stack dump, or killed), else failed."""
  status = read_json(spec["status"]) or {}
  with open(log_path, encoding="utf-8", errors="replace") as f:
    f.seek(offset)
    text = f.read()
  now = time.time()
  phase, box = status.get("phase", "start"), status.get("box", COMPILE)
  in_phase = now - status.get("since", spec["started"])
  box_s = spec["boxes"][box]
  box_out = now >= status.get("box_since", spec["started"]) + box_s - 1
  deadline_out = now >= spec["deadline"] - 1
  if killed or ((box_out or deadline_out) and "Timeout (" in text):
    why = (f"its {box} time box, {box_s:.0f} s" if killed == "box" or (not killed and box_out)
           else "the suite's --budget_s ran out")
    return {"status": "stopped", "process_phase": phase, "error": (
        f"stopped in {phase}{f' ({d})' if (d := status.get('detail')) else ''} after "
        f"{in_phase:.0f} s: {why}{'; killed' if killed else ''}"),
            "innermost": innermost(text) if "Timeout (" in text else []}
  errors = re.findall(r"^[\w.]*(?:Error|Exception)\b.*$", text, re.MULTILINE)
  last = errors[-1] if errors else " / ".join(text.strip().splitlines()[-3:])
  return {"status": "failed", "process_phase": phase,
          "error": f"the row's process exited with {code} in {phase}, no result: {last}"}
