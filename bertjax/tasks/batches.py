"""Per-host batches of a task's arrays: shuffled epochs for training, every row once for eval.

Both are pure functions of their arguments, so every host computes the same
global batch and takes its own rows: host h of H takes rows [h*b, (h+1)*b)
of each global batch of B = H*b rows. On the devices a host's rows sit where
that host's devices sit in the mesh, which need not be host after host (a
TPU mesh is laid out by the chips' physical positions), so an evaluation
batch carries each row's example id (EXAMPLE_ID_KEY), the predict step
returns the ids with its outputs, and in_example_order puts every output
with its example by id.

Length bucketing (`buckets`, from bucket_lengths): each global batch is cut
to the shortest bucket length that holds its longest example, so a batch of
short sentences runs on a short shape and the model compiles once per
bucket, not once per batch. Evaluation then visits the examples sorted by
length (every one once; `predict` puts the outputs back in order); training
keeps each epoch's shuffled example set and reorders it so that batches hold
examples of similar length (bucketed_epoch_order).
"""

from typing import Iterator, Optional

import numpy as np

from bertjax.input.pipeline import epoch_order, process_slot

WEIGHT_KEY = "weights"  # 1.0 for a real example, 0.0 for padding.
EXAMPLE_ID_KEY = "example_ids"  # An evaluation row's example (its row in the split); -1: padding.


def bucket_lengths(max_seq_length: int, min_length: int) -> tuple[int, ...]:
  """min_length, doubling while below max_seq_length, then max_seq_length
  (32, 64, 128 for 128 from 32); () when min_length is 0 (no bucketing)."""
  if min_length <= 0:
    return ()
  out = []
  length = min_length
  while length < max_seq_length:
    out.append(length)
    length *= 2
  return (*out, max_seq_length)


def buckets_of(config) -> tuple[int, ...]:
  """The fine-tuning config's bucket lengths: () with config.bucketing.enabled False."""
  if not config.bucketing.enabled:
    return ()
  if config.bucketing.min_length <= 0:
    raise ValueError(f"--config.bucketing.min_length={config.bucketing.min_length}: must be "
                     "positive (or set --config.bucketing.enabled=False)")
  return bucket_lengths(config.max_seq_length, config.bucketing.min_length)


def example_lengths(arrays: dict[str, np.ndarray]) -> np.ndarray:
  """Positions up to each example's last real token (input_mask 1); the longest
  of its sequences for an example of several (multiple choice)."""
  mask = arrays["input_mask"]
  flat = mask.reshape(len(mask), -1, mask.shape[-1]) != 0
  last = mask.shape[-1] - np.argmax(flat[..., ::-1], axis=-1)
  return np.where(flat.any(-1), last, 0).max(-1).astype(np.int64)


def padded_length(lengths: np.ndarray, buckets: tuple[int, ...]) -> Optional[int]:
  """The shortest bucket that holds every length (None: no bucketing)."""
  if not buckets:
    return None
  longest = int(lengths.max()) if len(lengths) else 0
  return next((b for b in buckets if b >= longest), buckets[-1])


def _take(arrays: dict[str, np.ndarray], rows: np.ndarray,
          length: Optional[int] = None) -> dict[str, np.ndarray]:
  """Rows of every array; a row of -1 is padding (row 0's values, weight 0).
  With `length`, arrays laid out like input_ids keep their first `length` positions."""
  real = rows >= 0
  picked = np.where(real, rows, 0)
  batch = {}
  for k, v in arrays.items():
    ids = arrays["input_ids"] if length is not None else None
    per_position = ids is not None and v.ndim == ids.ndim and v.shape[-1] == ids.shape[-1]
    batch[k] = v[picked][..., :length] if per_position else v[picked]
  batch[WEIGHT_KEY] = real.astype(np.float32)
  return batch


def train_steps(num_examples: int, global_batch_size: int, num_epochs: float) -> int:
  """Optimizer steps for num_epochs passes, as the original release counts them."""
  return int(num_examples / global_batch_size * num_epochs)


def bucketed_epoch_order(lengths: np.ndarray, global_batch_size: int, seed: int, epoch: int,
                         group_batches: int) -> np.ndarray:
  """Epoch `epoch`'s shuffled examples (epoch_order's, the same set) reordered so
  that each global batch holds examples of similar length.

  The first full batch of the epoch starts f = (-epoch * n) % B rows in (the
  rows before it complete the previous epoch's last batch). From there, runs of
  group_batches * B shuffled examples are sorted by length, cut into batches,
  and the epoch's full batches are shuffled, so long and short batches mix
  over the epoch; the few rows before f and after the last full batch keep
  their shuffled order. A pure function of its arguments.
  """
  n = len(lengths)
  order = epoch_order(n, seed, epoch).astype(np.int64)
  first = min((-epoch * n) % global_batch_size, n)
  full = (n - first) // global_batch_size
  body = order[first:first + full * global_batch_size]
  group = max(group_batches, 1) * global_batch_size
  chunks = []
  for start in range(0, len(body), group):
    run = body[start:start + group]
    run = run[np.argsort(lengths[run], kind="stable")]
    chunks.extend(np.split(run, len(run) // global_batch_size))
  rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % 2**64, epoch, 1])))
  shuffled = [chunks[i] for i in rng.permutation(len(chunks))]
  return np.concatenate([order[:first], *shuffled, order[first + len(body):]])


def train_batches(arrays: dict[str, np.ndarray], global_batch_size: int, *, seed: int,
                  start_step: int = 0, num_steps: int, buckets: tuple[int, ...] = (),
                  group_batches: int = 50,
                  process_index: Optional[int] = None, process_count: Optional[int] = None
                  ) -> Iterator[dict[str, np.ndarray]]:
  """Steps [start_step, num_steps) of a stream of shuffled epochs, epoch after epoch.

  Batch s holds positions [s*B, (s+1)*B) of the stream; epoch e is
  epoch_order(n, seed, e) (with buckets, bucketed_epoch_order's reordering of
  it, each batch cut to its bucket length), so a resumed run continues with
  the same rows.
  """
  index, count = process_slot(process_index, process_count, global_batch_size)
  n = len(next(iter(arrays.values())))
  if n == 0:
    raise ValueError("the training split has no examples")
  b = global_batch_size // count
  lengths = example_lengths(arrays) if buckets else None
  orders: dict[int, np.ndarray] = {}
  for step in range(start_step, num_steps):
    pos = step * global_batch_size + np.arange(global_batch_size, dtype=np.int64)
    epochs, within = np.divmod(pos, n)
    rows = np.empty(global_batch_size, np.int64)
    for e in np.unique(epochs):
      if int(e) not in orders:
        orders = {int(e): epoch_order(n, seed, int(e)) if lengths is None else
                  bucketed_epoch_order(lengths, global_batch_size, seed, int(e), group_batches)}
      rows[epochs == e] = orders[int(e)][within[epochs == e]]
    length = None if lengths is None else padded_length(lengths[rows], buckets)
    yield _take(arrays, rows[index * b:(index + 1) * b], length)


def num_eval_batches(num_examples: int, global_batch_size: int) -> int:
  return -(-num_examples // global_batch_size)


def eval_order(arrays: dict[str, np.ndarray], buckets: tuple[int, ...] = ()) -> np.ndarray:
  """The order eval_batches visits the rows in: as they are, or with buckets
  by length (shortest first; equal lengths in their order)."""
  n = len(next(iter(arrays.values())))
  if not buckets:
    return np.arange(n, dtype=np.int64)
  return np.argsort(example_lengths(arrays), kind="stable").astype(np.int64)


def eval_batches(arrays: dict[str, np.ndarray], global_batch_size: int, *,
                 buckets: tuple[int, ...] = (),
                 process_index: Optional[int] = None, process_count: Optional[int] = None
                 ) -> Iterator[dict[str, np.ndarray]]:
  """Every row once, in eval_order; the last global batch is padded with weight-0
  rows. With buckets, each batch is cut to its bucket length. Each row carries
  its example id (EXAMPLE_ID_KEY: its row in `arrays`, -1 for padding)."""
  index, count = process_slot(process_index, process_count, global_batch_size)
  order = eval_order(arrays, buckets)
  n = len(order)
  lengths = example_lengths(arrays) if buckets else None
  b = global_batch_size // count
  for step in range(num_eval_batches(n, global_batch_size)):
    pos = step * global_batch_size + np.arange(global_batch_size, dtype=np.int64)
    rows = np.where(pos < n, order[np.minimum(pos, n - 1)], -1)
    length = None if lengths is None else padded_length(lengths[rows[rows >= 0]], buckets)
    mine = rows[index * b:(index + 1) * b]
    batch = _take(arrays, mine, length)
    batch[EXAMPLE_ID_KEY] = mine.astype(np.int32)
    yield batch


def in_example_order(outputs: list, example_ids: list, num_examples: int):
  """Outputs of evaluation batches -> each output leaf with row i example i's output.

  `outputs[k]` (a pytree of arrays with a leading row axis) and
  `example_ids[k]` are what the predict step returned for batch k. Each row
  goes to the example its id names, whatever its position in the global
  batch; padding rows (id -1) are dropped. Every example of the split must
  come back exactly once.
  """
  import jax  # pylint: disable=g-import-not-at-top
  ids = np.concatenate([np.asarray(i).reshape(-1) for i in example_ids]).astype(np.int64)
  real = ids >= 0
  ids = ids[real]
  counts = np.bincount(ids, minlength=num_examples)
  if len(counts) > num_examples or (counts != 1).any():
    missing = np.flatnonzero(counts[:num_examples] == 0)
    extra = np.flatnonzero(counts > 1)
    raise ValueError(f"evaluation outputs of {num_examples} examples came back with "
                     f"{len(ids)} real rows: examples {missing[:5].tolist()} missing, "
                     f"{extra[:5].tolist()} repeated, ids up to {ids.max(initial=-1)}")

  def place(*parts: np.ndarray) -> np.ndarray:
    rows = np.concatenate(parts)[real]
    out = np.empty_like(rows)
    out[ids] = rows
    return out

  return jax.tree.map(place, *outputs)
