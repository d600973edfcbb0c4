"""SQuAD features and predictions against the original release's run_squad.py
(PyPI's bert-tensorflow) on the same data, vocab and logits."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import squad_fixtures
from bertjax.tasks import squad_data
from bertjax.tasks import squad_postprocess

pytestmark = pytest.mark.slow


# The original release (bert-tensorflow); its run_squad.py itself needs
# TensorFlow 1's tf.contrib and is imported with stubs by tests/squad_original.py.
pytest.importorskip("bert.tokenization")
pytest.importorskip("tensorflow")

ORIGINAL_SCRIPT = os.path.join(os.path.dirname(__file__), "squad_original.py")
# Small windows, so the long paragraph spans several with overlaps, and a
# short query limit, so long questions are cut.
LENGTHS = {"max_seq_length": 40, "doc_stride": 12, "max_query_length": 10}
N_BEST, MAX_ANSWER = 12, 8


def _ours(data, tok, is_training, version_2):
  examples, _ = squad_data.read_squad_examples(data, is_training, version_2)
  return examples, squad_data.convert_examples_to_features(
      examples, tok, **LENGTHS, is_training=is_training)


def _logits(features, seed):
  """Random logits with a spread-out top; [CLS] strong in every window of
  every third example (its null score is the lowest over its windows)."""
  rng = np.random.default_rng(seed)
  n, length = len(features), LENGTHS["max_seq_length"]
  start = rng.normal(size=(n, length)).astype(np.float32) * 3
  end = rng.normal(size=(n, length)).astype(np.float32) * 3
  strong = np.array([f.example_index % 3 == 0 for f in features])
  start[strong, 0] += 8
  end[strong, 0] += 4
  return start, end


def _prepare(root, version_2):
  """Our predictions in root/ours; the script's spec for the original's."""
  data = squad_fixtures.squad_v2() if version_2 else squad_fixtures.squad_v1()
  path = squad_fixtures.write_json(root / "data.json", data)
  tok = squad_fixtures.tokenizer(str(root), data)
  examples, features = _ours(path, tok, False, version_2)
  start, end = _logits(features, seed=7 + version_2)
  logits = str(root / "logits.npz")
  np.savez(logits, unique_ids=[f.unique_id for f in features],
           start_logits=start, end_logits=end)
  results = {f.unique_id: (s, e) for f, s, e in zip(features, start, end)}
  ours = squad_postprocess.write_predictions(
      examples, features, results, N_BEST, MAX_ANSWER, True, version_2, -1.5,
      output_dir=str(root / "ours"))
  spec = dict(vocab=tok.path, lower=True, data=path, version_2=version_2,
              logits=logits, n_best_size=N_BEST, max_answer_length=MAX_ANSWER,
              threshold=-1.5, **LENGTHS)
  (root / "original").mkdir()
  return dict(root=root, out=root / "original", path=path, tok=tok,
              version_2=version_2, ours=ours,
              spec=squad_fixtures.write_json(root / "spec.json", spec))


@pytest.fixture(scope="module", name="runs")
def _runs(tmp_path_factory):
  """v1.1 and v2.0, the original's side in one process."""
  runs = {v2: _prepare(tmp_path_factory.mktemp(f"squad_v2_{v2}"), v2)
          for v2 in (False, True)}
  args = [str(x) for r in runs.values() for x in (r["spec"], r["out"])]
  result = subprocess.run([sys.executable, ORIGINAL_SCRIPT, *args], capture_output=True,
                          text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return runs


@pytest.fixture(params=[False, True], ids=["v1", "v2"], name="run")
def _run(runs, request):
  return runs[request.param]


def _load(path):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _as_original(feature):
  """Our feature in the original's layout (dicts over window positions)."""
  doc = np.flatnonzero(feature.token_to_orig_map >= 0)
  return {
      "unique_id": feature.unique_id,
      "example_index": feature.example_index,
      "doc_span_index": feature.doc_span_index,
      "tokens": feature.tokens,
      "token_to_orig_map": [[int(i), int(feature.token_to_orig_map[i])]
                            for i in doc],
      "token_is_max_context": [[int(i), bool(feature.token_is_max_context[i])]
                               for i in doc],
      "input_ids": feature.input_ids.tolist(),
      "input_mask": feature.input_mask.tolist(),
      "segment_ids": feature.segment_ids.tolist(),
      "start_position": feature.start_position,
      "end_position": feature.end_position,
      "is_impossible": feature.is_impossible,
  }


@pytest.mark.parametrize("is_training", [True, False], ids=["train", "eval"])
def test_features_match_the_original(run, is_training):
  name = "train_features.json" if is_training else "eval_features.json"
  theirs = _load(run["out"] / name)
  _, features = _ours(run["path"], run["tok"], is_training, run["version_2"])
  ours = [_as_original(f) for f in features]
  assert len(ours) == len(theirs)
  for a, b in zip(ours, theirs):
    assert a == b, (a["unique_id"], a["tokens"])
  # The fixture exercises what it is meant to: several windows per example,
  # answers outside a window, a skipped question (q_bad), cut questions.
  assert max(f["doc_span_index"] for f in ours) >= 3
  if is_training:
    assert any(f["start_position"] == 0 and not f["is_impossible"]
               for f in ours)
    assert any(f["start_position"] > 0 for f in ours)
    _, skipped = squad_data.read_squad_examples(run["path"], True,
                                                run["version_2"])
    assert skipped == 1
  assert any(f["tokens"].index("[SEP]") == 1 + LENGTHS["max_query_length"]
             for f in ours)


def test_predictions_match_the_original(run):
  predictions, nbest, null_odds = run["ours"]
  assert predictions == _load(run["out"] / "predictions.json")
  theirs = _load(run["out"] / "nbest_predictions.json")
  assert list(nbest) == list(theirs)
  for qid, entries in nbest.items():
    assert [e["text"] for e in entries] == [e["text"] for e in theirs[qid]]
    for key in ("probability", "start_logit", "end_logit"):
      np.testing.assert_allclose([e[key] for e in entries],
                                 [e[key] for e in theirs[qid]], rtol=1e-12)
  if run["version_2"]:
    odds = _load(run["out"] / "null_odds.json")
    assert list(null_odds) == list(odds)
    np.testing.assert_allclose(list(null_odds.values()), list(odds.values()),
                               rtol=1e-12)
    assert "" in predictions.values() and set(predictions.values()) != {""}
  assert len(set(predictions.values())) > 3


def test_written_files_match_the_original(run):
  names = ["predictions.json", "nbest_predictions.json"]
  if run["version_2"]:
    names.append("null_odds.json")
  assert sorted(os.listdir(run["root"] / "ours")) == sorted(names)
  for name in names:
    with open(run["root"] / "ours" / name, encoding="utf-8") as f:
      ours = f.read()
    with open(run["out"] / name, encoding="utf-8") as f:
      assert ours == f.read(), name
