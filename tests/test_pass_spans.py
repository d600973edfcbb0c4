"""Tests of instance_batches.pass_spans: the paper's instance spans of every
document at once, against instances.instance_spans one document at a time."""

import collections
import random

import numpy as np
import pytest

from bertjax.create import instance_batches
from bertjax.create import instances


def _corpus(seed, num_docs):
  """Sentence lengths per document: mostly short documents and a few long
  ones, so that both pass_spans' rounds and its one-at-a-time tail run."""
  rng = random.Random(seed)
  docs = []
  for d in range(num_docs):
    sentences = rng.randint(1, 12) if d % 25 else rng.randint(150, 300)
    docs.append([rng.randint(1, 45) for _ in range(sentences)])
  return docs


def _arrays(docs):
  sentence_starts = np.cumsum([0] + [n for d in docs for n in d])
  first = np.cumsum([0] + [len(d) for d in docs])
  offsets = [instances.sentence_offsets([[0] * n for n in d]) for d in docs]
  return sentence_starts, first, offsets


def _scalar(docs, max_seq_length, short_seq_prob, seed):
  _, _, offsets = _arrays(docs)
  rng = instances.FastRng([seed])
  return np.asarray([span for d in range(len(docs)) for span in instances.instance_spans(
      offsets, d, max_seq_length, short_seq_prob, rng)], np.int64)


def _lockstep(docs, max_seq_length, short_seq_prob, seed):
  starts, first, _ = _arrays(docs)
  return instance_batches.pass_spans(starts, first, max_seq_length, short_seq_prob,
                                     np.random.default_rng(seed))


def _check_spans(spans, docs, max_seq_length):
  doc_len = np.asarray([sum(d) for d in docs])
  a_doc, a_lo, a_hi, b_doc, b_lo, b_hi, random_next = spans.T
  assert (np.diff(a_doc) >= 0).all()  # Document by document.
  assert ((0 <= a_lo) & (a_lo < a_hi) & (a_hi <= doc_len[a_doc])).all()
  assert ((0 <= b_lo) & (b_lo < b_hi) & (b_hi <= doc_len[b_doc])).all()
  assert ((a_hi - a_lo) + (b_hi - b_lo) <= max_seq_length - 3).all()
  actual = random_next == 0
  assert (b_doc[actual] == a_doc[actual]).all()
  assert (b_lo[actual] >= a_hi[actual]).all()
  assert (b_doc[~actual] != a_doc[~actual]).all()


def _summary(spans, num_docs):
  a_doc, a_lo, a_hi, _, b_lo, b_hi, random_next = spans.T
  total = (a_hi - a_lo) + (b_hi - b_lo)
  per_doc = np.bincount(a_doc, minlength=num_docs)
  return {
      "instances": len(spans),
      "random_next": random_next.mean(),
      "mean_a": (a_hi - a_lo).mean(),
      "mean_total": total.mean(),
      "full": (total == total.max()).mean(),
      "short": (total < 40).mean(),
      "long_doc_instances": per_doc[::25].mean(),
  }


@pytest.mark.parametrize("lockstep_min", [1, 64])
def test_pass_spans_follow_the_scalar_distribution(monkeypatch, lockstep_min):
  # lockstep_min 1: every chunk made in rounds; 64 (the default): the long
  # documents finish one at a time.
  monkeypatch.setattr(instance_batches, "_LOCKSTEP_MIN", lockstep_min)
  docs = _corpus(0, 1000)
  scalar, lockstep = collections.defaultdict(list), collections.defaultdict(list)
  for seed in range(12):
    for got, spans in ((scalar, _scalar(docs, 64, 0.1, seed)),
                       (lockstep, _lockstep(docs, 64, 0.1, seed))):
      _check_spans(spans, docs, 64)
      for k, v in _summary(spans, len(docs)).items():
        got[k].append(v)
  for k in scalar:
    want, have = np.mean(scalar[k]), np.mean(lockstep[k])
    # Between seeds, the share of short instances varies by about 14% of
    # itself (standard deviation), the others by 4% or less.
    assert abs(have / want - 1) < (0.06 if k == "short" else 0.02), (k, want, have)


def test_pass_spans_cover_every_document_and_reach_the_target():
  # short_seq_prob 0 and sentences of one length: each document of s
  # sentences of 10 tokens and a target of 60 makes chunks of 6 sentences
  # (the last one shorter), one instance per chunk unless B was random and
  # sentences went back.
  docs = [[10] * s for s in range(1, 200)]
  spans = _lockstep(docs, 63, 0.0, 3)
  _check_spans(spans, docs, 63)
  per_doc = np.bincount(spans[:, 0], minlength=len(docs))
  chunks = -(-np.arange(1, 200) // 6)
  assert (per_doc >= chunks).all()
  a_doc, a_lo = spans[:, 0], spans[:, 1]
  # A always starts at a sentence boundary; the first instance of a
  # document at its start.
  assert (a_lo % 10 == 0).all()
  first = np.r_[True, a_doc[1:] != a_doc[:-1]]
  assert (a_lo[first] == 0).all()


def test_one_document_takes_random_b_from_itself():
  # As instance_spans with one document: the ten draws all give itself.
  docs = [[5] * 40]
  spans = _lockstep(docs, 32, 0.0, 0)
  assert len(spans) and (spans[:, 3] == 0).all()


def test_array_truncation_keeps_the_sequential_rule_counts():
  rng = np.random.default_rng(0)
  len_a, len_b = rng.integers(1, 91, 5000), rng.integers(1, 91, 5000)
  a_lo, a_hi, b_lo, b_hi = instance_batches.truncate_bounds(len_a, len_b, 60, rng)
  for i in range(len(len_a)):
    s_lo, s_hi, t_lo, t_hi = instances._truncate_bounds(  # pylint: disable=protected-access
        int(len_a[i]), int(len_b[i]), 60, random.Random(i))
    assert (a_hi[i] - a_lo[i], b_hi[i] - b_lo[i]) == (s_hi - s_lo, t_hi - t_lo)
  assert ((0 <= a_lo) & (a_lo <= a_hi) & (a_hi <= len_a)).all()
  assert ((0 <= b_lo) & (b_lo <= b_hi) & (b_hi <= len_b)).all()
  removed = len_a - (a_hi - a_lo)
  assert abs((a_lo[removed > 0] / removed[removed > 0]).mean() - 0.5) < 0.02
