"""The steps of an offline job as tasks: worker processes, progress, resume.

Record creation (bertjax/create/creation.py) and corpus extraction
(bertjax/corpus/extraction.py) both run a few steps of independent tasks
over their input, in a pool of spawned worker processes or, for one worker,
in the calling process; this module is what they share:

* `run_step` runs a step's tasks, returns their results by index and shows a
  progress bar: by tasks, or by a count the tasks add to (`Progress`, e.g.
  pages, with their rate per second); a worker that dies (killed, out of
  memory) breaks the pool, and the run stops with an error that says to
  rerun, instead of waiting for it;
* a finished task leaves `<work>/<kind>-XXXXX.json` (`finish`, written last
  and atomically), which a rerun takes as its result (`read_done`) instead
  of running it again.
"""

import concurrent.futures
import json
import multiprocessing
import os
import sys
from typing import Any, Callable, Optional

from bertjax.records import fileio


def task_dir(work_dir: str, kind: str, index: int) -> str:
  return os.path.join(work_dir, f"{kind}-{index:05d}")


def read_done(work_dir: str, kind: str, index: int):
  """A finished task's result, or None."""
  path = task_dir(work_dir, kind, index) + ".json"
  if not os.path.exists(path):
    return None
  return json.loads(fileio.read_text(path))


def finish(work_dir: str, kind: str, index: int, result: dict) -> dict:
  """Records a task's result, which marks it done; returns the result."""
  fileio.write_text(task_dir(work_dir, kind, index) + ".json", json.dumps(result))
  return result


def spawn_context():
  return multiprocessing.get_context("spawn")


class Progress:
  """A count (pages, documents) that tasks add to, in worker processes or
  here, shown by `run_step`'s bar with its rate. Pass it to the pool's
  initializer so that worker processes share it."""

  def __init__(self, unit: str):
    self.unit = unit
    self.count = spawn_context().Value("q", 0)
    self.bar = None  # Set while run_step shows a bar in this process.

  def add(self, n: int) -> None:
    with self.count.get_lock():
      self.count.value += n
    if self.bar is not None:
      self.bar.update(n)

  def __getstate__(self):
    return {"unit": self.unit, "count": self.count, "bar": None}


def run_step(pool: Optional[concurrent.futures.Executor], desc: str, indices,
             task: Callable[[int], tuple],
             done: Callable[[int], Any] = lambda i: None,
             show_progress: bool = True,
             progress: Optional[Progress] = None) -> dict[int, Any]:
  """Runs the tasks of a step, in `pool` or (None) here, in order of
  `indices`; returns their results by index.

  `task(i)` gives (function, *args) of task i; `done(i)`, the result of a
  task finished by an earlier run, or None. The bar counts tasks, or with
  `progress` its unit (with the tasks done after it).
  """
  indices = list(indices)
  out = {i: done(i) for i in indices}
  todo = [i for i in indices if out[i] is None]
  bar = None
  if show_progress and todo:
    import tqdm  # pylint: disable=g-import-not-at-top
    if progress is None:
      bar = tqdm.tqdm(total=len(todo), desc=desc, unit="task", file=sys.stderr)
    else:
      bar = tqdm.tqdm(desc=desc, unit=progress.unit, file=sys.stderr)
      bar.set_postfix_str(f"0/{len(todo)} tasks")
  tasks_done = 0

  def advance():
    nonlocal tasks_done
    tasks_done += 1
    if bar is None:
      return
    if progress is None:
      bar.update(1)
    else:
      bar.set_postfix_str(f"{tasks_done}/{len(todo)} tasks")

  try:
    if pool is None:
      if progress is not None:
        progress.bar = bar
      for i in todo:
        fn, *args = task(i)
        out[i] = fn(*args)
        advance()
      return out
    futures = {pool.submit(*task(i)): i for i in todo}
    pending = set(futures)
    while pending:
      finished, pending = concurrent.futures.wait(
          pending, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED)
      for future in finished:
        i = futures[future]
        out[i] = result(future, f"{desc} (task {i})")
        advance()
      if bar is not None and progress is not None:
        bar.update(progress.count.value - bar.n)
    return out
  finally:
    if progress is not None:
      progress.bar = None
    if bar is not None:
      bar.close()


def result(future, what):
  """A task's result; a worker's error is raised here."""
  try:
    return future.result()
  except concurrent.futures.process.BrokenProcessPool as e:
    raise RuntimeError(
        f"a worker process stopped unexpectedly while {what} (killed, or out "
        "of memory? fewer --num_workers use less); rerun to resume.") from e
