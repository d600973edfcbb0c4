"""Per-host batches of a task's arrays: shuffled epochs for training, every row once for eval.

Both are pure functions of their arguments, so every host computes the same
global batch and takes its own rows: host h of H takes rows [h*b, (h+1)*b)
of each global batch of B = H*b rows.
"""

from typing import Iterator, Optional

import numpy as np

from bertjax.input.pipeline import epoch_order

WEIGHT_KEY = "weights"  # 1.0 for a real example, 0.0 for padding.


def _process(index: Optional[int], count: Optional[int], global_batch_size: int):
  if index is None or count is None:
    import jax  # pylint: disable=g-import-not-at-top
    index, count = jax.process_index(), jax.process_count()
  if global_batch_size <= 0 or global_batch_size % count:
    raise ValueError(f"batch size {global_batch_size} is not a positive multiple of the "
                     f"{count} processes")
  return index, count


def _take(arrays: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
  """Rows of every array; a row of -1 is padding (row 0's values, weight 0)."""
  real = rows >= 0
  batch = {k: v[np.where(real, rows, 0)] for k, v in arrays.items()}
  batch[WEIGHT_KEY] = real.astype(np.float32)
  return batch


def train_steps(num_examples: int, global_batch_size: int, num_epochs: float) -> int:
  """Optimizer steps for num_epochs passes, as the original release counts them."""
  return int(num_examples / global_batch_size * num_epochs)


def train_batches(arrays: dict[str, np.ndarray], global_batch_size: int, *, seed: int,
                  start_step: int = 0, num_steps: int,
                  process_index: Optional[int] = None, process_count: Optional[int] = None
                  ) -> Iterator[dict[str, np.ndarray]]:
  """Steps [start_step, num_steps) of a stream of shuffled epochs, epoch after epoch.

  Batch s holds positions [s*B, (s+1)*B) of the stream; epoch e is
  epoch_order(n, seed, e), so a resumed run continues with the same rows.
  """
  index, count = _process(process_index, process_count, global_batch_size)
  n = len(next(iter(arrays.values())))
  if n == 0:
    raise ValueError("the training split has no examples")
  b = global_batch_size // count
  orders: dict[int, np.ndarray] = {}
  for step in range(start_step, num_steps):
    pos = step * global_batch_size + index * b + np.arange(b, dtype=np.int64)
    epochs, within = np.divmod(pos, n)
    rows = np.empty(b, np.int64)
    for e in np.unique(epochs):
      if int(e) not in orders:
        orders = {int(e): epoch_order(n, seed, int(e))}
      rows[epochs == e] = orders[int(e)][within[epochs == e]]
    yield _take(arrays, rows)


def num_eval_batches(num_examples: int, global_batch_size: int) -> int:
  return -(-num_examples // global_batch_size)


def eval_batches(arrays: dict[str, np.ndarray], global_batch_size: int, *,
                 process_index: Optional[int] = None, process_count: Optional[int] = None
                 ) -> Iterator[dict[str, np.ndarray]]:
  """Every row once, in order; the last global batch is padded with weight-0 rows."""
  index, count = _process(process_index, process_count, global_batch_size)
  n = len(next(iter(arrays.values())))
  b = global_batch_size // count
  for step in range(num_eval_batches(n, global_batch_size)):
    pos = step * global_batch_size + index * b + np.arange(b, dtype=np.int64)
    yield _take(arrays, np.where(pos < n, pos, -1))
