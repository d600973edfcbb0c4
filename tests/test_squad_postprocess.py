"""SQuAD post-processing on hand-made logits (the original release itself is
compared in test_squad_original.py)."""

import json
import math

import numpy as np
import pytest

from bertjax.records import schema
from bertjax.tasks import squad_data
from bertjax.tasks import squad_eval
from bertjax.tasks import squad_postprocess
from bertjax.text import tokenization

CONTEXT = "Steve Smith's dog,  Rex, barked at the Grünwald postman."
L = 40


@pytest.fixture(name="made", scope="module")
def _made(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  words = ["q", "who", "steve", "smith", "'", "s", "dog", ",", "rex",
           "barked", "at", "the", "grun", "##wald", "postman", "."]
  path.write_text("\n".join(list(schema.SPECIAL_TOKENS) + words) + "\n",
                  encoding="utf-8")
  tok = tokenization.WordPieceTokenizer(str(path), True)
  data = {"data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": [
      {"id": "a", "question": "who q", "answers": []}]}]}]}
  examples, _ = squad_data.read_squad_examples(data, False)
  features = squad_data.convert_examples_to_features(examples, tok, L, 128, 8,
                                                     is_training=False)
  return examples, features


def _predict(made, starts, ends, cls=(-10.0, -10.0), **kw):
  """Logits of -10 except at the given {token: logit} positions."""
  examples, features = made
  tokens = features[0].tokens
  start, end = np.full(L, -10, np.float32), np.full(L, -10, np.float32)
  start[0], end[0] = cls
  for logits, picks in ((start, starts), (end, ends)):
    for token, value in picks.items():
      # The first in the document, else in the question.
      position = tokens.index(token, 4 if token in tokens[4:] else 0)
      logits[position] = value
  results = {features[0].unique_id: (start, end)}
  return squad_postprocess.write_predictions(examples, features, results, **kw)


def test_the_best_span_maps_back_to_the_original_text(made):
  predictions, nbest, _ = _predict(made, {"steve": 5}, {"smith": 5, "s": 1})
  # "steve smith" is found in "Steve Smith's": case and the "'s" go.
  assert predictions == {"a": "Steve Smith"}
  assert nbest["a"][0]["text"] == "Steve Smith"
  assert nbest["a"][1]["text"] == "Steve Smith's"
  assert nbest["a"][0]["start_logit"] == 5.0


def test_max_answer_length_and_start_before_end(made):
  starts, ends = {"steve": 5, "rex": 1}, {"postman": 9, "smith": 4, "q": 20}
  # steve..postman is 14 pieces; the end in the question never counts.
  long, _, _ = _predict(made, starts, ends, max_answer_length=30)
  # The words are joined by one space (the context has two after "dog,").
  assert long == {"a": "Steve Smith's dog, Rex, barked at the Grünwald "
                       "postman"}
  short, _, _ = _predict(made, starts, ends, max_answer_length=10)
  assert short == {"a": "Rex, barked at the Grünwald postman"}
  # An end before every start is no span; the best valid pair wins.
  back, _, _ = _predict(made, {"barked": 9, "steve": 1}, {"dog": 9, "at": .5})
  assert back == {"a": "Steve Smith's dog"}


def test_n_best_list_is_distinct_and_sums_to_one(made):
  _, nbest, _ = _predict(made, {"steve": 5, "dog": 4, "rex": 3},
                         {"smith": 5, "dog": 4, "rex": 3}, n_best_size=4)
  entries = nbest["a"]
  texts = [e["text"] for e in entries]
  assert len(entries) == 4 and len(set(texts)) == 4
  assert math.isclose(sum(e["probability"] for e in entries), 1.0)
  scores = [e["start_logit"] + e["end_logit"] for e in entries]
  assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("text,orig,lower,final", [
    ("steve smith", "Steve Smith's", True, "Steve Smith"),
    ("grunwald", "Grünwald,", True, "Grünwald"),
    ("rex , barked", "Rex, barked", True, "Rex, barked"),
    ("Smith", "Smith's", False, "Smith"),
    ("smith", "Smith's", False, "Smith's"),  # Not found: all of it.
    # Accent stripping shortens the text: no alignment, all of it.
    ("ecole", "e\u0301cole's", True, "e\u0301cole's"),
    ("ecole", "\u00e9cole's", True, "\u00e9cole"),
])
def test_get_final_text(text, orig, lower, final):
  assert squad_postprocess.get_final_text(text, orig, lower) == final


def test_v2_null_score_and_threshold(made):
  kw = dict(starts={"steve": 3}, ends={"smith": 2}, cls=(4.0, 2.5),
            version_2_with_negative=True)
  predictions, nbest, odds = _predict(made, **kw)
  # s_null = 4 + 2.5; best span 3 + 2: odds 1.5 > 0 -> no answer.
  assert odds == {"a": pytest.approx(1.5)}
  assert predictions == {"a": ""}
  assert nbest["a"][0]["text"] == ""
  predictions, _, _ = _predict(made, **kw, null_score_diff_threshold=2.0)
  assert predictions == {"a": "Steve Smith"}
  assert squad_postprocess.predictions_at_threshold(nbest, odds, 2.0) == (
      predictions)


def test_output_files(made, tmp_path):
  for v2, names in ((False, ["nbest_predictions.json", "predictions.json"]),
                    (True, ["nbest_predictions.json", "null_odds.json",
                            "predictions.json"])):
    out = tmp_path / f"v2_{v2}"
    predictions, nbest, odds = _predict(
        made, {"steve": 5}, {"smith": 5}, version_2_with_negative=v2,
        output_dir=str(out))
    assert sorted(p.name for p in out.iterdir()) == names
    text = (out / "predictions.json").read_text(encoding="utf-8")
    assert text == json.dumps(predictions, indent=4) + "\n"
    assert json.loads((out / "nbest_predictions.json").read_text()) == nbest
    if v2:
      assert json.loads((out / "null_odds.json").read_text()) == odds


def test_examples_without_features(made):
  examples, _ = made
  predictions, nbest, _ = squad_postprocess.write_predictions(
      examples, [], {})
  assert predictions == {"a": "empty"} and len(nbest["a"]) == 1
  predictions, _, odds = squad_postprocess.write_predictions(
      examples, [], {}, version_2_with_negative=True)
  assert predictions == {"a": ""} and odds == {"a": math.inf}


def test_missing_results_are_named(made):
  examples, features = made
  with pytest.raises(ValueError, match="no result for feature 1000000000"):
    squad_postprocess.write_predictions(examples, features, {})


def test_best_null_threshold_is_the_best_f1_on_the_data(tmp_path):
  # Hand-made n-best lists and null odds for four questions.
  golds = {"a": ["Paris"], "b": [], "c": ["Seine"], "d": []}
  nbest = {q: [{"text": t, "start_logit": 0.0, "end_logit": 0.0}, {"text": ""}]
           for q, t in (("a", "Paris"), ("b", "Lyon"), ("c", "river"),
                        ("d", "Nice"))}
  odds = {"a": -2.0, "b": 1.0, "c": -0.5, "d": -1.0}
  dataset = {"data": [{"title": "t", "paragraphs": [{"context": "x", "qas": [
      {"id": q, "question": "?", "answers": [{"text": t, "answer_start": 0}
                                             for t in texts]}
      for q, texts in golds.items()]}]}]}
  best = squad_eval.best_null_threshold(dataset, nbest, odds)
  # Answering only a (threshold in [-2, -1)) is best: a 1, b 1, c 0, d 1.
  assert best["best_f1_thresh"] == -2.0
  assert best["best_f1"] == pytest.approx(75.0)
  predictions = squad_postprocess.predictions_at_threshold(
      nbest, odds, best["best_f1_thresh"])
  assert predictions == {"a": "Paris", "b": "", "c": "", "d": ""}
  rescored = squad_eval.evaluate_v2(dataset, predictions, None)
  assert rescored["f1"] == pytest.approx(best["best_f1"])
