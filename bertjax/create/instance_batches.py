"""The paper's instances in numpy batches: the creation driver's fast path.

`pass_spans` runs instances.instance_spans for every document of a chunk at
once and gives each instance as token ranges of its documents; `assemble_pairs` builds the [CLS] A [SEP] B [SEP] rows of a batch
of them and `mask_arrays` masks the rows (the 80/10/10 replacement of the
original, drawn per batch); records.ExampleEncoder serialises the rows of
the resulting `MaskedBatch`. Whole-word masking takes the scalar path
(instances.create_instances_from_document) instead.
"""

import dataclasses

import numpy as np

from bertjax.create import instances
from bertjax.records import masking
from bertjax.text import ragged

# pass_spans' rounds take every document at once while at least this many
# have chunks left: a round's fixed cost is about that of 50 instances made
# one at a time (0.2 ms against 4 us each, on the creation benchmark's corpus).
_LOCKSTEP_MIN = 64


def pass_spans(sentence_starts: np.ndarray, first_sentence: np.ndarray,
               max_seq_length: int, short_seq_prob: float,
               gen: np.random.Generator) -> np.ndarray:
  """`instances.instance_spans` for every document at once: one dupe pass.

  `sentence_starts` holds the token offsets of every sentence back to back
  (0, len(s0), ..., total; no empty sentence) and first_sentence[d] the index
  of document d's first sentence (the last entry: the number of sentences).
  The algorithm is instance_spans' step for step (the chunk grows to the
  target length, A ends at a random sentence, B is the rest or, half the
  time or when the chunk is one sentence, a random other document's
  sentences from a random one on, whose unused sentences go back; then
  truncate_seq_pair), run in lockstep: each round takes the next chunk of
  every document that has one, its random numbers drawn for all of them
  from `gen`. Once fewer than _LOCKSTEP_MIN documents have chunks left (the
  longest few, where a round costs more than their instances), instance_spans
  finishes them one at a time with a FastRng seeded from `gen`. The draws
  differ from the scalar path's; their distributions are the same. Returns
  the spans as rows of instance_spans' 7 columns (offsets within each
  document), document by document in order.
  """
  starts = np.asarray(sentence_starts, np.int64)
  first = np.asarray(first_sentence, np.int64)
  num_docs = len(first) - 1
  max_num_tokens = max_seq_length - 3
  last = first[1:] - 1  # Each document's last sentence.
  doc_token = starts[first[:-1]]
  target = np.full(num_docs, max_num_tokens, np.int64)
  short = np.flatnonzero(gen.random(num_docs) < short_seq_prob)
  target[short] = _randint(gen, 2, np.full(len(short), max_num_tokens))
  chunk_start = first[:-1].copy()
  docs = np.flatnonzero(chunk_start <= last)
  rounds = []
  while len(docs) >= _LOCKSTEP_MIN:
    n = len(docs)
    c, t = chunk_start[docs], target[docs]
    # The chunk: sentences c..i, to the first that reaches the target.
    i = np.minimum(_first_reaching(starts, starts[c] + t, c + 1) - 1, last[docs])
    chunk_len = i - c + 1
    a_end = _randint(gen, 1, np.maximum(chunk_len - 1, 1))
    a_lo, a_hi = starts[c], starts[c + a_end]
    random_next = (chunk_len == 1) | (gen.random(n) < 0.5)
    b_doc, b_lo, b_hi = docs.copy(), a_hi, starts[i + 1]
    r = np.flatnonzero(random_next)
    if len(r):
      other = _other_documents(docs[r], num_docs, gen)
      j = _randint(gen, first[other], last[other])
      b_lo, b_hi = b_lo.copy(), b_hi.copy()
      b_lo[r] = starts[j]
      j_end = np.minimum(
          _first_reaching(starts, starts[j] + t[r] - (a_hi[r] - a_lo[r]), j + 1) - 1,
          last[other])
      b_hi[r] = starts[j_end + 1]
      b_doc[r] = other
      i[r] -= chunk_len[r] - a_end[r]  # The sentences after A go back.
    ta_lo, ta_hi, tb_lo, tb_hi = truncate_bounds(a_hi - a_lo, b_hi - b_lo,
                                                 max_num_tokens, gen)
    a_base = a_lo - doc_token[docs]
    b_base = b_lo - doc_token[b_doc]
    rounds.append(np.stack([docs, a_base + ta_lo, a_base + ta_hi, b_doc, b_base + tb_lo,
                            b_base + tb_hi, random_next], axis=1))
    chunk_start[docs] = i + 1
    docs = docs[i + 1 <= last[docs]]
  if len(docs):
    offsets = _DocumentOffsets(starts, first)
    rng = instances.FastRng(gen.integers(0, 2**32, 4).tolist())
    rounds.append(np.asarray(
        [span for d in docs.tolist() for span in instances.instance_spans(
            offsets, d, max_seq_length, short_seq_prob, rng,
            chunk_start=int(chunk_start[d] - first[d]), target_seq_length=int(target[d]))],
        np.int64).reshape(-1, 7))
  if not rounds:
    return np.zeros((0, 7), np.int64)
  spans = np.concatenate(rounds)
  return spans[np.argsort(spans[:, 0], kind="stable")]


class _DocumentOffsets:
  """instance_spans' doc_offsets of every document, made when first asked."""

  def __init__(self, starts: np.ndarray, first: np.ndarray):
    self._starts, self._first, self._made = starts, first, {}

  def __len__(self) -> int:
    return len(self._first) - 1

  def __getitem__(self, d: int) -> list[int]:
    got = self._made.get(d)
    if got is None:
      s = self._starts[self._first[d]:self._first[d + 1] + 1]
      got = self._made[d] = (s - s[0]).tolist()
    return got


def _randint(gen: np.random.Generator, low, high) -> np.ndarray:
  """Uniform integers in [low, high] (arrays), as FastRng.randint."""
  high = np.asarray(high, np.int64)
  return low + (gen.random(high.shape) * (high - low + 1)).astype(np.int64)


def _first_reaching(starts: np.ndarray, value: np.ndarray, lo: np.ndarray) -> np.ndarray:
  """bisect.bisect_left(starts, value, lo) for arrays."""
  return np.maximum(np.searchsorted(starts, value, "left"), lo)


def _other_documents(docs: np.ndarray, num_docs: int, gen: np.random.Generator):
  """Random-next documents, as instances._random_next_segment draws them: up
  to ten uniform draws until one is not the document itself, else the next
  document."""
  other = _randint(gen, 0, np.full(len(docs), num_docs - 1))
  for _ in range(9):
    same = np.flatnonzero(other == docs)
    if not len(same):
      break
    other[same] = _randint(gen, 0, np.full(len(same), num_docs - 1))
  if num_docs > 1:
    same = other == docs
    other[same] = (docs[same] + 1) % num_docs
  return other


def truncate_bounds(len_a: np.ndarray, len_b: np.ndarray, max_num_tokens: int,
                    gen: np.random.Generator):
  """instances._truncate_bounds (FastRng's way) for arrays of lengths:
  (a_lo, a_hi, b_lo, b_hi). How many tokens each side loses follows the
  original's rule (the longer side, B on ties); the number taken from the
  front is Binomial(k, 1/2)."""
  excess = np.maximum(len_a + len_b - max_num_tokens, 0)
  a_longer = len_a > len_b
  # First the longer side down to the other's length (A to B's, or B to one
  # below A's), then alternately, starting with B if A went first.
  first = np.minimum(excess, np.where(a_longer, len_a - len_b, len_b - len_a + 1))
  rest = excess - first
  k_a = np.where(a_longer, first + rest // 2, (rest + 1) // 2)
  k_b = np.where(a_longer, (rest + 1) // 2, first + rest // 2)
  a_front, b_front = gen.binomial(k_a, 0.5), gen.binomial(k_b, 0.5)
  return a_front, len_a - (k_a - a_front), b_front, len_b - (k_b - b_front)


def assemble_pairs(spans_Nx7: np.ndarray, tokens: np.ndarray, doc_starts: np.ndarray,
                   max_seq_length: int, vocab: instances.VocabInfo):
  """[CLS] A [SEP] B [SEP] rows of `instance_spans` tuples, in numpy.

  `tokens` holds every document's tokens back to back and doc_starts[d] is
  where document d begins. Returns (ids_BxL zero-padded, lengths_B, num_a_B,
  is_random_next_B).
  """
  s = spans_Nx7
  B = len(s)
  num_a, num_b = s[:, 2] - s[:, 1], s[:, 5] - s[:, 4]
  lengths = num_a + num_b + 3
  # A and B of every row as runs of `tokens`, copied to their columns.
  src = np.stack([doc_starts[s[:, 0]] + s[:, 1],
                  doc_starts[s[:, 3]] + s[:, 4]], axis=1).ravel()
  row = np.arange(B) * max_seq_length
  dst = np.stack([row + 1, row + num_a + 2], axis=1).ravel()
  counts = np.stack([num_a, num_b], axis=1).ravel()
  ids = np.zeros(B * max_seq_length, tokens.dtype)
  ids[ragged.ranges(dst, counts)] = tokens[ragged.ranges(src, counts)]
  ids = ids.reshape(B, max_seq_length)
  ids[:, 0] = vocab.cls_id
  rows = np.arange(B)
  ids[rows, num_a + 1] = vocab.sep_id
  ids[rows, lengths - 1] = vocab.sep_id
  return ids, lengths, num_a, s[:, 6].astype(bool)


@dataclasses.dataclass
class MaskedBatch:
  """Instances as padded arrays (B instances, L = max_seq_length, P = max pred).

  Rows are the records' features before padding is counted: `input_ids_BxL`
  is masked and zero-padded, the first `num_a_B + 2` tokens are segment 0,
  positions are ascending in each row, and `num_predictions_B` of the P
  prediction slots are used.
  """
  input_ids_BxL: np.ndarray
  lengths_B: np.ndarray
  num_a_B: np.ndarray
  masked_lm_positions_BxP: np.ndarray
  masked_lm_ids_BxP: np.ndarray
  num_predictions_B: np.ndarray
  is_random_next_B: np.ndarray

  def __len__(self):
    return len(self.lengths_B)

  def take(self, rows: np.ndarray) -> "MaskedBatch":
    """The batch of the given rows, in that order."""
    return MaskedBatch(*(getattr(self, f.name)[rows]
                         for f in dataclasses.fields(self)))


def mask_arrays(ids: np.ndarray, lengths: np.ndarray, num_a: np.ndarray,
                is_random_next: np.ndarray, masked_lm_prob: float,
                max_predictions_per_seq: int, vocab: instances.VocabInfo,
                gen: np.random.Generator) -> MaskedBatch:
  """`mask_tokens` for a batch of zero-padded [CLS] A [SEP] B [SEP] rows.

  The same masking as the original (records/masking.py), drawn differently:
  each row's masking.num_predictions positions are a uniformly random subset
  of its candidates (every position but [CLS] and the two [SEP]s), drawn
  with Floyd's algorithm for all rows at once, and two uniforms per chosen
  position make the 80/10/10 draw (masking.replacements). Not for
  whole-word masking (use `mask_tokens`).
  """
  (B, L), P = ids.shape, max_predictions_per_seq
  num_cand = lengths - 3
  k = masking.num_predictions(lengths, masked_lm_prob, P, num_cand)
  # Floyd: for j = c - k, ..., c - 1 take t uniform in [0, j], or j itself if
  # t is taken already; the result is a uniform k-subset of [0, c).
  u = gen.random((B, P))
  chosen = np.full((B, P), L, np.int64)
  taken = np.zeros((B, L + 1), bool)  # Column L: rows with nothing to draw.
  rows = np.arange(B)
  for i in range(P):
    active = i < k
    j = num_cand - k + i
    t = np.where(active, (u[:, i] * (j + 1)).astype(np.int64), L)
    pick = np.where(active & taken[rows, t], j, t)
    taken[rows, pick] = True
    chosen[:, i] = pick
  # Candidate t is column t + 1 in A and t + 2 in B.
  used = chosen < L
  positions = np.sort(np.where(used, chosen + 1 + (chosen >= num_a[:, None]),
                               L), axis=1)
  masked, positions, labels = _replace_chosen(ids, positions, vocab, gen)
  return MaskedBatch(masked, lengths, num_a, positions, labels, k,
                     is_random_next)


def _replace_chosen(ids, positions, vocab, gen):
  """The 80/10/10 draw at the chosen positions (ascending per row, L where
  unused): (masked ids, positions with 0 where unused, original ids there)."""
  (B, L), P = ids.shape, positions.shape[1]
  used = positions < L
  positions = np.where(used, positions, 0)
  at = positions + (np.arange(B) * L)[:, None]  # Places in the flat rows.
  labels = np.where(used, np.take(ids, at), 0)
  kind = masking.replacements(gen.random((B, P)), gen.random((B, P)))
  to_mask = used & (kind == masking.MASK)
  to_random = used & (kind == masking.RANDOM)
  masked = ids.copy()
  flat = masked.reshape(-1)
  flat[np.compress(to_mask.ravel(), at)] = vocab.mask_id
  replacement = vocab.replacement_array
  flat[np.compress(to_random.ravel(), at)] = replacement[
      gen.integers(0, len(replacement), int(to_random.sum()))]
  return masked, positions, labels


def full_sentence_rows(chunk, max_seq_length: int, vocab: instances.VocabInfo,
                       rng) -> list[list[int]]:
  """[CLS] text [SEP] rows of contiguous sentences (RoBERTa's FULL-SENTENCES).

  The chunk's documents (mapper.TokenizedChunk) in an order drawn from `rng`,
  a [SEP] between consecutive documents, cut into rows of whole sentences
  filled up to max_seq_length: a row ends before the sentence that would not
  fit, and a sentence longer than a whole row is truncated to one. A row
  neither begins nor ends with a document's [SEP].
  """
  budget = max_seq_length - 2
  tokens = chunk.tokens.tolist()
  starts = chunk.sentence_starts.tolist()
  first = chunk.first_sentence.tolist()
  order = list(range(len(chunk)))
  rng.shuffle(order)
  rows, row = [], []

  def flush():
    while row and row[-1] == vocab.sep_id:
      row.pop()
    if row:
      rows.append([vocab.cls_id] + row + [vocab.sep_id])
    row.clear()

  for d in order:
    if row:
      row.append(vocab.sep_id)
    for s in range(first[d], first[d + 1]):
      sentence = tokens[starts[s]:starts[s + 1]][:budget]
      if len(row) + len(sentence) > budget:
        flush()
      row.extend(sentence)
  flush()
  return rows


def pad_rows(rows: list[list[int]], max_seq_length: int):
  """Rows of ids -> (ids_BxL zero-padded, lengths_B)."""
  lengths = np.fromiter(map(len, rows), np.int64, len(rows))
  ids = np.zeros((len(rows), max_seq_length), np.int64)
  ids[np.arange(max_seq_length)[None, :] < lengths[:, None]] = np.concatenate(
      [np.asarray(r, np.int64) for r in rows]) if rows else []
  return ids, lengths


def mask_single_segment(ids: np.ndarray, lengths: np.ndarray, masked_lm_prob: float,
                        max_predictions_per_seq: int, vocab: instances.VocabInfo,
                        gen: np.random.Generator) -> MaskedBatch:
  """The masked-LM rule (records/masking.py) on one-segment [CLS] text [SEP]
  rows, whose candidates are every position but [CLS] and the [SEP]s; each
  row's masking.num_predictions positions are the candidates of the smallest
  uniform draws. masked_lm_prob 0 leaves the rows unmasked (no predictions).
  The whole row is segment 0 (num_a = length - 2)."""
  (B, L), P = ids.shape, max_predictions_per_seq
  real = np.arange(L)[None, :] < lengths[:, None]
  cand = real & (ids != vocab.cls_id) & (ids != vocab.sep_id)
  if masked_lm_prob > 0:
    k = masking.num_predictions(lengths, masked_lm_prob, P, cand.sum(1))
  else:
    k = np.zeros(B, np.int64)
  u = np.where(cand, gen.random((B, L)), 2.0)
  chosen = np.argsort(u, axis=1, kind="stable")[:, :P]
  used = np.arange(P)[None, :] < k[:, None]
  positions = np.sort(np.where(used, chosen, L), axis=1)
  masked, positions, labels = _replace_chosen(ids, positions, vocab, gen)
  return MaskedBatch(masked, lengths, lengths - 2, positions, labels, k,
                     np.zeros(B, bool))
