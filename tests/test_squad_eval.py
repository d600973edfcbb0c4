"""SQuAD EM/F1 against the official scripts' definitions: crafted cases with
hand-computed scores, and transformers' port of evaluate-v2.0.py."""

import json
import types

import numpy as np
import pytest

import squad_fixtures
from bertjax.tasks import squad_data
from bertjax.tasks import squad_eval


def _dataset(golds):
  """One paragraph per question; golds: id -> answer texts."""
  return [{"title": "t", "paragraphs": [
      {"context": "c", "qas": [{"id": qid, "question": "q", "answers": [
          {"text": t, "answer_start": 0} for t in texts]}]}
      for qid, texts in golds.items()]}]


@pytest.mark.parametrize("text,normalized", [
    ("The  Cat!", "cat"),
    ("an apple, a pear; THE end.", "apple pear end"),
    ("theater and atheist", "theater and atheist"),  # Whole words only.
    ("  U.S.-born\t(1895) ", "usborn 1895"),
    ("", ""),
])
def test_normalize_answer(text, normalized):
  assert squad_eval.normalize_answer(text) == normalized


def test_token_f1():
  # pred {big, cat, sat} vs gold {cat, sat, down}: P = R = 2/3.
  assert squad_eval.f1_v1("the big cat sat", "Cat sat down.") == (
      pytest.approx(2 / 3))
  # Repeated tokens count as often as both sides have them.
  assert squad_eval.f1_v1("a a b", "a b b") == pytest.approx(2 / 3)
  assert squad_eval.f1_v1("x", "y") == 0.0
  # An empty side: v1.1 gives 0 always, v2.0 gives 1 when both are empty.
  assert squad_eval.f1_v1("", "the") == 0.0
  assert squad_eval.f1_v2("", "the") == 1.0
  assert squad_eval.f1_v2("", "cat") == 0.0 and squad_eval.f1_v2("cat", "") == 0


def test_v1_takes_the_best_gold_answer_and_counts_missing_as_zero():
  dataset = _dataset({"a": ["Denver Broncos", "The Broncos"],
                      "b": ["Santa Clara, California", "Levi's Stadium"],
                      "c": ["1939"]})
  preds = {"a": "broncos", "b": "Levi's Stadium in Santa Clara"}
  result = squad_eval.evaluate_v1({"data": dataset}, preds)
  # a: EM 1 ("the broncos"); b: F1 max(2*(2/5)*(2/3)/(2/5+2/3), 2*(2/5)*1/(7/5))
  # = max(0.5, 0.571...); c: missing.
  assert result["exact_match"] == pytest.approx(100 / 3)
  assert result["f1"] == pytest.approx(100 * (1 + 4 / 7) / 3)
  assert (result["total"], result["missing"]) == (3, 1)


def test_v1_refuses_questions_without_answers_and_empty_data():
  with pytest.raises(ValueError, match="'a' has no gold answer"):
    squad_eval.evaluate_v1(_dataset({"a": []}), {"a": ""})
  with pytest.raises(ValueError, match="no questions to score"):
    squad_eval.evaluate_v1({"data": []}, {})


GOLDS_V2 = {"has1": ["Paris"], "has2": ["the Seine river", "Seine"],
            "none1": [], "none2": [], "has3": ["1939"]}
PREDS_V2 = {"has1": "Paris", "has2": "river", "none1": "", "none2": "Lyon",
            "has3": ""}


def test_v2_scores_and_splits():
  result = squad_eval.evaluate_v2(_dataset(GOLDS_V2), PREDS_V2, None)
  # EM: has1 1, has2 0, none1 1, none2 0, has3 0.  F1: has2 2*(1/1)*(1/2)/1.5.
  assert result["exact"] == pytest.approx(40.0)
  assert result["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 5)
  assert result["HasAns_exact"] == pytest.approx(100 / 3)
  assert result["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
  assert result["NoAns_exact"] == result["NoAns_f1"] == pytest.approx(50.0)
  assert (result["total"], result["HasAns_total"], result["NoAns_total"]) == (
      5, 3, 2)
  assert "best_f1" not in result


def test_v2_no_answer_probability_threshold():
  na_probs = {"has1": 0.1, "has2": 0.9, "none1": 0.2, "none2": 0.8,
              "has3": 0.95}
  result = squad_eval.evaluate_v2(_dataset(GOLDS_V2), PREDS_V2, na_probs,
                                  na_prob_thresh=0.5)
  # Above 0.5 counts as "": has2 0, none2 1, has3 0.
  assert result["exact"] == pytest.approx(60.0)
  assert result["f1"] == pytest.approx(60.0)
  # Best threshold: answer in order has1 (+1), none1 (0), none2 (-1), has2
  # (+2/3 F1, +0 EM), has3 (0). Starting from 2 (all unanswered): 3 after
  # has1, best EM 3/5 at 0.1; F1 best 3 at 0.1 as well (3 - 1 + 2/3 < 3).
  assert result["best_exact"] == pytest.approx(60.0)
  assert result["best_exact_thresh"] == 0.1
  assert result["best_f1"] == pytest.approx(60.0)
  assert result["best_f1_thresh"] == 0.1


def test_v2_best_threshold_from_null_odds():
  golds = {"a": ["x"], "b": [], "c": ["y"]}
  preds = {"a": "x", "b": "z", "c": "y"}
  # Null odds (any real numbers): answering a and c but not b is best, any
  # threshold in [-1, 2) does it; the search reports the highest answered.
  odds = {"a": -3.0, "c": -1.0, "b": 2.0}
  result = squad_eval.evaluate_v2(_dataset(golds), preds, odds)
  assert result["best_exact"] == pytest.approx(100.0)
  assert result["best_exact_thresh"] == -1.0


def test_v2_needs_every_prediction_and_probability():
  with pytest.raises(ValueError, match="1 of 5 questions have no prediction"):
    squad_eval.evaluate_v2(_dataset(GOLDS_V2),
                           {k: v for k, v in PREDS_V2.items() if k != "has2"},
                           None)
  with pytest.raises(ValueError, match="na_probs lacks 4 question ids"):
    squad_eval.evaluate_v2(_dataset(GOLDS_V2), PREDS_V2, {"has1": 0.0})


def test_v2_matches_transformers_port_of_the_official_script():
  metrics = pytest.importorskip("transformers.data.metrics.squad_metrics")
  rng = np.random.default_rng(3)
  words = ["the", "a", "cat", "dog", "sat", "Paris", "river,", "1939", "U.S."]
  golds, preds, probs = {}, {}, {}
  for i in range(60):
    qid = f"q{i}"
    golds[qid] = [" ".join(rng.choice(words, rng.integers(1, 5)))
                  for _ in range(rng.integers(0, 4))]
    preds[qid] = ("" if rng.random() < 0.3 else
                  " ".join(rng.choice(words, rng.integers(1, 5))))
    probs[qid] = float(rng.random())
  examples = [types.SimpleNamespace(
      qas_id=qid, answers=[{"text": t} for t in texts])
              for qid, texts in golds.items()]
  for thresh in (1.0, 0.5):
    ours = squad_eval.evaluate_v2(_dataset(golds), preds, probs, thresh)
    theirs = metrics.squad_evaluate(examples, preds, probs, thresh)
    assert set(theirs) <= set(ours)
    for key, value in theirs.items():
      assert ours[key] == pytest.approx(value), key
  assert 0 < ours["NoAns_total"] < ours["total"]


def test_scores_from_tfds_records_equal_those_from_the_json():
  data = squad_fixtures.squad_v2()
  preds = {qa["id"]: (qa["answers"][0]["text"][1:] if qa["answers"] else "")
           for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]}
  probs = {qid: i / 10 for i, qid in enumerate(preds)}
  from_json = squad_eval.evaluate_v2(data, preds, probs)
  records = list(squad_fixtures.tfds_records(data))
  assert squad_eval.evaluate_v2(records, preds, probs) == from_json
  assert 0 < from_json["HasAns_f1"] < 100 and from_json["NoAns_exact"] == 100
  v1 = squad_fixtures.squad_v1()
  v1_preds = {k: v for k, v in preds.items() if not k.startswith("q_none")}
  assert squad_eval.evaluate_v1(
      list(squad_fixtures.tfds_records(v1)), v1_preds) == (
          squad_eval.evaluate_v1(v1, v1_preds))


@pytest.mark.parametrize("version_2", [False, True])
def test_logits_pointing_at_the_gold_answers_score_100(tmp_path, version_2):
  data = squad_fixtures.squad_v2() if version_2 else squad_fixtures.squad_v1()
  tok = squad_fixtures.tokenizer(str(tmp_path), data)
  # The training features hold each answer's positions (0 where a window
  # lacks it or the question has none); logits peaking there are right.
  train, _ = squad_data.read_squad_examples(data, True, version_2)
  examples, _ = squad_data.read_squad_examples(data, False, version_2)
  kept = {e.qas_id for e in train}
  arrays = squad_data.features_to_arrays(
      squad_data.convert_examples_to_features(train, tok, 48, 16, 12,
                                              is_training=True))
  features = squad_data.convert_examples_to_features(
      [e for e in examples if e.qas_id in kept], tok, 48, 16, 12,
      is_training=False)
  start = np.zeros((len(features), 48), np.float32)
  end = np.zeros((len(features), 48), np.float32)
  rows = np.arange(len(features))
  start[rows, arrays["start_positions"]] = 5
  end[rows, arrays["end_positions"]] = 5
  kept_data = json.loads(json.dumps(data))
  for article in kept_data["data"]:
    for paragraph in article["paragraphs"]:
      paragraph["qas"] = [q for q in paragraph["qas"] if q["id"] in kept]
  result = squad_eval.evaluate_logits(
      kept_data, [e for e in examples if e.qas_id in kept], features, start,
      end, version_2, output_dir=str(tmp_path / "out"))
  # "Japan" is answered "Japanese" (one word): EM 0, F1 0 for that one.
  key = "exact" if version_2 else "exact_match"
  assert result[key] == pytest.approx(100 * (len(kept) - 1) / len(kept))
  assert (tmp_path / "out" / "predictions.json").exists()
  if version_2:
    assert result["NoAns_exact"] == 100.0
    assert "best_f1_thresh" in result
  with pytest.raises(ValueError, match="logit rows for"):
    squad_eval.evaluate_logits(kept_data, examples, features, start[:-1], end)
