"""Packed rows give the unpacked computation: losses, metrics and gradients.

The same examples, one per row and then packed several to a row
(bertjax/input/packing.py), through the pretraining model and the train
step's loss sums; plus the packing layout itself and the errors.
"""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.input import packing
from bertjax.model import attention
from bertjax.model import kernel_evidence
from bertjax.model.bert import BertForPreTraining
from bertjax.records import schema
from bertjax.train import step as step_lib
from data_utils import make_example
from test_model import init_params, tiny

LENGTH, PREDICTIONS, VOCAB = 32, 5, 97


def examples(n: int, seed: int = 0, min_length: int = 6, max_length: int = 14):
  """n random examples in the parsed batch layout ([n, ...], int32)."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    e = make_example(rng, max_length, PREDICTIONS, VOCAB, True, min_length)
    full = {}
    for name, value in e.items():
      if name in ("original_input_ids", "next_sentence_labels"):
        full[name] = value
      elif name.startswith("masked_lm"):
        full[name] = value
      else:
        full[name] = np.pad(value, (0, LENGTH - max_length))
    rows.append(full)
  batch = {name: np.stack([r[name] for r in rows]) for name in schema.FEATURES}
  batch = {k: (v.astype(np.float32) if v.dtype.kind == "f" else v.astype(np.int32))
           for k, v in batch.items()}
  batch["next_sentence_labels"] = batch["next_sentence_labels"][:, 0]
  batch[schema.EXAMPLE_WEIGHT_KEY] = np.ones(n, np.float32)
  return batch


def packer(rows: int, per_row: int = 3) -> packing.Packing:
  return packing.Packing(max_seq_length=LENGTH, max_predictions_per_seq=PREDICTIONS,
                         rows=rows, max_examples_per_row=per_row,
                         max_predictions_per_row=per_row * PREDICTIONS)


def packed_batch(batch, p):
  tokens, preds, real = packing.example_sizes(batch)
  row, offset = packing.first_fit(tokens, preds, real, p)
  assert (row >= 0).all(), "every example fits"
  return packing.pack(batch, row, offset, p)


def sums_and_grads(config, params, batch):
  model = BertForPreTraining(config)
  batch = {k: jnp.asarray(v) for k, v in batch.items()}

  def total(p):
    sums = step_lib.loss_sums(p["params"], model.apply, batch, None, deterministic=True)
    return sums["mlm_loss"] + sums["nsp_loss"], sums
  (_, sums), grads = jax.value_and_grad(total, has_aux=True)(params)
  return jax.tree.map(np.asarray, sums), jax.tree.map(np.asarray, grads)


def test_layout_places_every_example_in_its_own_span():
  batch = examples(9)
  p = packer(rows=4)
  out = packed_batch(batch, p)
  tokens, _, _ = packing.example_sizes(batch)
  assert out["input_mask"].sum() == tokens.sum()
  assert out[schema.EXAMPLE_WEIGHT_KEY].sum() == 9
  assert out["masked_lm_weights"].sum() == batch["masked_lm_weights"].sum()
  # Each example's tokens, positions and [CLS] where its slot says.
  for r in range(p.rows):
    for k in range(p.max_examples_per_row):
      if not out[schema.EXAMPLE_WEIGHT_KEY][r, k]:
        continue
      span = np.flatnonzero(out["packed_example_ids"][r] == k + 1)
      assert span[0] == out["next_sentence_positions"][r, k]
      np.testing.assert_array_equal(out["position_ids"][r, span], np.arange(len(span)))
      assert out["input_ids"][r, span[0]] == 2  # [CLS]
  # Masked positions point at tokens whose original id is the label.
  r, q = np.nonzero(out["masked_lm_weights"])
  pos = out["masked_lm_positions"][r, q]
  assert (out["packed_example_ids"][r, pos] > 0).all()


def test_fewer_rows_than_needed_leaves_examples_unplaced():
  batch = examples(9, min_length=12, max_length=14)
  tokens, preds, real = packing.example_sizes(batch)
  row, _ = packing.first_fit(tokens, preds, real, packer(rows=2))
  assert (row >= 0).sum() == 4 and (row < 0).sum() == 5  # two 12..14-token examples per 32


def one_at_a_time(tokens, preds, real, p, rows):
  """First-fit decreasing written the plain way: each example in turn, by
  decreasing tokens, into the first of `rows` rows with room."""
  row, offset = np.full(len(tokens), -1), np.full(len(tokens), -1)
  free = np.array([[p.max_seq_length, p.max_predictions_per_row,
                    p.max_examples_per_row]] * rows)
  order = np.flatnonzero(real)
  for i in order[np.argsort(-tokens[order], kind="stable")]:
    fits = (free >= [tokens[i], preds[i], 1]).all(1)
    if fits.any():
      r = int(np.argmax(fits))
      row[i], offset[i] = r, p.max_seq_length - free[r, 0]
      free[r] -= [tokens[i], preds[i], 1]
  return row, offset


def random_sizes(n, seed, mixed):
  """Tokens in [1, LENGTH]; predictions from the tokens as the records have
  them, or (mixed) drawn on their own, so that sizes alternate."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, LENGTH + 1, n)
  preds = (rng.integers(1, PREDICTIONS + 1, n) if mixed
           else np.clip(np.round(0.15 * tokens), 1, PREDICTIONS).astype(int))
  return tokens, preds, rng.random(n) < 0.9


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("every", [1, None])
def test_first_fit_places_where_one_example_at_a_time_would(seed, mixed, every, monkeypatch):
  """Also with more examples than the rows hold (the rest get -1), and in
  as many rows as needed; also with the full rows dropped after every size
  and rows opened one at a time."""
  if every:
    monkeypatch.setattr(packing._OpenRows, "COMPACT_EVERY", every)
    monkeypatch.setattr(packing._OpenRows, "OPEN_AT_LEAST", every)
  tokens, preds, real = random_sizes(700, seed, mixed)
  for rows in (3, 40, 150):
    got = packing.first_fit(tokens, preds, real, packer(rows=rows))
    np.testing.assert_array_equal(got, one_at_a_time(tokens, preds, real, packer(rows), rows))
  row, offset = packing.first_fit(tokens, preds, real, packer(rows=1), as_needed=True)
  want = one_at_a_time(tokens, preds, real, packer(1), int(real.sum()))
  np.testing.assert_array_equal((row, offset), want)
  assert ((row >= 0) == real).all()
  np.testing.assert_array_equal(np.unique(row[real]), np.arange(row.max() + 1))


def test_as_needed_refuses_an_example_no_row_holds():
  with pytest.raises(ValueError, match="6 predictions fits in no empty packed row"):
    packing.first_fit(np.array([4, 3]), np.array([1, 6]), np.ones(2, bool),
                      packer(rows=1, per_row=1), as_needed=True)


def test_train_packer_gives_the_rows_it_always_gave():
  """The same chunk packs to the same rows across versions of this code, so a
  run resumed on a newer one trains on the same data (the digest is of the
  rows packed before placement took runs of one size at a time)."""
  batch = examples(60, seed=3, min_length=5, max_length=14)
  batch[schema.EXAMPLE_WEIGHT_KEY][::7] = 0
  packer_ = packing.TrainPacker(packer(rows=4), chunk_steps=2, seed=11)
  packed = packer_(5, batch)
  digest = hashlib.sha256()
  for name in sorted(packed):
    digest.update(name.encode() + np.ascontiguousarray(packed[name]).tobytes())
  assert packer_.stats() == {"packing_overflow": 27}
  assert digest.hexdigest()[:16] == "0d3418919e87e620"


@pytest.mark.slow
def test_packed_losses_metrics_and_gradients_equal_unpacked():
  """fp32: summed losses to 1e-5 relative; gradients to 1e-4 relative plus 1e-5 of
  the largest gradient (the key bias's true gradient is 0: rounding noise only)."""
  config = tiny(max_position_embeddings=LENGTH)
  params = init_params(config)
  batch = examples(9)
  unpacked_sums, unpacked_grads = sums_and_grads(config, params, batch)
  packed = packed_batch(batch, packer(rows=4))
  assert packed["input_ids"].shape[0] < batch["input_ids"].shape[0]
  packed_sums, packed_grads = sums_and_grads(config, params, packed)
  for k in unpacked_sums:
    np.testing.assert_allclose(packed_sums[k], unpacked_sums[k], rtol=1e-5, err_msg=k)
  assert unpacked_sums["nsp_weight"] == 9
  scale = max(float(np.abs(b).max()) for b in jax.tree.leaves(unpacked_grads))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(packed_grads),
                          jax.tree.leaves(unpacked_grads)):
    np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=1e-4,
                               err_msg=jax.tree_util.keystr(path))


def test_packed_splash_in_interpret_mode_equals_xla():
  """Splash takes the packed-example ids as its segment ids (Pallas interpret mode on CPU)."""
  rng = np.random.default_rng(0)
  b, l, n, h = 2, 128, 2, 16
  q, k, v = (jnp.asarray(rng.normal(size=(b, l, n, h)), jnp.float32) for _ in range(3))
  ids = np.zeros((b, l), np.int32)
  ids[0, :40], ids[0, 40:90], ids[0, 90:100] = 1, 2, 3
  ids[1, :128] = 1
  ids = jnp.asarray(ids)
  splash = attention.splash_attention(q, k, v, ids, interpret=True)
  xla = attention.xla_attention(q, k, v, attention.packed_mask(ids, ids))
  real = np.asarray(ids) > 0
  np.testing.assert_allclose(np.asarray(splash)[real], np.asarray(xla)[real], atol=2e-5)


def test_cudnn_refuses_packed_rows_and_auto_falls_back(monkeypatch):
  proven = lambda kernel, platform: kernel_evidence.Evidence(
      kernel=kernel, platform=platform, dropout=False, seq_lens=(128,),
      jax_minors=(kernel_evidence.jax_minor(),), compiled="-", faster="-")
  monkeypatch.setattr(kernel_evidence, "PROVEN", (proven("cudnn", "gpu"),
                                                  proven("splash", "tpu")))
  with pytest.raises(ValueError, match="attention_impl='cudnn' does not take packed rows"):
    attention.choose("cudnn", attention_dropout_rate=0.0, dtype="bfloat16", platform="gpu",
                     seq_len=128, deterministic=True, packed=True)
  kernel, reason = attention.choose("auto", attention_dropout_rate=0.0, dtype="bfloat16",
                                    platform="gpu", seq_len=128, deterministic=True,
                                    packed=True)
  assert kernel == "xla" and "packed" in reason
  kernel, _ = attention.choose("auto", attention_dropout_rate=0.0, dtype="bfloat16",
                               platform="tpu", seq_len=128, deterministic=True, packed=True)
  assert kernel == "splash"


def test_packing_refuses_predictions_that_do_not_fit():
  with pytest.raises(ValueError, match="packing_max_predictions_per_row=4 is below"):
    packing.Packing(max_seq_length=LENGTH, max_predictions_per_seq=PREDICTIONS, rows=2,
                    max_examples_per_row=2, max_predictions_per_row=4)
  with pytest.raises(ValueError, match="packing_max_predictions_per_row=40 exceeds"):
    packing.Packing(max_seq_length=LENGTH, max_predictions_per_seq=PREDICTIONS, rows=2,
                    max_examples_per_row=2, max_predictions_per_row=40)


def test_model_refuses_partial_packed_inputs():
  config = tiny(max_position_embeddings=LENGTH)
  params = init_params(config)
  out = packed_batch(examples(4), packer(rows=2))
  model = BertForPreTraining(config)
  with pytest.raises(ValueError, match="packed_example_ids, position_ids and "
                     "next_sentence_positions together"):
    model.apply(params, out["input_ids"], out["input_mask"], out["segment_ids"],
                out["masked_lm_positions"], packed_example_ids=out["packed_example_ids"])
