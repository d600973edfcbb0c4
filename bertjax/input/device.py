"""Host batches onto the devices: global arrays, prefetched by a background thread.

`to_global` turns a host's numpy batch into global jax.Arrays sharded over
the batch dimension; `prefetch_to_device` keeps a few of them already
transferred while the step runs. Both work on any source of host batches
(bertjax/input/pipeline.py's, the fine-tuning tasks', synthetic ones).
"""

from collections.abc import Iterator, Mapping
import queue
import threading
from typing import Any

from absl import logging
import numpy as np


def to_global(batch: Mapping[str, np.ndarray], sharding) -> dict[str, Any]:
  """Host-local numpy batch -> global jax.Arrays, the batch dimension sharded.

  `sharding` is one jax.sharding.Sharding for every field (e.g.
  NamedSharding(mesh, P("data"))) or a dict of them per field.
  """
  import jax  # pylint: disable=g-import-not-at-top
  return {k: jax.make_array_from_process_local_data(
      sharding[k] if isinstance(sharding, Mapping) else sharding, v)
          for k, v in batch.items()}


class _Failure:

  def __init__(self, error: BaseException):
    self.error = error


_DONE = object()
_JOIN_TIMEOUT_S = 60


def prefetch_to_device(iterator: Iterator[Mapping[str, np.ndarray]], sharding,
                       size: int = 2) -> Iterator[dict[str, Any]]:
  """Yields to_global(batch) with up to `size` batches already on device.

  A background thread takes host batches from `iterator` and starts their
  transfer; an error there is raised here. Closing the returned generator
  stops the thread.
  """
  if size < 1:
    raise ValueError(f"prefetch size must be >= 1, got {size}")
  ready: queue.Queue = queue.Queue(maxsize=size)
  stop = threading.Event()

  def put(item) -> bool:
    while not stop.is_set():
      try:
        ready.put(item, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def produce():
    try:
      for batch in iterator:
        if not put(to_global(batch, sharding)):
          return
      put(_DONE)
    except BaseException as e:  # pylint: disable=broad-except
      put(_Failure(e))
    finally:
      close = getattr(iterator, "close", None)
      if close is not None:
        close()  # Releases the source's readers here, in the thread that runs it.

  thread = threading.Thread(target=produce, name="prefetch_to_device", daemon=True)
  thread.start()
  try:
    while True:
      item = ready.get()
      if item is _DONE:
        return
      if isinstance(item, _Failure):
        raise item.error
      yield item
  finally:
    stop.set()
    # Waits for the thread: one left running into interpreter shutdown, inside
    # a device transfer or a reader, aborts the process.
    thread.join(timeout=_JOIN_TIMEOUT_S)
    if thread.is_alive():
      logging.warning("The input prefetch thread did not stop within %d s.", _JOIN_TIMEOUT_S)
