"""Runs the original release's run_squad.py (PyPI's bert-tensorflow) for tests.

In a process of its own: the release defines absl flags at import time.

  python squad_original.py SPEC_JSON OUT_DIR [SPEC_JSON OUT_DIR ...]

Each SPEC_JSON holds vocab, lower, data (a SQuAD JSON path), version_2,
max_seq_length, doc_stride, max_query_length and, optionally, logits (an
.npz with unique_ids, start_logits, end_logits), n_best_size,
max_answer_length and threshold. Writes OUT_DIR/train_features.json and
OUT_DIR/eval_features.json (the release's features, as JSON) and, with
logits, the release's predictions.json, nbest_predictions.json and
null_odds.json from those logits.
"""

import json
import os
import sys
import types

import numpy as np


def _features(run_squad, tokenizer, spec, is_training):
  examples = run_squad.read_squad_examples(spec["data"], is_training)
  features = []
  run_squad.convert_examples_to_features(
      examples, tokenizer, spec["max_seq_length"], spec["doc_stride"],
      spec["max_query_length"], is_training, features.append)
  return examples, features


def _as_json(feature):
  out = dict(vars(feature))
  for key in ("token_to_orig_map", "token_is_max_context"):
    out[key] = sorted(out[key].items())
  return out


def run(spec_path, out_dir):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from bert import run_squad  # pylint: disable=g-import-not-at-top
  from bert import tokenization  # pylint: disable=g-import-not-at-top
  with open(spec_path, encoding="utf-8") as f:
    spec = json.load(f)
  flags.FLAGS([
      "run_squad", f"--version_2_with_negative={spec['version_2']}",
      f"--null_score_diff_threshold={spec.get('threshold', 0.0)}"])
  tokenizer = tokenization.FullTokenizer(spec["vocab"], spec["lower"])
  for is_training in (True, False):
    examples, features = _features(run_squad, tokenizer, spec, is_training)
    name = "train_features.json" if is_training else "eval_features.json"
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
      json.dump([_as_json(x) for x in features], f)
  if "logits" not in spec:
    return
  logits = np.load(spec["logits"])
  results = [run_squad.RawResult(int(u), [float(x) for x in s],
                                 [float(x) for x in e])
             for u, s, e in zip(logits["unique_ids"], logits["start_logits"],
                                logits["end_logits"])]
  run_squad.write_predictions(
      examples, features, results, spec["n_best_size"],
      spec["max_answer_length"], spec["lower"],
      os.path.join(out_dir, "predictions.json"),
      os.path.join(out_dir, "nbest_predictions.json"),
      os.path.join(out_dir, "null_odds.json"))


if __name__ == "__main__":
  for module in ("bert.modeling", "bert.optimization"):
    sys.modules[module] = types.ModuleType(module)  # Need TF1's tf.contrib.
  args = sys.argv[1:]
  for i in range(0, len(args), 2):
    run(args[i], args[i + 1])
