"""The paper's pretraining instances (NSP sentence pairs + MLM masking) on ids.

This is the algorithm of the original BERT release's
`create_pretraining_data.py` (`create_instances_from_document`,
`create_masked_lm_predictions`, `truncate_seq_pair`), written on token ids
instead of token strings. Given a `random.Random` in the same state it draws
the same random numbers in the same order as the original and so produces the
same instances (tests/test_instances.py checks this against a port of the
original). Two deliberate, documented differences:

* Random replacement tokens (the 10% "random word" case) are drawn from the
  non-special ids (`VocabInfo.replacement_ids`, in id order) instead of the
  whole vocab, so [PAD]/[CLS]/[SEP]/[MASK]/[UNK] are never injected into the
  input. Passing the non-special tokens as the original's `vocab_words`
  reproduces the same draws.
* If after the original's ten tries the "random next" document is still the
  document itself (probability (1/n)^10 for n documents), the next document
  is used, so segment B of a random-next pair never comes from the same
  document when there are at least two. This draws no extra random number.

Candidates for masking exclude the [CLS]/[SEP] positions (the original
excludes the [CLS]/[SEP] strings; the driver keeps special ids out of document
text so the two agree). Whole-word masking groups a piece that is not a word
start (`is_word_start[id]` False, i.e. a WordPiece "##x" or a SentencePiece
piece without the "▁" prefix) with the previous candidate, like the
original's "##" test.

`FastRng` is the generator the driver uses: a `random.Random` whose
`shuffle` runs in numpy (the original's Python shuffle of ~125 candidates per
instance is the single largest cost). The algorithm code is the same for both.
"""

import bisect
import dataclasses
import itertools
import random
from typing import Optional, Sequence

import numpy as np

from bertjax.records import masking


@dataclasses.dataclass(frozen=True)
class VocabInfo:
  """What instance creation needs to know about the vocabulary."""
  vocab_size: int
  cls_id: int
  sep_id: int
  mask_id: int
  pad_id: int
  # Ids a masked token may be replaced with (all non-special ids, ascending).
  replacement_ids: tuple[int, ...]
  # is_word_start[id]; only used for whole-word masking.
  is_word_start: Optional[tuple[bool, ...]] = None

  @property
  def replacement_array(self) -> np.ndarray:
    cached = self.__dict__.get("_replacement_array")
    if cached is None:
      cached = np.asarray(self.replacement_ids, np.int64)
      object.__setattr__(self, "_replacement_array", cached)
    return cached

  @classmethod
  def from_tokenizer(cls, tokenizer) -> "VocabInfo":
    """Builds the info from a `tokenization.Tokenizer`."""
    special = tokenizer.special_ids
    return cls.create(tokenizer.vocab_size, special,
                      np.asarray(tokenizer.is_word_start, dtype=bool))

  @classmethod
  def create(cls, vocab_size: int, special_ids: dict[str, int],
             is_word_start: Optional[Sequence[bool]] = None) -> "VocabInfo":
    missing = sorted({"pad", "unk", "cls", "sep", "mask"} - set(special_ids))
    if missing:
      raise ValueError(f"special_ids lacks {missing}; the vocab needs "
                       "[PAD] [UNK] [CLS] [SEP] [MASK].")
    special = set(special_ids.values())
    replacement = tuple(i for i in range(vocab_size) if i not in special)
    if not replacement:
      raise ValueError("The vocab has no non-special tokens.")
    starts = None
    if is_word_start is not None:
      starts = tuple(bool(x) for x in is_word_start)
      if len(starts) != vocab_size:
        raise ValueError(f"is_word_start has {len(starts)} entries for a vocab "
                         f"of {vocab_size}.")
    return cls(vocab_size=vocab_size, cls_id=special_ids["cls"],
               sep_id=special_ids["sep"], mask_id=special_ids["mask"],
               pad_id=special_ids["pad"], replacement_ids=replacement,
               is_word_start=starts)


class Instance:
  """One pre-masked sentence pair: [CLS] A [SEP] B [SEP].

  `input_ids` is the masked sequence without padding; the first `num_a + 2`
  tokens are segment 0 and the rest segment 1. `masked_lm_positions` is
  ascending and `masked_lm_ids` holds the original ids there.
  """
  __slots__ = ("input_ids", "num_a", "masked_lm_positions", "masked_lm_ids",
               "is_random_next")

  def __init__(self, input_ids, num_a, masked_lm_positions, masked_lm_ids,
               is_random_next):
    self.input_ids = input_ids
    self.num_a = num_a
    self.masked_lm_positions = masked_lm_positions
    self.masked_lm_ids = masked_lm_ids
    self.is_random_next = is_random_next

  @property
  def segment_ids(self) -> list[int]:
    n = len(self.input_ids)
    return [0] * (self.num_a + 2) + [1] * (n - self.num_a - 2)

  def __repr__(self):
    return (f"Instance(input_ids={self.input_ids}, num_a={self.num_a}, "
            f"masked_lm_positions={self.masked_lm_positions}, "
            f"masked_lm_ids={self.masked_lm_ids}, "
            f"is_random_next={self.is_random_next})")


class FastRng(random.Random):
  """`random.Random` seeded from integers, with a numpy `shuffle`.

  Deterministic in `entropy` (e.g. (seed, input shard, chunk, dupe pass)).
  `random()` is Python's Mersenne Twister and `randint(a, b)` is
  `a + int(random() * (b - a + 1))`; `shuffle` and `generator` draw from a
  numpy PCG64 stream seeded from the same entropy.
  """

  def __init__(self, entropy: Sequence[int]):
    seq = np.random.SeedSequence([int(x) for x in entropy])
    words = seq.generate_state(4, np.uint64)
    super().__init__(int.from_bytes(words[:2].tobytes(), "little"))
    self._np = np.random.Generator(np.random.PCG64(int.from_bytes(
        words[2:].tobytes(), "little")))

  @property
  def generator(self) -> np.random.Generator:
    """The numpy generator (for instance_batches.mask_arrays)."""
    return self._np

  def shuffle(self, x):  # pylint: disable=arguments-differ
    self._np.shuffle(x)

  def randint(self, a: int, b: int) -> int:
    # Uniform up to float resolution (2**-53); faster than randrange.
    return a + int(self.random() * (b - a + 1))

  def count_heads(self, k: int) -> int:
    """Heads in k fair coin flips (Binomial(k, 1/2))."""
    return self.getrandbits(k).bit_count() if k > 0 else 0


def _truncate_bounds(len_a: int, len_b: int, max_num_tokens: int, rng):
  """The original's `truncate_seq_pair` on lengths: (a_lo, a_hi, b_lo, b_hi).

  Which list loses each token depends only on the lengths (the longer one,
  B on ties); only front/back is random. A generator with `count_heads(k)`
  (FastRng) draws the number of front removals of each list at once, which
  has the same distribution; any other draws one `random()` per removal in
  the original order.
  """
  excess = len_a + len_b - max_num_tokens
  if excess <= 0:
    return 0, len_a, 0, len_b
  count_heads = getattr(rng, "count_heads", None)
  if count_heads is not None:
    la, lb, ka, kb, e = len_a, len_b, 0, 0, excess
    if la > lb:
      d = min(e, la - lb)
      ka, la, e = d, la - d, e - d
      first_is_a = False  # Equal lengths now: B is trimmed next.
    else:
      d = min(e, lb - la + 1)
      kb, lb, e = d, lb - d, e - d
      first_is_a = True  # A is one longer now: A is trimmed next.
    ka += (e + 1) // 2 if first_is_a else e // 2
    kb += e // 2 if first_is_a else (e + 1) // 2
    a_front, b_front = count_heads(ka), count_heads(kb)
    return a_front, len_a - (ka - a_front), b_front, len_b - (kb - b_front)
  a_lo, a_hi, b_lo, b_hi = 0, len_a, 0, len_b
  rnd = rng.random
  while (a_hi - a_lo) + (b_hi - b_lo) > max_num_tokens:
    if a_hi - a_lo > b_hi - b_lo:
      if rnd() < 0.5:
        a_lo += 1
      else:
        a_hi -= 1
    else:
      if rnd() < 0.5:
        b_lo += 1
      else:
        b_hi -= 1
  return a_lo, a_hi, b_lo, b_hi


def mask_tokens(tokens: list[int], num_a: int, masked_lm_prob: float,
                max_predictions_per_seq: int, vocab: VocabInfo, rng,
                whole_word_mask: bool = False):
  """The original `create_masked_lm_predictions` on ids.

  `tokens` is [CLS] A [SEP] B [SEP] with len(A) == num_a. Returns
  (masked tokens, positions ascending, original ids at those positions).
  """
  n = len(tokens)
  num_to_predict = masking.num_predictions(n, masked_lm_prob,
                                           max_predictions_per_seq)
  rnd = rng.random
  output = list(tokens)
  replacement = vocab.replacement_ids
  last_replacement = len(replacement) - 1
  mask_id = vocab.mask_id

  def replace(index):
    """80% [MASK], 10% unchanged, 10% a random token; the original's draws."""
    kind = masking.draw_replacement(rnd)
    if kind == masking.MASK:
      output[index] = mask_id
    elif kind == masking.RANDOM:
      output[index] = replacement[rng.randint(0, last_replacement)]

  if whole_word_mask:
    chosen = _whole_word_choice(tokens, num_a, num_to_predict, vocab, rng)
  else:
    # Every candidate is its own group, so the original's "covered" check
    # never fires: the chosen positions are a prefix of the shuffled list.
    chosen = list(range(1, num_a + 1))
    chosen.extend(range(num_a + 2, n - 1))
    rng.shuffle(chosen)
    del chosen[num_to_predict:]
  # The original draws the replacements after choosing (no draw decides the
  # choice), in the same order.
  for index in chosen:
    replace(index)
  chosen.sort()
  return output, chosen, [tokens[i] for i in chosen]


def _whole_word_choice(tokens, num_a, num_to_predict, vocab, rng) -> list[int]:
  """The original's whole-word choice: shuffled groups of a word's pieces,
  each taken whole while the predictions allow; positions in draw order."""
  starts = vocab.is_word_start
  if starts is None:
    raise ValueError("whole-word masking needs VocabInfo.is_word_start.")
  cand_groups = []
  for i in range(1, len(tokens) - 1):
    if i == num_a + 1:
      continue
    if cand_groups and not starts[tokens[i]]:
      cand_groups[-1].append(i)
    else:
      cand_groups.append([i])
  rng.shuffle(cand_groups)
  chosen = []
  for group in cand_groups:
    if len(chosen) >= num_to_predict:
      break
    if len(chosen) + len(group) > num_to_predict:
      continue
    chosen.extend(group)
  return chosen


def instance_spans(doc_offsets: Sequence[Sequence[int]], document_index: int,
                   max_seq_length: int, short_seq_prob: float, rng, *,
                   chunk_start: int = 0, target_seq_length: Optional[int] = None):
  """The original `create_instances_from_document` on sentence offsets.

  doc_offsets[d] holds the token offsets of document d's sentences within
  the document (0, len(s0), len(s0) + len(s1), ..., len(d)). Yields one
  (a_doc, a_lo, a_hi, b_doc, b_lo, b_hi, is_random_next) per instance:
  segment A is tokens [a_lo, a_hi) of document a_doc, B likewise, both
  already truncated. A generator, so that a caller that masks each instance
  before taking the next draws random numbers in the original's order.
  `chunk_start` and `target_seq_length` resume a document part-way
  (instance_batches.pass_spans): the sentence its next chunk begins at and
  the target length drawn for the document, which is then not drawn.
  """
  off = doc_offsets[document_index]
  num_sentences = len(off) - 1
  max_num_tokens = max_seq_length - 3
  rnd = rng.random
  randint = rng.randint

  if target_seq_length is None:
    target_seq_length = max_num_tokens
    if rnd() < short_seq_prob:
      target_seq_length = randint(2, max_num_tokens)

  # The current chunk is sentences chunk_start..i.
  while chunk_start < num_sentences:
    # The chunk grows to the first sentence that brings it to the target
    # length, or to the document's end (the original adds one at a time).
    i = min(bisect.bisect_left(off, off[chunk_start] + target_seq_length,
                               chunk_start + 1) - 1, num_sentences - 1)
    chunk_len = i - chunk_start + 1
    a_end = 1
    if chunk_len >= 2:
      a_end = randint(1, chunk_len - 1)
    a_lo, a_hi = off[chunk_start], off[chunk_start + a_end]

    if chunk_len == 1 or rnd() < 0.5:
      is_random_next = True
      b_doc, b_lo, b_hi = _random_next_segment(
          doc_offsets, document_index, target_seq_length - (a_hi - a_lo), rng)
      # The segments after A were not used: put them back.
      i -= chunk_len - a_end
    else:
      is_random_next = False
      b_doc, b_lo, b_hi = document_index, a_hi, off[i + 1]

    ta_lo, ta_hi, tb_lo, tb_hi = _truncate_bounds(
        a_hi - a_lo, b_hi - b_lo, max_num_tokens, rng)
    yield (document_index, a_lo + ta_lo, a_lo + ta_hi, b_doc, b_lo + tb_lo,
           b_lo + tb_hi, is_random_next)
    chunk_start = i + 1


def _random_next_segment(doc_offsets, document_index, target_b_length, rng):
  """(document, lo, hi) of a random-next segment B: whole sentences of
  another document from a random one on, until the target length."""
  num_documents = len(doc_offsets)
  for _ in range(10):
    b_doc = rng.randint(0, num_documents - 1)
    if b_doc != document_index:
      break
  if b_doc == document_index and num_documents > 1:
    b_doc = (document_index + 1) % num_documents
  b_off = doc_offsets[b_doc]
  last = len(b_off) - 2
  j = rng.randint(0, last)
  b_lo = b_off[j]
  j = min(bisect.bisect_left(b_off, b_lo + target_b_length, j + 1) - 1, last)
  return b_doc, b_lo, b_off[j + 1]


def sentence_offsets(document: Sequence[Sequence[int]]) -> list[int]:
  """Token offsets of a document's sentences, for `instance_spans`."""
  return list(itertools.accumulate(map(len, document), initial=0))


class _Documents:
  """Offsets and flattened tokens of documents, computed when first asked."""

  def __init__(self, documents):
    self._documents = documents
    self._offsets = {}
    self._tokens = {}

  def __len__(self):
    return len(self._documents)

  def __getitem__(self, d):
    got = self._offsets.get(d)
    if got is None:
      got = self._offsets[d] = sentence_offsets(self._documents[d])
    return got

  def tokens(self, d):
    got = self._tokens.get(d)
    if got is None:
      got = self._tokens[d] = list(itertools.chain.from_iterable(self._documents[d]))
    return got


def create_instances_from_document(
    all_documents: Sequence[Sequence[Sequence[int]]], document_index: int,
    max_seq_length: int, short_seq_prob: float, masked_lm_prob: float,
    max_predictions_per_seq: int, vocab: VocabInfo, rng,
    whole_word_mask: bool = False, mask: bool = True) -> list:
  """The original `create_instances_from_document` on token ids.

  A document is a list of sentences, each a non-empty list of ids (no
  special ids). `rng` needs `random()`, `randint(a, b)` and `shuffle(list)`:
  a `random.Random` or a `FastRng`. With `mask=False` the pairs are returned
  unmasked as (tokens, num_a, is_random_next) tuples (what the batched path,
  instance_batches.py, is checked against).
  """
  docs = _Documents(all_documents)
  instances = []
  for a_doc, a_lo, a_hi, b_doc, b_lo, b_hi, is_random_next in instance_spans(
      docs, document_index, max_seq_length, short_seq_prob, rng):
    tokens = [vocab.cls_id]
    tokens.extend(docs.tokens(a_doc)[a_lo:a_hi])
    tokens.append(vocab.sep_id)
    tokens.extend(docs.tokens(b_doc)[b_lo:b_hi])
    tokens.append(vocab.sep_id)
    num_a = a_hi - a_lo
    if mask:
      output, positions, labels = mask_tokens(
          tokens, num_a, masked_lm_prob, max_predictions_per_seq, vocab, rng,
          whole_word_mask)
      instances.append(Instance(output, num_a, positions, labels, is_random_next))
    else:
      instances.append((tokens, num_a, is_random_next))
  return instances
