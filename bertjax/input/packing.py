"""Sequence packing: several short examples share one row (Krell et al., 2021).

A parsed batch of examples in the original record layout ([n, L] features,
each example's real tokens first: input_mask 1...1 0...0) becomes a batch of
`rows` packed rows of the same length L. Each row holds up to
`max_examples_per_row` examples one after the other; the model keeps them
apart with:

* packed_example_ids [R, L]: 1, 2, ... for the first, second, ... example of
  the row and 0 for padding. Attention runs only between tokens of the same
  example (not to be confused with segment_ids, the A/B token types, which
  are copied as they are).
* position_ids [R, L]: positions restart at 0 with each example.
* next_sentence_positions [R, K]: where each example's first token ([CLS])
  sits; the next-sentence head reads the pooled output there.
* next_sentence_labels / example_weights [R, K]: one label and one weight
  per packed example, weight 0 for the unused slots.
* masked_lm_positions / _ids / _weights [R, max_predictions_per_row]: every
  prediction of every example of the row, its position moved by the
  example's offset in the row, unused slots weight 0.

So the loss and metric sums of a packed batch are those of the same
examples unpacked. Evaluation (EvalPacker) scores the same examples as
unpacked, so its sums agree; training (TrainPacker) gives a step the
examples of its chunk's steps reordered, and leaves out (and counts) the
ones that fit in no row.

Layout: first-fit decreasing (first_fit): by decreasing length, each
example goes into the first row with room for its tokens, its predictions
and one more example; by token length alone this needs within 11/9 of the
fewest rows plus one. Krell et al.'s SPFHP is a best-fit decreasing over a
length histogram of the whole dataset; first-fit decreasing over each chunk
comes close to it without a pass over the data. Training fills a fixed
number of rows per chunk; evaluation places each host's share of its
records at once, into as many rows as they take.
"""

import dataclasses
from typing import Mapping, Optional

from absl import logging
import numpy as np

from bertjax.records import schema

@dataclasses.dataclass(frozen=True)
class Packing:
  """How a host batch is packed: its row count and each row's capacity."""
  max_seq_length: int
  max_predictions_per_seq: int  # Of the records (each example's prediction slots).
  rows: int  # Packed rows per host batch.
  max_examples_per_row: int
  max_predictions_per_row: int

  def __post_init__(self):
    if self.rows < 1:
      raise ValueError(f"packing: rows per host batch must be positive, got {self.rows}; "
                       "lower data.packing_factor or raise the global batch size.")
    if self.max_examples_per_row < 1:
      raise ValueError("data.packing_max_examples_per_row must be at least 1, got "
                       f"{self.max_examples_per_row}")
    problem = predictions_problem(self.max_predictions_per_row, self.max_seq_length,
                                  self.max_predictions_per_seq)
    if problem:
      raise ValueError(problem)


def predictions_problem(per_row: int, max_seq_length: int,
                        max_predictions_per_seq: int) -> Optional[str]:
  """Why `per_row` prediction slots cannot hold packed rows (None if they can)."""
  if per_row < max_predictions_per_seq:
    return (f"data.packing_max_predictions_per_row={per_row} is below the records' "
            f"max_predictions_per_seq={max_predictions_per_seq}: one example's "
            "predictions would not fit in a row; raise it (0 takes "
            "max_predictions_per_seq + max_examples_per_row, at most max_seq_length)")
  if per_row > max_seq_length:
    return (f"data.packing_max_predictions_per_row={per_row} exceeds max_seq_length="
            f"{max_seq_length}: a row has no more positions than that to predict; "
            "lower it or data.packing_max_examples_per_row")
  return None


def default_predictions_per_row(max_examples_per_row: int, max_seq_length: int,
                                max_predictions_per_seq: int) -> int:
  """max_predictions_per_seq + max_examples_per_row, capped at the row's length.

  Records hold about max_predictions_per_seq predictions per max_seq_length
  tokens (a share of each example's tokens, rounded, at least 1), and a row
  holds max_seq_length tokens: its examples' predictions exceed that by
  little more than one per example. The packer counts predictions, so a row
  never takes more than it has slots for; every slot costs a masked-LM
  projection onto the vocabulary in every step.
  """
  return min(max_predictions_per_seq + max_examples_per_row, max_seq_length)


def packed_batch_shapes(p: Packing) -> dict[str, tuple[tuple[int, ...], type]]:
  """Shapes and numpy dtypes of one packed host batch."""
  r, k = p.rows, p.max_examples_per_row
  shapes = schema.batch_shapes(r, p.max_seq_length, p.max_predictions_per_row)
  for name in ("next_sentence_labels", schema.EXAMPLE_WEIGHT_KEY):
    shapes[name] = ((r, k), shapes[name][1])
  shapes["packed_example_ids"] = ((r, p.max_seq_length), np.int32)
  shapes["position_ids"] = ((r, p.max_seq_length), np.int32)
  shapes["next_sentence_positions"] = ((r, k), np.int32)
  return shapes


class NotRightPadded(ValueError):
  """An example whose input_mask is not 1...1 0...0; `example` is its row."""

  def __init__(self, example: int):
    super().__init__("input_mask is not 1...1 0...0 (right padding), and packing moves "
                     "each example's first input_mask.sum() tokens; write the records "
                     "with their real tokens first or set data.packing=False.")
    self.example = example


def example_sizes(batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(tokens [n], predictions [n], real [n] bool) of a parsed unpacked batch.

  Raises NotRightPadded if an example's input_mask is not a run of ones
  followed by zeros (packing moves the first `tokens` tokens).
  """
  mask_NxL = np.asarray(batch["input_mask"]) > 0
  tokens_N = mask_NxL.sum(1)
  prefix_NxL = np.arange(mask_NxL.shape[1])[None, :] < tokens_N[:, None]
  if not np.array_equal(mask_NxL, prefix_NxL):
    raise NotRightPadded(int(np.flatnonzero((mask_NxL != prefix_NxL).any(1))[0]))
  predictions_N = (np.asarray(batch["masked_lm_weights"]) > 0).sum(1)
  real_N = np.asarray(batch[schema.EXAMPLE_WEIGHT_KEY]) > 0
  return tokens_N, predictions_N, real_N


def first_fit(tokens_N: np.ndarray, predictions_N: np.ndarray, real_N: np.ndarray,
              p: Packing, as_needed: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(row [n], offset [n]) of each real example placed first-fit decreasing;
  -1 where an example is not real or fits in no row.

  The real examples go by decreasing tokens (equal ones in their order),
  each into the first row with room for its tokens, its predictions and one
  more example. There are p.rows rows; with as_needed as many as the
  examples take (p.rows is not read), numbered in the order they are
  opened, so rows 0 .. row.max() all hold examples. A pure function of the
  sizes and their order.
  """
  tokens_N = np.asarray(tokens_N, np.int64)
  order = np.flatnonzero(real_N)
  order = order[np.argsort(-tokens_N[order], kind="stable")]
  tokens_O, predictions_O = tokens_N[order], np.asarray(predictions_N, np.int64)[order]
  if as_needed:
    _check_fit(tokens_O, predictions_O, p)
  smallest = (int(tokens_O.min()), int(predictions_O.min())) if len(order) else (0, 0)
  rows = _OpenRows(p, len(order) if as_needed else p.rows, smallest)
  row_O, offset_O = np.full((2, len(order)), -1, np.int64)
  for lo, hi, tokens, predictions in _runs(tokens_O, predictions_O):
    row, offset = rows.place(tokens, predictions, hi - lo)
    row_O[lo:lo + len(row)], offset_O[lo:lo + len(row)] = row, offset
  row_N = np.full(len(real_N), -1, np.int64)
  offset_N = np.full(len(real_N), -1, np.int64)
  row_N[order], offset_N[order] = row_O, offset_O
  return row_N, offset_N


def _runs(tokens_O: np.ndarray, predictions_O: np.ndarray) -> list[tuple[int, int, int, int]]:
  """(lo, hi, tokens, predictions) of each run [lo, hi) of examples of one size."""
  lo = np.flatnonzero(np.diff(tokens_O, prepend=-1) | np.diff(predictions_O, prepend=-1))
  hi = np.append(lo[1:], len(tokens_O))
  return list(zip(lo.tolist(), hi.tolist(), tokens_O[lo].tolist(), predictions_O[lo].tolist()))


_NONE = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # (row, offset) of no example.


class _OpenRows:
  """The rows of a first-fit placement that may still take an example.

  Examples of one size go into the first rows with room, each row taking as
  many as it holds: where one example at a time would go, placed in numpy
  over the rows. Rows are opened in number order, a block at a time as the
  sizes need them, and those with no room for the smallest example are
  dropped from the arrays every few sizes, so the work per size follows the
  rows still open rather than all rows.
  """

  COMPACT_EVERY = 8  # Sizes placed between drops of the full rows.
  OPEN_AT_LEAST = 32  # Empty rows opened at a time.

  def __init__(self, p: Packing, limit: int, smallest: tuple[int, int]):
    self.length, self.limit, self.smallest = p.max_seq_length, limit, smallest
    self.empty = (p.max_seq_length, p.max_predictions_per_row, p.max_examples_per_row)
    self.ids_R = np.zeros(limit, np.int64)  # Each open row's number.
    # Each open row's free tokens, predictions and example slots.
    self.free_R = tuple(np.zeros(limit, np.int32) for _ in range(3))
    self.live = 0  # Open rows: the first `live` of each array.
    self.opened = self.used = 0  # Rows opened; rows that hold an example (a prefix).
    self.sizes = 0  # Sizes placed.

  def place(self, tokens: int, predictions: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(row [k], offset [k]) of the next m examples of one size, the first
    k <= m of them (those that fit)."""
    self._open(m, tokens, predictions)
    if not self.live:  # Every row is full.
      return _NONE
    free_t, free_q, free_s = (f[:self.live] for f in self.free_R)
    room_R = (free_t >= tokens) & (free_q >= predictions) & (free_s > 0)
    if m == 1:  # Where sizes alternate: the first row with room, updated in place.
      i = int(room_R.argmax())
      if not room_R[i]:
        return _NONE
      offset = self.length - int(free_t[i])
      free_t[i] -= tokens
      free_q[i] -= predictions
      free_s[i] -= 1
      return self._placed(self.ids_R[[i]]), np.array([offset])
    # Each row with room takes one or more: the first m of them take all that fit.
    i = np.flatnonzero(room_R)[:m]
    take = free_s[i]
    if tokens:
      np.minimum(take, free_t[i] // tokens, out=take)
    if predictions:
      np.minimum(take, free_q[i] // predictions, out=take)
    last = take.cumsum()  # One past the last example each of those rows takes.
    j = np.arange(min(m, int(last[-1]) if len(i) else 0))
    k = last.searchsorted(j, side="right")  # Each example's row among i.
    offset = self.length - free_t[i[k]] + (j - last[k] + take[k]) * tokens
    n = np.bincount(k, minlength=len(i))
    free_t[i] -= n * tokens
    free_q[i] -= n * predictions
    free_s[i] -= n
    return self._placed(self.ids_R[i[k]]), offset

  def _placed(self, rows: np.ndarray) -> np.ndarray:
    """`rows`, after noting that they hold examples now; every few sizes the
    full rows are dropped."""
    if len(rows):
      self.used = max(self.used, int(rows[-1]) + 1)
    self.sizes += 1
    if self.sizes % self.COMPACT_EVERY == 0:
      self._compact()
    return rows

  def _open(self, m: int, tokens: int, predictions: int) -> None:
    """Opens empty rows, OPEN_AT_LEAST at a time or as many as are left,
    so that the empty open ones hold m examples of one size."""
    if self.opened - self.used >= m or self.opened == self.limit:
      return
    per_row = min(self.empty[2], self.empty[0] // tokens if tokens else m,
                  self.empty[1] // predictions if predictions else m)
    if not per_row:
      return
    wanted = -(-m // per_row) - (self.opened - self.used)
    new = min(self.limit - self.opened, max(wanted, self.OPEN_AT_LEAST))
    if wanted > 0:
      span = slice(self.live, self.live + new)
      self.ids_R[span] = np.arange(self.opened, self.opened + new)
      for f, e in zip(self.free_R, self.empty):
        f[span] = e
      self.opened, self.live = self.opened + new, self.live + new

  def _compact(self) -> None:
    """Drops the open rows with no room for the smallest example."""
    free_t, free_q, free_s = (f[:self.live] for f in self.free_R)
    keep = np.flatnonzero((free_t >= self.smallest[0]) & (free_q >= self.smallest[1])
                          & (free_s > 0))
    for a in (self.ids_R, *self.free_R):
      a[:len(keep)] = a[keep]
    self.live = len(keep)


def _check_fit(tokens_O: np.ndarray, predictions_O: np.ndarray, p: Packing) -> None:
  """Raises ValueError if an example fits in no empty row."""
  too_big = (tokens_O > p.max_seq_length) | (predictions_O > p.max_predictions_per_row)
  if too_big.any():
    i = int(np.argmax(too_big))
    raise ValueError(f"an example of {tokens_O[i]} tokens and {predictions_O[i]} predictions "
                     f"fits in no empty packed row ({p.max_seq_length} tokens, "
                     f"{p.max_predictions_per_row} predictions)")


def pack(batch: Mapping[str, np.ndarray], row_N: np.ndarray, offset_N: np.ndarray,
         p: Packing) -> dict[str, np.ndarray]:
  """The packed batch (see the module docstring) with example i at
  (row_N[i], offset_N[i]); examples with row -1 are left out."""
  shapes = packed_batch_shapes(p)
  out = {name: np.zeros(shape, dtype) for name, (shape, dtype) in shapes.items()}
  tokens_N, _, _ = example_sizes(batch)
  slot_R = np.zeros(p.rows, np.int64)  # examples placed so far in each row
  pred_R = np.zeros(p.rows, np.int64)  # predictions placed so far in each row
  weights_NxP = np.asarray(batch["masked_lm_weights"])
  placed = np.flatnonzero(row_N >= 0)
  for i in placed[np.lexsort((offset_N[placed], row_N[placed]))].tolist():
    r, o, n = int(row_N[i]), int(offset_N[i]), int(tokens_N[i])
    k = int(slot_R[r])
    for name in ("input_ids", "input_mask", "segment_ids"):
      out[name][r, o:o + n] = batch[name][i, :n]
    out["packed_example_ids"][r, o:o + n] = k + 1
    out["position_ids"][r, o:o + n] = np.arange(n)
    out["next_sentence_positions"][r, k] = o
    out["next_sentence_labels"][r, k] = batch["next_sentence_labels"][i]
    out[schema.EXAMPLE_WEIGHT_KEY][r, k] = batch[schema.EXAMPLE_WEIGHT_KEY][i]
    cols = np.flatnonzero(weights_NxP[i] > 0)
    q = int(pred_R[r])
    out["masked_lm_positions"][r, q:q + len(cols)] = batch["masked_lm_positions"][i, cols] + o
    out["masked_lm_ids"][r, q:q + len(cols)] = batch["masked_lm_ids"][i, cols]
    out["masked_lm_weights"][r, q:q + len(cols)] = weights_NxP[i, cols]
    slot_R[r], pred_R[r] = k + 1, q + len(cols)
  return out


def real_token_share(batch: Mapping[str, np.ndarray]) -> float:
  """Real (non-padding) tokens over all token slots of a batch."""
  mask = np.asarray(batch["input_mask"])
  return float((mask > 0).sum()) / mask.size


OPTION_KEYS = ("rows", "max_examples_per_row", "max_predictions_per_row", "chunk_steps")


def from_options(options: Mapping[str, int], *, process_count: int, max_seq_length: int,
                 max_predictions_per_seq: int) -> Packing:
  """A host's Packing from the pipeline's `packing` dict: rows (packed rows
  per global batch), max_examples_per_row (default 3) and
  max_predictions_per_row (0 or absent: default_predictions_per_row);
  chunk_steps is TrainPacker's and not read here."""
  unknown = sorted(set(options) - set(OPTION_KEYS))
  if unknown:
    raise ValueError(f"packing: unknown options {unknown}; known: {list(OPTION_KEYS)}")
  global_rows = int(options.get("rows", 0))
  if global_rows <= 0 or global_rows % process_count:
    raise ValueError(f"packing: {global_rows} packed rows per global batch are not a positive "
                     f"multiple of the {process_count} processes; change data.packing_factor "
                     "or the global batch size.")
  per_row = int(options.get("max_examples_per_row", 3))
  predictions = int(options.get("max_predictions_per_row", 0)) or default_predictions_per_row(
      per_row, max_seq_length, max_predictions_per_seq)
  return Packing(max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq,
                 rows=global_rows // process_count, max_examples_per_row=per_row,
                 max_predictions_per_row=predictions)


class TrainPacker:
  """Packs the examples of `chunk_steps` training steps at a time (first-fit
  decreasing) into chunk_steps x p.rows rows, then hands out p.rows per step.

  Chunk c holds the examples that the unpacked steps c*k .. c*k+k-1 hold
  (k = chunk_steps), so the data order stays a function of (seed, step) and
  resuming at any step reads one chunk. The chunk's rows are shuffled (seeded
  with (seed, c)) before they are split into steps, so that no step gets
  only the longest examples. Over a larger chunk the lengths average out and
  fewer rows are left part-empty. An example that fits in none of the
  chunk's rows is left out: counted in stats()["packing_overflow"] and logged.
  """

  def __init__(self, p: Packing, chunk_steps: int, seed: int):
    if chunk_steps < 1:
      raise ValueError(f"data.packing_chunk_steps must be at least 1, got {chunk_steps}")
    self.p, self.chunk_steps, self.seed, self.overflow = p, chunk_steps, seed, 0
    self._chunk = dataclasses.replace(p, rows=p.rows * chunk_steps)

  def __call__(self, chunk: int, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The packed rows of chunk `chunk` ([chunk_steps x rows, ...]), in step order."""
    tokens_N, predictions_N, real_N = example_sizes(batch)
    row_N, offset_N = first_fit(tokens_N, predictions_N, real_N, self._chunk)
    left = int((real_N & (row_N < 0)).sum())
    if left:
      self.overflow += left
      logging.warning("steps %d-%d: %d of %d examples fit in none of the %d packed rows and "
                      "are left out (packing_overflow); lower data.packing_factor or raise "
                      "data.packing_chunk_steps.", chunk * self.chunk_steps,
                      (chunk + 1) * self.chunk_steps - 1, left, int(real_N.sum()),
                      self._chunk.rows)
    shuffle = np.random.default_rng([self.seed % 2**32, chunk]).permutation(self._chunk.rows)
    row_N = np.where(row_N >= 0, np.argsort(shuffle)[np.maximum(row_N, 0)], -1)
    return pack(batch, row_N, offset_N, self._chunk)

  def steps(self, packed: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A chunk's packed rows split into its steps' batches."""
    r = self.p.rows
    return [{k: v[i * r:(i + 1) * r] for k, v in packed.items()}
            for i in range(self.chunk_steps)]

  def stats(self) -> dict[str, int]:
    return {"packing_overflow": self.overflow}


class EvalPacker:
  """One host's packed evaluation batches, from one plan over its share of
  the records (first_fit into as many rows as they take).

  The share is records [first_record, first_record + n) and tokens_N,
  predictions_N, real_N are their sizes. Batch `step` is rows
  [step*R, (step+1)*R) of the plan (R = p.rows); rows(step) gives the
  records placed there (-1 padding to R*K slots) and __call__ packs them
  where the plan put them. Past this host's num_batches, ceil(rows / R),
  a batch holds no record: all its rows have weight 0.
  """

  def __init__(self, p: Packing, tokens_N, predictions_N, real_N, first_record: int = 0):
    self.p = p
    row_N, offset_N = first_fit(tokens_N, predictions_N, real_N, p, as_needed=True)
    self.num_batches = -(-(int(row_N.max(initial=-1)) + 1) // p.rows)
    placed = np.flatnonzero(row_N >= 0)
    placed = placed[np.argsort(row_N[placed], kind="stable")]  # By batch.
    self._records = placed + first_record
    self._batch, self._rows = np.divmod(row_N[placed], p.rows)
    self._offsets = offset_N[placed]

  @property
  def slots(self) -> int:
    """Records read per host batch (the most that R rows can hold)."""
    return self.p.rows * self.p.max_examples_per_row

  def placement(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(record [slots], row [slots], offset [slots]) of this host's batch
    `step`: each record's row among this host's R and its first token there;
    -1 in the slots past the batch's records."""
    lo, hi = np.searchsorted(self._batch, [step, step + 1])
    pad = np.full(self.slots - (hi - lo), -1, np.int64)
    return tuple(np.concatenate([v[lo:hi], pad])
                 for v in (self._records, self._rows, self._offsets))

  def rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(record indices [slots], epochs [slots]) of this host's batch `step`."""
    return self.placement(step)[0], np.zeros(self.slots, np.int64)

  def __call__(self, step: int, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    _, rows, offsets = self.placement(step)
    return pack(batch, rows, offsets, self.p)
