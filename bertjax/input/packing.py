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
* next_sentence_labels / next_sentence_weights [R, K]: one label per packed
  pair, weight 0 for the unused slots.
* masked_lm_positions / _ids / _weights [R, max_predictions_per_row]: every
  prediction of every example of the row, its position moved by the
  example's offset in the row, unused slots weight 0.

So every loss and metric is the unpacked one over the same examples.

Layout: first-fit (an example goes into the first row with room for its
tokens, its predictions and one more example), in the given order or by
decreasing length (first-fit decreasing, within 11/9 of the fewest rows
plus one). Krell et al.'s SPFHP is a best-fit decreasing over a length
histogram of the whole dataset; first-fit decreasing over each batch comes
close to it without a pass over the data.
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
            "max_examples_per_row x max_predictions_per_seq, at most max_seq_length)")
  if per_row > max_seq_length:
    return (f"data.packing_max_predictions_per_row={per_row} exceeds max_seq_length="
            f"{max_seq_length}: a row has no more positions than that to predict; "
            "lower it or data.packing_max_examples_per_row")
  return None


def default_predictions_per_row(max_examples_per_row: int, max_seq_length: int,
                                max_predictions_per_seq: int) -> int:
  """Room for every prediction of max_examples_per_row examples, capped at the
  row's length."""
  return min(max_examples_per_row * max_predictions_per_seq, max_seq_length)


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


def example_sizes(batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(tokens [n], predictions [n], real [n] bool) of a parsed unpacked batch.

  Raises ValueError if an example's input_mask is not a run of ones followed
  by zeros (packing moves the first `tokens` tokens).
  """
  mask_NxL = np.asarray(batch["input_mask"]) > 0
  tokens_N = mask_NxL.sum(1)
  prefix_NxL = np.arange(mask_NxL.shape[1])[None, :] < tokens_N[:, None]
  if not np.array_equal(mask_NxL, prefix_NxL):
    bad = int(np.flatnonzero((mask_NxL != prefix_NxL).any(1))[0])
    raise ValueError(f"input_mask of example {bad} in the batch is not 1...1 0...0 (right "
                     "padding); packing needs each example's real tokens first.")
  predictions_N = (np.asarray(batch["masked_lm_weights"]) > 0).sum(1)
  real_N = np.asarray(batch[schema.EXAMPLE_WEIGHT_KEY]) > 0
  return tokens_N, predictions_N, real_N


def first_fit(tokens_N: np.ndarray, predictions_N: np.ndarray, real_N: np.ndarray,
              p: Packing, decreasing: bool) -> tuple[np.ndarray, np.ndarray]:
  """(row [n], offset [n]) of each example in p.rows rows; -1 where an example
  is not real or fits in no row."""
  n = len(tokens_N)
  row_N = np.full(n, -1, np.int64)
  offset_N = np.full(n, -1, np.int64)
  free_tokens_R = np.full(p.rows, p.max_seq_length, np.int64)
  free_preds_R = np.full(p.rows, p.max_predictions_per_row, np.int64)
  free_slots_R = np.full(p.rows, p.max_examples_per_row, np.int64)
  order = np.flatnonzero(real_N)
  if decreasing:
    order = order[np.argsort(-tokens_N[order], kind="stable")]
  for i in order.tolist():
    fits_R = ((free_tokens_R >= tokens_N[i]) & (free_preds_R >= predictions_N[i])
              & (free_slots_R > 0))
    r = int(np.argmax(fits_R))
    if not fits_R[r]:
      continue
    row_N[i], offset_N[i] = r, p.max_seq_length - free_tokens_R[r]
    free_tokens_R[r] -= tokens_N[i]
    free_preds_R[r] -= predictions_N[i]
    free_slots_R[r] -= 1
  return row_N, offset_N


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


OPTION_KEYS = ("rows", "max_examples_per_row", "max_predictions_per_row")


def from_options(options: Mapping[str, int], *, process_count: int, max_seq_length: int,
                 max_predictions_per_seq: int) -> Packing:
  """A host's Packing from the pipeline's `packing` dict: rows (packed rows
  per global batch), max_examples_per_row (default 3) and
  max_predictions_per_row (0 or absent: default_predictions_per_row)."""
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
  """Packs each training step's examples into p.rows rows by first-fit decreasing.

  The step's examples are those of the unpacked batch at the same step, so
  the data order stays a function of (seed, step). An example that fits in
  no row (the rows are too few for that step's lengths) is left out of the
  step: counted in stats()["packing_overflow"] and logged.
  """

  def __init__(self, p: Packing):
    self.p, self.overflow = p, 0

  def __call__(self, step: int, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens_N, predictions_N, real_N = example_sizes(batch)
    row_N, offset_N = first_fit(tokens_N, predictions_N, real_N, self.p, decreasing=True)
    left = int((real_N & (row_N < 0)).sum())
    if left:
      self.overflow += left
      logging.warning("step %d: %d of %d examples fit in none of the %d packed rows and are "
                      "left out of the step (packing_overflow); lower data.packing_factor.",
                      step, left, int(real_N.sum()), self.p.rows)
    return pack(batch, row_N, offset_N, self.p)

  def stats(self) -> dict[str, int]:
    return {"packing_overflow": self.overflow}


def sequential_plan(tokens_N: np.ndarray, predictions_N: np.ndarray, real_N: np.ndarray,
                    p: Packing) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(batch [n], row [n], offset [n]): the examples in order, first-fit into
  batches of p.rows rows; a batch closes when the next example fits in none
  of its rows. Every real example is placed exactly once; others get -1."""
  n = len(tokens_N)
  batch_N = np.full(n, -1, np.int64)
  row_N = np.full(n, -1, np.int64)
  offset_N = np.full(n, -1, np.int64)
  empty = lambda: (np.full(p.rows, p.max_seq_length, np.int64),
                   np.full(p.rows, p.max_predictions_per_row, np.int64),
                   np.full(p.rows, p.max_examples_per_row, np.int64))
  g, (tokens_R, preds_R, slots_R), used = 0, empty(), False
  for i in np.flatnonzero(real_N).tolist():
    fits = lambda: (tokens_R >= tokens_N[i]) & (preds_R >= predictions_N[i]) & (slots_R > 0)
    fits_R = fits()
    if not fits_R.any():
      if not used:
        raise ValueError(f"example {i} ({tokens_N[i]} tokens, {predictions_N[i]} "
                         "predictions) fits in no empty packed row")
      g, (tokens_R, preds_R, slots_R), used = g + 1, empty(), False
      fits_R = fits()
    r = int(np.argmax(fits_R))
    batch_N[i], row_N[i] = g, r
    offset_N[i] = p.max_seq_length - tokens_R[r]
    tokens_R[r] -= tokens_N[i]
    preds_R[r] -= predictions_N[i]
    slots_R[r] -= 1
    used = True
  return batch_N, row_N, offset_N


class EvalPacker:
  """Evaluation batches packed by a plan over all the examples (sequential_plan).

  Host h of P takes rows [h*R, (h+1)*R) of every global batch of P*R rows;
  rows(step) gives the records of this host's rows (-1 padding to R*K
  slots) and __call__ packs them where the plan put them.
  """

  def __init__(self, p: Packing, tokens_N, predictions_N, real_N, process_index: int,
               process_count: int, max_batches: Optional[int] = None):
    self.p = p
    global_p = dataclasses.replace(p, rows=p.rows * process_count)
    batch_N, row_N, offset_N = sequential_plan(tokens_N, predictions_N, real_N, global_p)
    self.num_batches = int(batch_N.max()) + 1 if (batch_N >= 0).any() else 0
    if max_batches is not None:
      self.num_batches = min(self.num_batches, max_batches)
    mine = np.flatnonzero((batch_N >= 0) & (row_N // p.rows == process_index))
    self._records, self._rows, self._offsets = {}, {}, {}
    slots = p.rows * p.max_examples_per_row
    for g in range(self.num_batches):
      idx = mine[batch_N[mine] == g]
      self._records[g] = np.concatenate([idx, np.full(slots - len(idx), -1, np.int64)])
      self._rows[g] = np.concatenate([row_N[idx] - process_index * p.rows,
                                      np.full(slots - len(idx), -1, np.int64)])
      self._offsets[g] = np.concatenate([offset_N[idx], np.full(slots - len(idx), -1, np.int64)])

  @property
  def slots(self) -> int:
    """Records read per host batch (the most that R rows can hold)."""
    return self.p.rows * self.p.max_examples_per_row

  def rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(record indices [slots], epochs [slots]) of this host's batch `step`."""
    return self._records[step], np.zeros(self.slots, np.int64)

  def __call__(self, step: int, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return pack(batch, self._rows[step], self._offsets[step], self.p)
