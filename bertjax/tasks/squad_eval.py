"""SQuAD exact match and F1, as the official evaluation scripts define them.

v1.1 (evaluate-v1.1.py): answers are normalised (lower-cased, punctuation
and the articles a/an/the removed, whitespace collapsed); exact match and
token-level F1 are each the maximum over the gold answers; a question with
no prediction counts with score 0.

v2.0 (evaluate-v2.0.py): the same normalisation; a question whose gold
answers all normalise to "" is unanswerable and only "" matches it (F1 is 1
when prediction and gold are both empty, else 0). A prediction whose no-answer
probability `na_probs[qid]` exceeds `na_prob_thresh` counts as "". Scores
come overall and split into HasAns / NoAns; with `na_probs` given,
`best_exact` / `best_f1` are the scores at the best threshold and
`best_exact_thresh` / `best_f1_thresh` those thresholds (the official
`find_best_thresh`). `best_null_threshold` runs that search on the n-best
lists and null odds of `squad_postprocess.write_predictions`: its
`best_f1_thresh` is the `null_score_diff_threshold` with the best F1.

`dataset` is anything `squad_data.load_articles` reads: a SQuAD JSON path,
its parsed dict, its "data" list, or TFDS squad records.
"""

import collections
import logging
import math
import re
import string
from typing import Mapping, Optional

from bertjax.tasks import squad_data
from bertjax.tasks import squad_postprocess

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
  """Lower text and remove punctuation, articles and extra whitespace."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> int:
  return int(normalize_answer(prediction) == normalize_answer(gold))


def _overlap_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_tokens)
  recall = num_same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def f1_v1(prediction: str, gold: str) -> float:
  """v1.1's F1: 0 when nothing is shared (an empty answer included)."""
  return _overlap_f1(normalize_answer(prediction).split(),
                     normalize_answer(gold).split())


def f1_v2(prediction: str, gold: str) -> float:
  """v2.0's F1: an empty side scores 1 if both are empty, else 0."""
  pred_tokens = normalize_answer(prediction).split()
  gold_tokens = normalize_answer(gold).split()
  if not pred_tokens or not gold_tokens:
    return float(pred_tokens == gold_tokens)
  return _overlap_f1(pred_tokens, gold_tokens)


def gold_answers(dataset) -> dict[str, list[str]]:
  """Question id -> its gold answer texts, in the dataset's order."""
  articles, name = squad_data.load_articles(dataset)
  golds = {}
  for qa, _ in squad_data.iter_questions(articles, name):
    golds[qa["id"]] = [a["text"] for a in qa["answers"]]
  if not golds:
    raise ValueError(f"{name}: no questions to score.")
  return golds


def evaluate_v1(dataset, predictions: Mapping[str, str]) -> dict:
  """{"exact_match", "f1"} in percent (and "total", "missing"), as
  evaluate-v1.1.py computes them."""
  golds = gold_answers(dataset)
  em = f1 = 0.0
  missing = 0
  for qid, answers in golds.items():
    if not answers:
      raise ValueError(
          f"question {qid!r} has no gold answer; SQuAD v1.1 questions all "
          "have one (for SQuAD v2.0 data use evaluate_v2).")
    if qid not in predictions:
      logging.warning("Unanswered question %s will receive score 0.", qid)
      missing += 1
      continue
    em += max(exact_match(predictions[qid], a) for a in answers)
    f1 += max(f1_v1(predictions[qid], a) for a in answers)
  total = len(golds)
  return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total,
          "total": total, "missing": missing}


def raw_scores(golds: Mapping[str, list[str]], predictions: Mapping[str, str]
               ) -> tuple[dict[str, int], dict[str, float]]:
  """Per question: (exact match, F1) against its best gold answer, v2.0."""
  exact, f1 = {}, {}
  for qid, answers in golds.items():
    answers = [a for a in answers if normalize_answer(a)] or [""]
    pred = predictions[qid]
    exact[qid] = max(exact_match(pred, a) for a in answers)
    f1[qid] = max(f1_v2(pred, a) for a in answers)
  return exact, f1


def apply_no_answer_threshold(scores, na_probs, has_answer, na_prob_thresh):
  """Scores with predictions above the threshold counted as no-answer."""
  return {qid: float(not has_answer[qid]) if na_probs[qid] > na_prob_thresh
          else s for qid, s in scores.items()}


def _summary(exact, f1, qids) -> dict:
  total = len(qids)
  return {"exact": 100.0 * sum(exact[q] for q in qids) / total,
          "f1": 100.0 * sum(f1[q] for q in qids) / total, "total": total}


def find_best_threshold(predictions, scores, na_probs, has_answer
                        ) -> tuple[float, float]:
  """(best score in percent, its threshold): questions are answered in order
  of rising no-answer probability, starting from none answered."""
  best = current = sum(1 for v in has_answer.values() if not v)
  best_thresh = 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if has_answer[qid]:
      current += scores[qid]
    elif predictions[qid]:
      current -= 1
    if current > best:
      best, best_thresh = current, na_probs[qid]
  return 100.0 * best / len(scores), best_thresh


def evaluate_v2(dataset, predictions: Mapping[str, str],
                na_probs: Optional[Mapping[str, float]],
                na_prob_thresh: float = 1.0) -> dict:
  """evaluate-v2.0.py's output: exact, f1, total, HasAns_*, NoAns_*, and with
  `na_probs` given, best_exact(_thresh) and best_f1(_thresh)."""
  golds = gold_answers(dataset)
  missing = [qid for qid in golds if qid not in predictions]
  if missing:
    raise ValueError(
        f"{len(missing)} of {len(golds)} questions have no prediction (the "
        f"first: {missing[0]!r}); SQuAD v2.0 scores need one for every "
        "question (\"\" for no answer).")
  probs = dict(na_probs) if na_probs is not None else {q: 0.0 for q in golds}
  unscored = [qid for qid in golds if qid not in probs]
  if unscored:
    raise ValueError(
        f"na_probs lacks {len(unscored)} question ids (the first: "
        f"{unscored[0]!r}); it needs one value per question.")
  has_answer = {qid: bool(answers) for qid, answers in golds.items()}
  exact_raw, f1_raw = raw_scores(golds, predictions)
  exact = apply_no_answer_threshold(exact_raw, probs, has_answer,
                                    na_prob_thresh)
  f1 = apply_no_answer_threshold(f1_raw, probs, has_answer, na_prob_thresh)
  out = _summary(exact, f1, list(golds))
  for prefix, wanted in (("HasAns", True), ("NoAns", False)):
    qids = [qid for qid, has in has_answer.items() if has == wanted]
    if qids:
      out.update({f"{prefix}_{k}": v
                  for k, v in _summary(exact, f1, qids).items()})
  if na_probs is not None:
    for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
      best, thresh = find_best_threshold(predictions, raw, probs, has_answer)
      out[f"best_{name}"], out[f"best_{name}_thresh"] = best, thresh
  return out


def best_null_threshold(dataset, nbest: Mapping, null_odds: Mapping[str, float]
                        ) -> dict:
  """{best_exact, best_exact_thresh, best_f1, best_f1_thresh} over every
  v2.0 null_score_diff_threshold: questions are answered (with their best
  non-null span) in order of rising null odds."""
  predictions = squad_postprocess.predictions_at_threshold(nbest, null_odds,
                                                           math.inf)
  result = evaluate_v2(dataset, predictions, null_odds)
  return {k: v for k, v in result.items() if k.startswith("best_")}


def evaluate_logits(dataset, examples, features, start_logits, end_logits,
                    version_2: bool = False, output_dir: Optional[str] = None,
                    **options) -> dict:
  """Scores of a model's logits on `dataset` (the data `examples` were read
  from, with is_training=False): `start_logits` and `end_logits` [N, L] in
  `features` order. `options` go to `squad_postprocess.write_predictions`
  (n_best_size, max_answer_length, do_lower_case,
  null_score_diff_threshold), which writes its files to `output_dir`.

  v1.1: evaluate_v1's scores. v2.0: evaluate_v2's scores of the predictions
  at null_score_diff_threshold, plus best_null_threshold's.
  """
  if len(start_logits) != len(features) or len(end_logits) != len(features):
    raise ValueError(f"{len(start_logits)} start and {len(end_logits)} end "
                     f"logit rows for {len(features)} features; give one "
                     "row per feature, in order (padding rows removed).")
  results = {f.unique_id: (s, e)
             for f, s, e in zip(features, start_logits, end_logits)}
  predictions, nbest, null_odds = squad_postprocess.write_predictions(
      examples, features, results, version_2_with_negative=version_2,
      output_dir=output_dir, **options)
  if not version_2:
    return evaluate_v1(dataset, predictions)
  result = evaluate_v2(dataset, predictions, None)
  result.update(best_null_threshold(dataset, nbest, null_odds))
  return result
