"""SQuAD answers from start/end logits, as the original run_squad.py's
write_predictions makes them.

For each example, every window (feature) proposes the spans pairing its
`n_best_size` highest start logits with its `n_best_size` highest end logits
that lie in the document part, start in a token whose max-context window
this is, have start <= end and at most `max_answer_length` pieces. Spans are
ranked by start + end logit; the first `n_best_size` distinct texts form
the n-best list, with softmax probabilities over it. A span's text is the
original words it covers, joined by single spaces and trimmed to the
predicted pieces by `get_final_text` (the original's case, accents and
punctuation kept).

SQuAD v2.0 adds the null answer: its score s_null = S·C + E·C is the start
plus end logit at [CLS] (position 0), the lowest over the example's windows.
The null odds are s_null minus the best non-null span's score; the
prediction is "" when they exceed `null_score_diff_threshold`. Outputs, when
`output_dir` is given: predictions.json (id -> text), nbest_predictions.json
(id -> [{text, probability, start_logit, end_logit}]) and, for v2.0,
null_odds.json (id -> null odds), each JSON with indent 4.
"""

import collections
import functools
import json
import math
import os
from typing import Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from bertjax.records import fileio
from bertjax.text import basic_tokenizer

# The null score before any window is seen (the original's starting value).
_NO_NULL_SCORE = 1000000.0


class _Candidate(NamedTuple):
  feature_index: int
  start_index: int
  end_index: int
  start_logit: float
  end_logit: float


@functools.lru_cache(maxsize=2)
def _basic(do_lower_case: bool):
  basic = basic_tokenizer.BasicTokenizer(do_lower_case)
  return basic, basic.normalizer, basic.pre_tokenizer


def basic_tokens(text: str, do_lower_case: bool) -> list[str]:
  """Basic tokens of `text` as the WordPiece tokenizer's first step makes
  them: the original's BasicTokenizer(do_lower_case).tokenize(text), up to
  the differences basic_tokenizer.py lists."""
  basic, normalizer, pre_tokenizer = _basic(do_lower_case)
  normalized = normalizer.normalize_str(basic.prepare(text))
  return [token for token, _ in pre_tokenizer.pre_tokenize_str(normalized)]


def _non_spaces(text: str) -> np.ndarray:
  """Indexes of the characters of `text` other than " "."""
  codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
  return np.flatnonzero(codes != ord(" "))


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool) -> str:
  """The part of `orig_text` that `pred_text` (normalised pieces) covers.

  `orig_text` is basic-tokenized; where pred_text is found in it and the two
  have as many characters once spaces are removed, the characters align one
  to one and the matching stretch of orig_text is returned. Otherwise the
  whole orig_text is (the original's fallback).
  """
  tok_text = " ".join(basic_tokens(orig_text, do_lower_case))
  start = tok_text.find(pred_text)
  if start == -1:
    return orig_text
  end = start + len(pred_text) - 1
  orig_chars, tok_chars = _non_spaces(orig_text), _non_spaces(tok_text)
  if len(orig_chars) != len(tok_chars):
    return orig_text
  # The rank of pred_text's first and last characters among tok_text's
  # non-spaces; neither may be a space.
  first, last = np.searchsorted(tok_chars, [start, end])
  if (last >= len(tok_chars) or tok_chars[first] != start
      or tok_chars[last] != end):
    return orig_text
  return orig_text[orig_chars[first]:orig_chars[last] + 1]


def compute_softmax(scores: Sequence[float]) -> list[float]:
  if not scores:
    return []
  top = max(scores)
  exps = [math.exp(s - top) for s in scores]
  total = sum(exps)
  return [x / total for x in exps]


def best_indexes(logits: np.ndarray, n_best_size: int) -> np.ndarray:
  """Indexes of the n largest logits, the lower index first on ties."""
  return np.argsort(-logits, kind="stable")[:n_best_size]


def _feature_spans(feature, start_logits, end_logits, n_best_size,
                   max_answer_length) -> tuple[np.ndarray, np.ndarray]:
  """(starts, ends) of one window's valid spans, start-major over the best
  start and end indexes."""
  starts = best_indexes(start_logits, n_best_size)[:, None]
  ends = best_indexes(end_logits, n_best_size)[None, :]
  n = len(feature.tokens)
  s, e = np.minimum(starts, n - 1), np.minimum(ends, n - 1)
  to_orig = np.asarray(feature.token_to_orig_map)
  valid = ((starts < n) & (ends < n) & (to_orig[s] >= 0) & (to_orig[e] >= 0)
           & np.asarray(feature.token_is_max_context)[s] & (ends >= starts)
           & (ends - starts < max_answer_length))
  starts, ends = np.broadcast_arrays(starts, ends)
  return starts[valid], ends[valid]


def _span_text(example, feature, candidate, do_lower_case) -> str:
  pieces = feature.tokens[candidate.start_index:candidate.end_index + 1]
  tok_text = " ".join(pieces).replace(" ##", "").replace("##", "")
  tok_text = " ".join(tok_text.split())
  first = feature.token_to_orig_map[candidate.start_index]
  last = feature.token_to_orig_map[candidate.end_index]
  orig_text = " ".join(example.doc_tokens[first:last + 1])
  return get_final_text(tok_text, orig_text, do_lower_case)


def _logits(results, feature, example):
  if feature.unique_id not in results:
    raise ValueError(f"no result for feature {feature.unique_id} (question "
                     f"{example.qas_id!r}); results must cover every feature.")
  start_logits, end_logits = results[feature.unique_id]
  return np.asarray(start_logits), np.asarray(end_logits)


def _candidates(example, features, results, n_best_size, max_answer_length,
                version_2) -> tuple[Iterator[_Candidate], _Candidate]:
  """(the example's spans, best first, made as they are read; its null
  candidate), the null one among the spans for v2.0. Equal scores keep the
  order of the windows, then start-major order."""
  parts = []  # Per window: feature index, start, end, start and end logits.
  null = _Candidate(0, 0, 0, 0.0, 0.0)
  null_score = _NO_NULL_SCORE
  for index, feature in enumerate(features):
    start_logits, end_logits = _logits(results, feature, example)
    score = float(start_logits[0]) + float(end_logits[0])
    if score < null_score:
      null_score = score
      null = _Candidate(index, 0, 0, float(start_logits[0]),
                        float(end_logits[0]))
    starts, ends = _feature_spans(feature, start_logits, end_logits,
                                  n_best_size, max_answer_length)
    parts.append((np.full(len(starts), index), starts, ends,
                  start_logits[starts].astype(np.float64),
                  end_logits[ends].astype(np.float64)))
  if version_2:
    parts.append(([null.feature_index], [0], [0], [null.start_logit],
                  [null.end_logit]))
  if not parts:
    return iter(()), null
  index, starts, ends, start_logit, end_logit = map(np.concatenate,
                                                    zip(*parts))
  order = np.argsort(-(start_logit + end_logit), kind="stable")
  return (_Candidate(int(index[i]), int(starts[i]), int(ends[i]),
                     float(start_logit[i]), float(end_logit[i]))
          for i in order), null


def _nbest(example, features, candidates, null, n_best_size, do_lower_case,
           version_2) -> list[dict]:
  """The n-best list: distinct texts, best first, with probabilities."""
  entries, seen = [], set()
  for c in candidates:
    if len(entries) >= n_best_size:
      break
    text = ""
    if c.start_index > 0:
      text = _span_text(example, features[c.feature_index], c, do_lower_case)
      if text in seen:
        continue
    seen.add(text)
    entries.append((text, c.start_logit, c.end_logit))
  if version_2 and "" not in seen:
    entries.append(("", null.start_logit, null.end_logit))
  if not entries:  # No valid span at all: the original's placeholder.
    entries.append(("empty", 0.0, 0.0))
  probs = compute_softmax([s + e for _, s, e in entries])
  return [collections.OrderedDict(text=t, probability=p, start_logit=s,
                                  end_logit=e)
          for (t, s, e), p in zip(entries, probs)]


def best_non_null(nbest: Sequence[Mapping]) -> Optional[Mapping]:
  return next((entry for entry in nbest if entry["text"]), None)


def predictions_at_threshold(nbest: Mapping[str, Sequence[Mapping]],
                             null_odds: Mapping[str, float],
                             threshold: float) -> dict[str, str]:
  """v2.0 predictions for another null_score_diff_threshold, from the
  n-best lists and null odds of `write_predictions` (threshold=inf: never
  predict "", what the best-threshold search of squad_eval expects)."""
  out = {}
  for qid, entries in nbest.items():
    best = best_non_null(entries)
    null = best is None or null_odds[qid] > threshold
    out[qid] = "" if null else best["text"]
  return out


def write_predictions(examples, features, results, n_best_size: int = 20,
                      max_answer_length: int = 30, do_lower_case: bool = True,
                      version_2_with_negative: bool = False,
                      null_score_diff_threshold: float = 0.0,
                      output_dir: Optional[str] = None):
  """(predictions, nbest, null_odds) by question id; see the module docstring.

  `results` maps each feature's unique_id to (start_logits, end_logits).
  An example with no non-null span in v2.0 predicts "" with null odds inf.
  """
  by_example = collections.defaultdict(list)
  for feature in features:
    by_example[feature.example_index].append(feature)
  predictions = collections.OrderedDict()
  all_nbest = collections.OrderedDict()
  null_odds = collections.OrderedDict()
  for index, example in enumerate(examples):
    feats = by_example[index]
    candidates, null = _candidates(example, feats, results, n_best_size,
                                   max_answer_length, version_2_with_negative)
    nbest = _nbest(example, feats, candidates, null, n_best_size,
                   do_lower_case, version_2_with_negative)
    all_nbest[example.qas_id] = nbest
    if not version_2_with_negative:
      predictions[example.qas_id] = nbest[0]["text"]
      continue
    best = best_non_null(nbest)
    null_score = null.start_logit + null.end_logit if feats else _NO_NULL_SCORE
    diff = (math.inf if best is None else
            null_score - best["start_logit"] - best["end_logit"])
    null_odds[example.qas_id] = diff
    predictions[example.qas_id] = ("" if diff > null_score_diff_threshold
                                   else best["text"])
  if output_dir is not None:
    _write_outputs(output_dir, predictions, all_nbest,
                   null_odds if version_2_with_negative else None)
  return predictions, all_nbest, null_odds


def _write_outputs(output_dir, predictions, nbest, null_odds) -> None:
  files = {"predictions.json": predictions, "nbest_predictions.json": nbest}
  if null_odds is not None:
    files["null_odds.json"] = null_odds
  for name, value in files.items():
    fileio.write_text(os.path.join(output_dir, name),
                      json.dumps(value, indent=4) + "\n")
