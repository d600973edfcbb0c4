"""Runs parts of the original BERT release (PyPI's bert-tensorflow) for tests.

In a process of its own: the release defines absl flags at import time,
which would clash with other tests' flags in the pytest process.

  python original_release.py tokenize VOCAB LOWER IN_JSON OUT_JSON
      The release's FullTokenizer: ids of every text of IN_JSON.
  python original_release.py tokenize-cases VOCAB IN_JSON OUT_JSON
      The same, lower-cased and cased: {"uncased": ids, "cased": ids}.
  python original_release.py read MAX_SEQ MAX_PRED OUT_NPZ FILE...
      The release's pretraining input_fn (run_pretraining.input_fn_builder,
      evaluation mode): every whole batch of 8 it yields, as arrays.
  python original_release.py classify TASK DATA_DIR VOCAB MAX_SEQ OUT_NPZ [SPLIT]
      The release's run_classifier: TASK's (cola, mnli, mrpc) dev (or, with
      SPLIT test, test) examples as its processor reads them and
      convert_examples_to_features makes them.
  python original_release.py extract-features CKPT_DIR INPUT OUTPUT LAYERS MAX_SEQ BATCH
      The release's extract_features.py main() on the TF1 checkpoint in
      CKPT_DIR (bert_model.ckpt, bert_config.json, vocab.txt, lower-cased):
      its graph with test_tf1's stand-ins for tf.contrib and the exact GELU,
      its TPUEstimator replaced by a session that runs model_fn's predictions
      batch by batch (TensorFlow 2 has no estimator).
"""

import json
import sys
import types

import numpy as np


def _full_tokenizer_ids(vocab, lower, texts):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from bert import tokenization  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  tok = tokenization.FullTokenizer(vocab, do_lower_case=lower)
  return [tok.convert_tokens_to_ids(tok.tokenize(t)) for t in texts]


def tokenize(vocab, lower, in_json, out_json):
  with open(in_json, encoding="utf-8") as f:
    texts = json.load(f)
  ids = _full_tokenizer_ids(vocab, lower == "1", texts)
  with open(out_json, "w", encoding="utf-8") as f:
    json.dump(ids, f)


def tokenize_cases(vocab, in_json, out_json):
  with open(in_json, encoding="utf-8") as f:
    texts = json.load(f)
  out = {name: _full_tokenizer_ids(vocab, lower, texts)
         for name, lower in (("uncased", True), ("cased", False))}
  with open(out_json, "w", encoding="utf-8") as f:
    json.dump(out, f)


def read(max_seq, max_pred, out_npz, files):
  # run_pretraining imports the release's model code, which needs
  # TensorFlow 1's tf.contrib; its input function does not use it.
  for name in ("bert.modeling", "bert.optimization"):
    sys.modules[name] = types.ModuleType(name)
  from bert import run_pretraining  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  count = sum(1 for _ in tf.data.TFRecordDataset(files))
  input_fn = run_pretraining.input_fn_builder(
      files, int(max_seq), int(max_pred), is_training=False, num_cpu_threads=1)
  batch = 8
  dataset = input_fn({"batch_size": batch}).take(count // batch)
  out = {}
  for features in dataset:
    for k, v in features.items():
      out.setdefault(k, []).append(v.numpy())
  np.savez(out_npz, **{k: np.concatenate(v) for k, v in out.items()})


def classify(task, data_dir, vocab, max_seq, out_npz, split="dev"):
  for name in ("bert.modeling", "bert.optimization"):
    sys.modules[name] = types.ModuleType(name)
  from absl import flags  # pylint: disable=g-import-not-at-top
  from bert import run_classifier  # pylint: disable=g-import-not-at-top
  from bert import tokenization  # pylint: disable=g-import-not-at-top
  flags.FLAGS.mark_as_parsed()
  processor = {"cola": run_classifier.ColaProcessor, "mnli": run_classifier.MnliProcessor,
               "mrpc": run_classifier.MrpcProcessor}[task]()
  examples = (processor.get_test_examples(data_dir) if split == "test" else
              processor.get_dev_examples(data_dir))
  features = run_classifier.convert_examples_to_features(
      examples, processor.get_labels(), int(max_seq),
      tokenization.FullTokenizer(vocab, do_lower_case=True))
  np.savez(out_npz, **{k: np.array([getattr(f, k) for f in features])
                       for k in ("input_ids", "input_mask", "segment_ids", "label_id")})


def _session_estimator(real_tf, v1):
  """tf.estimator's names extract_features.main uses, predicting in a session."""
  class Estimator:
    def __init__(self, use_tpu, model_fn, config, predict_batch_size):
      del use_tpu, config
      self.model_fn, self.batch_size = model_fn, predict_batch_size

    def predict(self, input_fn, yield_single_examples=True):
      assert yield_single_examples
      with real_tf.Graph().as_default():
        dataset = input_fn({"batch_size": self.batch_size})
        features = v1.data.make_one_shot_iterator(dataset).get_next()
        predictions = self.model_fn(features, None, "infer", {})
        with v1.Session() as sess:
          sess.run(v1.global_variables_initializer())  # init_from_checkpoint's values.
          while True:
            try:
              batch = sess.run(predictions)
            except v1.errors.OutOfRangeError:
              return
            for i in range(len(batch["unique_id"])):
              yield {k: v[i] for k, v in batch.items()}

  tpu = types.SimpleNamespace(
      InputPipelineConfig=types.SimpleNamespace(PER_HOST_V2=2),
      RunConfig=lambda **kw: kw, TPUConfig=lambda **kw: kw, TPUEstimator=Estimator,
      TPUEstimatorSpec=lambda mode, predictions, scaffold_fn: predictions)
  return types.SimpleNamespace(ModeKeys=types.SimpleNamespace(PREDICT="infer"), tpu=tpu)


def extract_features(ckpt_dir, input_file, output_file, layers, max_seq, batch):
  import os  # pylint: disable=g-import-not-at-top
  from test_tf1 import _stand_in_tensorflow  # pylint: disable=g-import-not-at-top
  real_tf, v1 = _stand_in_tensorflow()
  from bert import extract_features as release  # pylint: disable=g-import-not-at-top
  from bert import modeling  # pylint: disable=g-import-not-at-top
  modeling.gelu = lambda x: 0.5 * x * (1.0 + v1.math.erf(x / np.sqrt(2.0)))
  v1.estimator = _session_estimator(real_tf, v1)
  release.FLAGS([
      "extract_features", f"--input_file={input_file}", f"--output_file={output_file}",
      f"--layers={layers}", f"--max_seq_length={max_seq}", f"--batch_size={batch}",
      f"--vocab_file={os.path.join(ckpt_dir, 'vocab.txt')}", "--do_lower_case=True",
      f"--bert_config_file={os.path.join(ckpt_dir, 'bert_config.json')}",
      f"--init_checkpoint={os.path.join(ckpt_dir, 'bert_model.ckpt')}"])
  release.main(None)


if __name__ == "__main__":
  command, args = sys.argv[1], sys.argv[2:]
  if command == "tokenize":
    tokenize(*args)
  elif command == "tokenize-cases":
    tokenize_cases(*args)
  elif command == "read":
    read(args[0], args[1], args[2], args[3:])
  elif command == "classify":
    classify(*args)
  elif command == "extract-features":
    extract_features(*args)
  else:
    raise SystemExit(f"unknown command {command!r}")
