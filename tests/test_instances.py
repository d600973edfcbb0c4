"""Tests of the paper's instance algorithm (bertjax/create/instances.py).

The parity tests run a port of the original release's
create_training_instances / create_instances_from_document /
create_masked_lm_predictions / truncate_seq_pair (token strings, Python
random, whole-word masking by the "##" prefix) side by side with the id-based
implementation on the same random.Random state.
"""

import collections
import random

import numpy as np
import pytest

from bertjax.create import instance_batches
from bertjax.create import instances

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _instance_of(batch, i):
  """Row i of an instance_batches.MaskedBatch as an instances.Instance."""
  n, k = int(batch.lengths_B[i]), int(batch.num_predictions_B[i])
  return instances.Instance(batch.input_ids_BxL[i, :n].tolist(), int(batch.num_a_B[i]),
                            batch.masked_lm_positions_BxP[i, :k].tolist(),
                            batch.masked_lm_ids_BxP[i, :k].tolist(),
                            bool(batch.is_random_next_B[i]))


# --- A port of the original algorithm (token strings, Python random). -------

def _orig_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    assert longer
    if rng.random() < 0.5:
      del longer[0]
    else:
      longer.pop()


def _orig_masked_lm(tokens, masked_lm_prob, max_predictions_per_seq,
                    vocab_words, rng, whole_word_mask):
  cand_indexes = []
  for i, token in enumerate(tokens):
    if token in ("[CLS]", "[SEP]"):
      continue
    if whole_word_mask and cand_indexes and token.startswith("##"):
      cand_indexes[-1].append(i)
    else:
      cand_indexes.append([i])
  rng.shuffle(cand_indexes)
  output_tokens = list(tokens)
  num_to_predict = min(max_predictions_per_seq,
                       max(1, int(round(len(tokens) * masked_lm_prob))))
  masked = []
  covered = set()
  for index_set in cand_indexes:
    if len(masked) >= num_to_predict:
      break
    if len(masked) + len(index_set) > num_to_predict:
      continue
    if any(index in covered for index in index_set):
      continue
    for index in index_set:
      covered.add(index)
      if rng.random() < 0.8:
        replacement = "[MASK]"
      elif rng.random() < 0.5:
        replacement = tokens[index]
      else:
        replacement = vocab_words[rng.randint(0, len(vocab_words) - 1)]
      output_tokens[index] = replacement
      masked.append((index, tokens[index]))
  masked.sort(key=lambda x: x[0])
  return output_tokens, [m[0] for m in masked], [m[1] for m in masked]


def _orig_instances_from_document(all_documents, document_index,
                                  max_seq_length, short_seq_prob,
                                  masked_lm_prob, max_predictions_per_seq,
                                  vocab_words, rng, whole_word_mask):
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3
  target_seq_length = max_num_tokens
  if rng.random() < short_seq_prob:
    target_seq_length = rng.randint(2, max_num_tokens)
  result = []
  current_chunk, current_length, i = [], 0, 0
  while i < len(document):
    current_chunk.append(document[i])
    current_length += len(document[i])
    if i == len(document) - 1 or current_length >= target_seq_length:
      if current_chunk:
        a_end = 1
        if len(current_chunk) >= 2:
          a_end = rng.randint(1, len(current_chunk) - 1)
        tokens_a = [t for seg in current_chunk[:a_end] for t in seg]
        tokens_b = []
        if len(current_chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b_length = target_seq_length - len(tokens_a)
          for _ in range(10):
            random_document_index = rng.randint(0, len(all_documents) - 1)
            if random_document_index != document_index:
              break
          random_document = all_documents[random_document_index]
          random_start = rng.randint(0, len(random_document) - 1)
          for j in range(random_start, len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b_length:
              break
          i -= len(current_chunk) - a_end
        else:
          is_random_next = False
          for j in range(a_end, len(current_chunk)):
            tokens_b.extend(current_chunk[j])
        _orig_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        assert tokens_a and tokens_b
        tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
        tokens, positions, labels = _orig_masked_lm(
            tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
            whole_word_mask)
        result.append((tokens, segment_ids, positions, labels, is_random_next))
      current_chunk, current_length = [], 0
    i += 1
  return result


def _orig_training_instances(documents, dupe_factor, max_seq_length,
                             short_seq_prob, masked_lm_prob,
                             max_predictions_per_seq, vocab_words, rng,
                             whole_word_mask):
  all_documents = [d for d in documents if d]
  rng.shuffle(all_documents)
  out = []
  for _ in range(dupe_factor):
    for document_index in range(len(all_documents)):
      out.extend(_orig_instances_from_document(
          all_documents, document_index, max_seq_length, short_seq_prob,
          masked_lm_prob, max_predictions_per_seq, vocab_words, rng,
          whole_word_mask))
  rng.shuffle(out)
  return out


# --- Fixtures. ---------------------------------------------------------------

def _vocab(num_words=300, num_pieces=100):
  tokens = SPECIALS + [f"w{i}" for i in range(num_words)] + [
      f"##p{i}" for i in range(num_pieces)]
  info = instances.VocabInfo.create(
      len(tokens), {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4},
      [not t.startswith("##") for t in tokens])
  return tokens, info


def _documents(rng, tokens, num_docs, min_len=1, max_len=40, max_sents=12):
  """Documents of token strings; sentences start with a word, not a piece."""
  words = [t for t in tokens[5:] if not t.startswith("##")]
  pieces = [t for t in tokens[5:] if t.startswith("##")]
  docs = []
  for _ in range(num_docs):
    doc = []
    for _ in range(rng.randint(1, max_sents)):
      n = rng.randint(min_len, max_len)
      sent = [rng.choice(words)]
      while len(sent) < n:
        sent.append(rng.choice(pieces) if rng.random() < 0.3 else
                    rng.choice(words))
      doc.append(sent)
    docs.append(doc)
  return docs


@pytest.mark.parametrize("whole_word_mask", [False, True])
@pytest.mark.parametrize("max_seq_length,short_seq_prob", [(128, 0.1),
                                                           (32, 0.5)])
def test_parity_with_original(whole_word_mask, max_seq_length, short_seq_prob):
  tokens, vocab = _vocab()
  ids = {t: i for i, t in enumerate(tokens)}
  docs = _documents(random.Random(7), tokens, 40)
  # The original draws replacements from `vocab_words`; ours from the
  # non-special ids. With the non-special tokens as vocab_words the draws
  # coincide.
  vocab_words = [tokens[i] for i in vocab.replacement_ids]
  seed, dupe = 1234, 3
  settings = dict(max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                  masked_lm_prob=0.15, max_predictions_per_seq=20)
  expected = _orig_training_instances(
      docs, dupe, vocab_words=vocab_words, rng=random.Random(seed),
      whole_word_mask=whole_word_mask, **settings)

  rng = random.Random(seed)
  id_docs = [[[ids[t] for t in s] for s in d] for d in docs if d]
  rng.shuffle(id_docs)
  got = []
  for _ in range(dupe):
    for doc_index in range(len(id_docs)):
      got.extend(instances.create_instances_from_document(
          id_docs, doc_index, vocab=vocab, rng=rng,
          whole_word_mask=whole_word_mask, **settings))
  rng.shuffle(got)

  assert len(got) == len(expected) > 100
  for inst, (tok, seg, pos, lab, rnd) in zip(got, expected):
    assert inst.input_ids == [ids[t] for t in tok]
    assert inst.segment_ids == seg
    assert inst.masked_lm_positions == pos
    assert inst.masked_lm_ids == [ids[t] for t in lab]
    assert inst.is_random_next == rnd


def test_parity_consumes_same_random_stream():
  tokens, vocab = _vocab()
  ids = {t: i for i, t in enumerate(tokens)}
  docs = _documents(random.Random(3), tokens, 10)
  id_docs = [[[ids[t] for t in s] for s in d] for d in docs]
  vocab_words = [tokens[i] for i in vocab.replacement_ids]
  r_orig, r_ours = random.Random(5), random.Random(5)
  for d in range(len(docs)):
    _orig_instances_from_document(docs, d, 64, 0.1, 0.15, 10, vocab_words,
                                  r_orig, False)
    instances.create_instances_from_document(id_docs, d, 64, 0.1, 0.15, 10,
                                             vocab, r_ours)
  assert r_orig.getstate() == r_ours.getstate()


def _statistics_corpus(seed, num_docs, min_len, max_len, sentences=(4, 30)):
  tokens, vocab = _vocab(num_words=2000, num_pieces=0)
  rng = random.Random(seed)
  docs = [[[rng.randint(5, len(tokens) - 1)
            for _ in range(rng.randint(min_len, max_len))]
           for _ in range(rng.randint(*sentences))] for _ in range(num_docs)]
  return docs, vocab


def _make(docs, vocab, max_seq_length, short_seq_prob, max_pred, seed, path):
  """Instances by the scalar path, by spans + instance_batches, or by the
  driver's: spans of every document at once (pass_spans) + instance_batches."""
  made = []
  tokens, starts, offsets = _flat(docs)
  if path == "lockstep":
    gen = np.random.default_rng(seed)
    sentence_starts = np.cumsum([0] + [len(s) for d in docs for s in d])
    first = np.cumsum([0] + [len(d) for d in docs])
    spans = instance_batches.pass_spans(sentence_starts, first, max_seq_length,
                                        short_seq_prob, gen)
    batch = instance_batches.mask_arrays(
        *instance_batches.assemble_pairs(spans, tokens, starts, max_seq_length, vocab),
        0.15, max_pred, vocab, gen)
    return [_instance_of(batch, i) for i in range(len(batch))]
  for doc_index in range(len(docs)):
    rng = instances.FastRng([seed, doc_index])
    if path == "scalar":
      got = instances.create_instances_from_document(
          docs, doc_index, max_seq_length, short_seq_prob, 0.15, max_pred, vocab, rng)
    else:
      spans = np.asarray(list(instances.instance_spans(
          offsets, doc_index, max_seq_length, short_seq_prob, rng)), np.int64)
      batch = instance_batches.mask_arrays(
          *instance_batches.assemble_pairs(spans, tokens, starts, max_seq_length, vocab),
          0.15, max_pred, vocab, rng.generator)
      got = [_instance_of(batch, i) for i in range(len(batch))]
    made.extend(got)
  return made


def _flat(docs):
  """(all tokens back to back, document starts, sentence offsets): the driver's view."""
  offsets = [instances.sentence_offsets(d) for d in docs]
  starts = np.cumsum([0] + [o[-1] for o in offsets])
  tokens = np.asarray([t for d in docs for sent in d for t in sent], np.int64)
  return tokens, starts, offsets


@pytest.mark.parametrize("short_seq_prob", [0.0, 0.1, 0.6])
def test_spans_assembled_in_numpy_equal_the_scalar_pairs(short_seq_prob):
  # Documents of one to six sentences of 1-40 tokens, so that chunks end at
  # document ends, random B runs to the end of its document and truncation
  # takes from both ends.
  rng = random.Random(3)
  vocab = instances.VocabInfo.create(200, dict(pad=0, unk=1, cls=2, sep=3, mask=4))
  docs = [[[rng.randint(5, 199) for _ in range(rng.randint(1, 40))]
           for _ in range(rng.randint(1, 6))] for _ in range(60)]
  tokens, starts, offsets = _flat(docs)
  for doc_index in range(len(docs)):
    want = instances.create_instances_from_document(
        docs, doc_index, 48, short_seq_prob, 0.15, 8, vocab,
        instances.FastRng([7, doc_index]), mask=False)
    spans = np.asarray(list(instances.instance_spans(
        offsets, doc_index, 48, short_seq_prob, instances.FastRng([7, doc_index]))),
                       np.int64).reshape(-1, 7)
    ids, lengths, num_a, is_random_next = instance_batches.assemble_pairs(
        spans, tokens, starts, 48, vocab)
    assert len(want) == len(spans)
    for i, (toks, n_a, rand) in enumerate(want):
      assert ids[i, :lengths[i]].tolist() == toks
      assert not ids[i, lengths[i]:].any()
      assert (num_a[i], bool(is_random_next[i])) == (n_a, rand)


def test_batched_masking_draws_uniform_subsets():
  B, L, P, n, num_a = 20000, 40, 10, 37, 15
  vocab = instances.VocabInfo.create(100, {"pad": 0, "unk": 1, "cls": 2,
                                           "sep": 3, "mask": 4})
  ids = np.zeros((B, L), np.int64)
  ids[:, :n] = np.arange(10, 10 + n)
  ids[:, 0], ids[:, num_a + 1], ids[:, n - 1] = 2, 3, 3
  batch = instance_batches.mask_arrays(
      ids, np.full(B, n), np.full(B, num_a), np.zeros(B, bool), 0.15, P, vocab,
      np.random.default_rng(0))
  k = round(n * 0.15)
  assert (batch.num_predictions_B == k).all()
  used = np.arange(P) < k
  pos = batch.masked_lm_positions_BxP[:, used]
  assert (np.diff(pos, axis=1) > 0).all() and not batch.masked_lm_positions_BxP[:, k:].any()
  counts = np.bincount(pos.ravel(), minlength=L)
  cand = [c for c in range(1, n - 1) if c != num_a + 1]
  assert counts[[c for c in range(L) if c not in cand]].sum() == 0
  expected = B * k / len(cand)
  assert np.abs(counts[cand] / expected - 1).max() < 0.06
  # Pairs too: the first and last candidate are chosen together as often
  # as a uniform subset has them.
  both = ((pos == cand[0]).any(axis=1) & (pos == cand[-1]).any(axis=1)).mean()
  want = k * (k - 1) / (len(cand) * (len(cand) - 1))
  assert abs(both / want - 1) < 0.15


@pytest.mark.parametrize("path", ["scalar", "batch", "lockstep"])
def test_mlm_statistics_over_10k_instances(path):
  # Every sentence has >= 50 tokens and the target is 100 (short_seq_prob 0),
  # so every chunk or A + random B reaches 100 tokens and is truncated to
  # exactly 100: each instance has 103 tokens, 100 of them maskable, and
  # round(103 * 0.15) = 15 predictions, i.e. exactly 15% of the maskable
  # tokens. (With mixed lengths the per-instance rounding moves the share:
  # a 5-token instance masks 1 of 2 maskable tokens.)
  docs, vocab = _statistics_corpus(0, 900, 50, 70)
  made = _make(docs, vocab, 103, 0.0, 20, 1, path)
  assert len(made) >= 10_000
  decisions = collections.Counter()
  masked = maskable = 0
  for inst in made:
    n = len(inst.input_ids)
    assert n == 103
    maskable += n - 3
    masked += len(inst.masked_lm_positions)
    pos = inst.masked_lm_positions
    assert pos == sorted(set(pos))
    specials = {0, inst.num_a + 1, n - 1}
    assert not specials & set(pos)
    assert inst.input_ids[0] == vocab.cls_id
    assert inst.input_ids[inst.num_a + 1] == vocab.sep_id
    assert inst.input_ids[-1] == vocab.sep_id
    for p, label in zip(pos, inst.masked_lm_ids):
      got = inst.input_ids[p]
      if got == vocab.mask_id:
        decisions["mask"] += 1
      elif got == label:
        decisions["keep"] += 1
      else:
        assert got in vocab.replacement_ids
        decisions["random"] += 1
  share = masked / maskable
  assert abs(share - 0.15) <= 0.005, share
  total = sum(decisions.values())
  assert abs(decisions["mask"] / total - 0.8) <= 0.015, decisions
  assert abs(decisions["keep"] / total - 0.1) <= 0.015, decisions
  assert abs(decisions["random"] / total - 0.1) <= 0.015, decisions


@pytest.mark.parametrize("path", ["scalar", "batch", "lockstep"])
def test_nsp_balance_and_prediction_counts_over_10k_instances(path):
  # Mixed lengths with several sentences per chunk. A chunk of one sentence
  # is always random-next; that happens at some documents' ends and, with
  # short_seq_prob > 0, whenever a short target is reached by one sentence.
  # So with short_seq_prob = 0 the share is ~50% (+ document ends), and with
  # the default 0.1 a few points more, as in the original.
  docs, vocab = _statistics_corpus(1, 550, 3, 25, sentences=(40, 100))
  for short_seq_prob, low, high in ((0.0, 0.48, 0.525), (0.1, 0.5, 0.57)):
    made = _make(docs, vocab, 64, short_seq_prob, 8, 2, path)
    assert len(made) >= 10_000
    random_next = sum(i.is_random_next for i in made) / len(made)
    assert low <= random_next <= high, (short_seq_prob, random_next)
    for inst in made:
      n = len(inst.input_ids)
      assert 5 <= n <= 64
      assert len(inst.masked_lm_positions) == min(8, max(1, round(n * 0.15)))
      assert inst.segment_ids == ([0] * (inst.num_a + 2)
                                  + [1] * (n - inst.num_a - 2))


def test_random_next_never_from_same_document():
  # Two documents: the original would pick the document itself with
  # probability 2**-10 per random-next pair; ours never does.
  vocab = _vocab()[1]
  docs = [[[10 + d] * 3 for _ in range(6)] for d in range(2)]
  for seed in range(300):
    for doc_index in range(2):
      for inst in instances.create_instances_from_document(
          docs, doc_index, 16, 0.5, 0.15, 3, vocab, random.Random(seed)):
        n = len(inst.input_ids)
        b_ids = {inst.masked_lm_ids[inst.masked_lm_positions.index(p)]
                 if p in inst.masked_lm_positions else inst.input_ids[p]
                 for p in range(inst.num_a + 2, n - 1)}
        if inst.is_random_next:
          assert b_ids == {10 + (1 - doc_index)}
        else:
          assert b_ids == {10 + doc_index}


def test_whole_word_masking_masks_whole_words():
  tokens, vocab = _vocab()
  ids = {t: i for i, t in enumerate(tokens)}
  docs = _documents(random.Random(11), tokens, 200, min_len=5, max_len=30)
  id_docs = [[[ids[t] for t in s] for s in d] for d in docs]
  starts = vocab.is_word_start
  num_groups = 0
  for doc_index in range(len(id_docs)):
    for inst in instances.create_instances_from_document(
        id_docs, doc_index, 64, 0.1, 0.15, 10, vocab,
        instances.FastRng([3, doc_index]), whole_word_mask=True):
      original = list(inst.input_ids)
      for p, label in zip(inst.masked_lm_positions, inst.masked_lm_ids):
        original[p] = label
      masked = set(inst.masked_lm_positions)
      n = len(original)
      specials = {0, inst.num_a + 1, n - 1}
      # Words: a start piece followed by its continuation pieces.
      word = []
      for p in range(1, n):
        if p in specials or starts[original[p]]:
          if word:
            flags = {q in masked for q in word}
            assert len(flags) == 1, (word, masked)
            num_groups += flags == {True}
          word = [] if p in specials else [p]
        else:
          word.append(p)
      assert len(masked) <= 10
  assert num_groups > 1000


def test_truncate_seq_pair_matches_bounds():
  for seed in range(50):
    lengths = random.Random(seed)
    len_a, len_b = lengths.randint(1, 80), lengths.randint(1, 80)
    a, b = list(range(len_a)), list(range(100, 100 + len_b))
    r1, r2 = random.Random(seed), random.Random(seed)
    _orig_truncate_seq_pair(a, b, 50, r1)
    a_lo, a_hi, b_lo, b_hi = instances._truncate_bounds(  # pylint: disable=protected-access
        len_a, len_b, 50, r2)
    assert a == list(range(a_lo, a_hi))
    assert b == list(range(100 + b_lo, 100 + b_hi))
    assert len(a) + len(b) <= 50 and a and b
    assert r1.getstate() == r2.getstate()


def test_truncation_counts_match_the_sequential_rule():
  # FastRng draws the front removals at once; the number taken from each
  # list must equal the sequential rule's, and the fronts are ~Binomial(k, .5).
  fronts = []
  for seed in range(2000):
    lengths = random.Random(seed)
    len_a, len_b = lengths.randint(1, 90), lengths.randint(1, 90)
    a_lo, a_hi, b_lo, b_hi = instances._truncate_bounds(  # pylint: disable=protected-access
        len_a, len_b, 60, random.Random(seed))
    f_lo, f_hi, g_lo, g_hi = instances._truncate_bounds(  # pylint: disable=protected-access
        len_a, len_b, 60, instances.FastRng([seed]))
    assert (a_hi - a_lo, b_hi - b_lo) == (f_hi - f_lo, g_hi - g_lo)
    assert 0 <= f_lo <= f_hi <= len_a and 0 <= g_lo <= g_hi <= len_b
    removed = len_a - (f_hi - f_lo)
    if removed:
      fronts.append(f_lo / removed)
  assert abs(np.mean(fronts) - 0.5) < 0.02


def test_fast_rng_is_deterministic():
  a, b = instances.FastRng([1, 2, 3]), instances.FastRng([1, 2, 3])
  xa, xb = list(range(50)), list(range(50))
  a.shuffle(xa)
  b.shuffle(xb)
  assert xa == xb != list(range(50))
  assert [a.random() for _ in range(5)] == [b.random() for _ in range(5)]
  assert instances.FastRng([1, 2, 4]).random() != instances.FastRng([1, 2, 3]).random()


def test_vocab_info_rejects_missing_specials():
  with pytest.raises(ValueError, match="mask"):
    instances.VocabInfo.create(10, {"pad": 0, "unk": 1, "cls": 2, "sep": 3})
  info = instances.VocabInfo.create(
      8, {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4})
  assert info.replacement_ids == (5, 6, 7)
  assert np.all(np.asarray(info.replacement_ids) >= 5)
