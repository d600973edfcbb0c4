"""Held-out records, packed or not: a batch limit selects the same records,
and each host's packed plan places each record of its share once, in full
batches, after reading the sizes of its share only.

The limit (logging.eval_batches, eval_batches' max_batches) keeps the first
max_batches x global_batch_size records either way, so on the same weights a
packed and an unpacked evaluation give the same sums.
"""

import collections
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.input import batch_reader
from bertjax.input import evaluation
from bertjax.input import packing
from bertjax.model.bert import BertForPreTraining
from bertjax.train import evaluate
from bertjax.train import run_config
from bertjax.train import state as state_lib
from test_model import init_params, tiny
from test_packing_pipeline import (L, OPTIONS, P, V, dataset,  # pylint: disable=unused-import
                                   examples_of, unpack)
from test_train import tiny_config

BATCH, LIMIT = 16, 2  # 32 of the fixture's 120 records.


def _batches(directory, packed, process_index=0, process_count=1):
  return evaluation.eval_batches(
      os.path.join(directory, "part-*"), BATCH, max_seq_length=L, max_predictions_per_seq=P,
      process_index=process_index, process_count=process_count, max_batches=LIMIT,
      packing=OPTIONS if packed else None)


@pytest.mark.parametrize("hosts", [1, 2])
def test_the_limit_selects_the_first_records_packed_or_not(dataset, hosts):
  plain = collections.Counter(e for b in _batches(dataset, False) for e in examples_of(b))
  first = collections.Counter(
      e for b in evaluation.eval_batches(os.path.join(dataset, "part-*"), LIMIT * BATCH,
                                         max_seq_length=L, max_predictions_per_seq=P,
                                         process_index=0, process_count=1, max_batches=1)
      for e in examples_of(b))
  packed = collections.Counter(e for h in range(hosts)
                               for b in _batches(dataset, True, h, hosts) for e in unpack(b))
  assert sum(plain.values()) == LIMIT * BATCH
  assert plain == first == packed


@pytest.mark.slow
def test_packed_and_unpacked_evaluations_give_the_same_sums(dataset):
  """The same weights, the same eval_batches: losses and accuracies to fp32 rounding."""
  config = tiny(vocab_size=V, max_position_embeddings=L)
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  state = state_lib.TrainState(step=jnp.zeros([], jnp.int32),
                               params=init_params(config)["params"], opt_state=(),
                               apply_fn=BertForPreTraining(config).apply, tx=optax.identity())
  evaluator = evaluate.Evaluator(one, one, one, vocab_size=V)
  plain = evaluator.run(state, _batches(dataset, False))
  packed = evaluator.run(state, _batches(dataset, True))
  assert plain["num_examples"] == packed["num_examples"] == LIMIT * BATCH
  for k in plain:
    np.testing.assert_allclose(packed[k], plain[k], rtol=1e-5, err_msg=k)


def test_a_negative_limit_is_refused_naming_the_field():
  with pytest.raises(run_config.ConfigError, match=r"--config\.logging\.eval_batches: must be 0"):
    run_config.validate(tiny_config({"logging.eval_batches": -1}))


def _sizes(n, seed=0):
  rng = np.random.default_rng(seed)
  tokens = np.where(rng.random(n) < 0.5, 32, rng.integers(4, 33, n))
  predictions = np.clip(np.round(0.15 * tokens), 1, 5).astype(np.int64)
  return tokens, predictions, rng.random(n) < 0.95


def test_the_plan_places_every_example_once_within_its_row():
  tokens, predictions, real = _sizes(2000)
  p = packing.Packing(max_seq_length=32, max_predictions_per_seq=5, rows=1,
                      max_examples_per_row=3, max_predictions_per_row=7)
  row, offset = packing.first_fit(tokens, predictions, real, p, as_needed=True)
  rows = row.max() + 1
  assert ((row >= 0) == real).all()
  for r in range(rows):
    i = np.flatnonzero(row == r)
    i = i[np.argsort(offset[i])]
    assert 1 <= len(i) <= 3 and predictions[i].sum() <= 7
    np.testing.assert_array_equal(offset[i], np.cumsum(tokens[i]) - tokens[i])
    assert offset[i[-1]] + tokens[i[-1]] <= 32
  # As many rows as the examples take are the first of a fixed count that holds them all.
  big = dataclasses.replace(p, rows=len(tokens))
  np.testing.assert_array_equal(packing.first_fit(tokens, predictions, real, big), (row, offset))


def _shares(n, hosts):
  return [(h * n // hosts, (h + 1) * n // hosts) for h in range(hosts)]


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_each_host_plans_its_share_in_full_batches(hosts):
  """Each host plans only its share: together the hosts hold every example
  once; a host needs no more batches than first-fit decreasing over its
  share needs rows, and only its last batch has empty rows."""
  tokens, predictions, real = _sizes(3000, seed=1)
  p = packing.from_options({"rows": 24}, process_count=hosts, max_seq_length=32,
                           max_predictions_per_seq=5)
  seen = []
  for start, stop in _shares(len(tokens), hosts):
    k = packing.EvalPacker(p, tokens[start:stop], predictions[start:stop], real[start:stop],
                           first_record=start)
    big = dataclasses.replace(p, rows=stop - start)
    ffd, _ = packing.first_fit(tokens[start:stop], predictions[start:stop], real[start:stop],
                               big)
    assert k.num_batches <= -(-len(np.unique(ffd[ffd >= 0])) // p.rows)
    used = np.zeros((k.num_batches + 1, p.rows), bool)
    for step in range(k.num_batches + 1):  # One past its own: the padding of slower hosts.
      records, rows, _ = k.placement(step)
      seen += records[records >= 0].tolist()
      used[step, rows[rows >= 0]] = True
    assert (records < 0).all() and not used[-1].any()
    assert used[:-2].all() and used[-2].any()
    assert all(start <= r < stop for r in seen[-int(real[start:stop].sum()):])
  assert sorted(seen) == np.flatnonzero(real).tolist()


def _hosts(directory, hosts):
  """Every simulated host's packed batches, all run for the most any needs."""
  pattern = os.path.join(directory, "part-*")
  kw = dict(max_seq_length=L, max_predictions_per_seq=P, process_count=hosts,
            packing={"rows": 6, "max_examples_per_row": 3})
  own = [evaluation.eval_batches(pattern, 12, process_index=h, **kw).num_batches
         for h in range(hosts)]
  return own, [evaluation.eval_batches(pattern, 12, process_index=h, agree=lambda k: max(own),
                                       **kw) for h in range(hosts)]


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_packed_hosts_score_every_record_once_in_the_same_number_of_batches(dataset, hosts):
  plain = evaluation.eval_batches(os.path.join(dataset, "part-*"), 12, max_seq_length=L,
                                  max_predictions_per_seq=P, process_index=0, process_count=1)
  want = collections.Counter(e for b in plain for e in examples_of(b))
  own, runs = _hosts(dataset, hosts)
  got, delivered = collections.Counter(), set()
  for batches in runs:
    out = list(batches)
    delivered.add((batches.num_batches, len(out)))
    got.update(e for b in out for e in unpack(b))
  assert delivered == {(max(own), max(own))}
  assert got == want and sum(want.values()) == 120


@pytest.mark.parametrize("hosts", [2, 3])
def test_a_host_reads_the_sizes_of_its_share_only(dataset, hosts, monkeypatch):
  """Before its first batch a packed host has read its share's records (and
  record 0, for the shape check), not the whole set."""
  read, counted = batch_reader.Records.read, []

  def counting(self, idx):
    counted.append(len(idx))
    return read(self, idx)
  monkeypatch.setattr(batch_reader.Records, "read", counting)
  for h, (start, stop) in enumerate(_shares(120, hosts)):
    counted.clear()
    evaluation.eval_batches(os.path.join(dataset, "part-*"), 12, max_seq_length=L,
                            max_predictions_per_seq=P, process_index=h, process_count=hosts,
                            packing={"rows": 6}, agree=lambda k: k)
    assert sum(counted) == stop - start + 1


def test_an_agreed_count_below_the_hosts_own_is_refused(dataset):
  with pytest.raises(ValueError, match="agree` must return the max over the hosts"):
    evaluation.eval_batches(os.path.join(dataset, "part-*"), 12, max_seq_length=L,
                            max_predictions_per_seq=P, process_index=0, process_count=1,
                            packing={"rows": 6}, agree=lambda k: k - 1)
