"""SQuAD v1.1 and v2.0 as a fine-tuning task: data in, EM/F1 and prediction files out.

Reads SQuAD JSON from data_dir (train-v1.1.json, dev-v1.1.json or the -v2.0
files) or TFDS `squad/v1.1`, `squad/v2.0` when data_dir is empty; features
with the original run_squad's max_seq_length, doc_stride and
max_query_length (squad_data). Dev scoring runs the original's n-best
post-processing and the official evaluation (squad_postprocess, squad_eval)
and writes predictions.json, nbest_predictions.json and, for v2.0,
null_odds.json to the run's workdir; v2.0 results include the best
null_score_diff_threshold found on dev. load_test predicts any SQuAD-format
JSON (config.predict_file) with the same post-processing and files.
"""

import os

import numpy as np
from absl import logging

from bertjax.records import fileio
from bertjax.tasks import squad_data
from bertjax.tasks import squad_eval
from bertjax.tasks import squad_postprocess
from bertjax.tasks.split import Split

VERSIONS = ("1.1", "2.0")
# The paper's settings per version, taken where the config leaves 0.
PAPER = {"1.1": {"num_epochs": 3.0, "global_batch_size": 32},
         "2.0": {"num_epochs": 2.0, "global_batch_size": 48}}


def apply_version_defaults(config) -> None:
  """Fills num_epochs and global_batch_size left at 0 with the paper's for the version."""
  if config.version not in VERSIONS:
    raise ValueError(f"--config.version={config.version!r}: must be one of {VERSIONS}")
  for field, value in PAPER[config.version].items():
    if not config[field]:
      config[field] = value


def _articles(split: str, config) -> list[dict]:
  version = config.version
  if config.data_dir:
    name = f"{'train' if split == 'train' else 'dev'}-v{version}.json"
    path = os.path.join(config.data_dir, name)
    if not fileio.exists(path):
      raise FileNotFoundError(f"--config.data_dir={config.data_dir}: no {name} "
                              f"(SQuAD v{version} JSON)")
    return squad_data.load_articles(path)[0]
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  ds = tfds.load(f"squad/v{version}", split="train" if split == "train" else "validation",
                 data_dir=config.tfds_data_dir or None, shuffle_files=False)
  return squad_data.load_articles(tfds.as_numpy(ds))[0]


def load(split: str, tokenizer, config) -> Split:
  if split not in ("train", "dev"):
    raise ValueError(f"task squad has no split {split!r}; splits: ['dev', 'train']")
  apply_version_defaults(config)
  version_2 = config.version == "2.0"
  articles = _articles(split, config)
  training = split == "train"
  examples, features, arrays = _features(articles, split, training, tokenizer, config)
  if training:
    return Split(split, arrays, _no_score)

  def score(outputs, output_dir=None):
    start_logits, end_logits = (np.asarray(x) for x in outputs)
    return squad_eval.evaluate_logits(
        articles, examples, features, start_logits, end_logits, version_2=version_2,
        output_dir=output_dir, **_postprocess_options(config))
  return Split(split, arrays, score, writes_outputs=True, per_position_outputs=True)


def _features(articles, split: str, training: bool, tokenizer, config):
  """(examples, features, model arrays) of SQuAD articles, as run_squad makes them."""
  examples, skipped = squad_data.read_squad_examples(articles, training,
                                                     config.version == "2.0")
  features = squad_data.convert_examples_to_features(
      examples, tokenizer, config.max_seq_length, config.doc_stride,
      config.max_query_length, is_training=training)
  arrays = squad_data.features_to_arrays(features)
  del arrays["unique_ids"]
  logging.info("SQuAD v%s %s: %d questions (%d skipped), %d features.", config.version,
               split, len(examples), skipped, len(features))
  return examples, features, arrays


def _postprocess_options(config) -> dict:
  return dict(n_best_size=config.n_best_size, max_answer_length=config.max_answer_length,
              do_lower_case=config.do_lower_case,
              null_score_diff_threshold=config.null_score_diff_threshold)


def load_test(tokenizer, config) -> list[Split]:
  """config.predict_file (any SQuAD-format JSON, answers not needed) as run_squad's
  do_predict reads it; its Split's score(outputs, output_dir=) writes
  predictions.json, nbest_predictions.json and, for v2.0, null_odds.json."""
  apply_version_defaults(config)
  if not config.predict_file:
    raise ValueError("--config.predict_file: give the SQuAD-format JSON to predict "
                     "(e.g. dev-v1.1.json or your own questions)")
  articles = squad_data.load_articles(config.predict_file)[0]
  examples, features, arrays = _features(articles, "predict", False, tokenizer, config)

  def write(outputs, output_dir=None):
    start_logits, end_logits = (np.asarray(x) for x in outputs)
    results = {f.unique_id: (s, e) for f, s, e in zip(features, start_logits, end_logits)}
    predictions, _, _ = squad_postprocess.write_predictions(
        examples, features, results, version_2_with_negative=config.version == "2.0",
        output_dir=output_dir, **_postprocess_options(config))
    return {"questions": len(predictions)}
  return [Split("predict", arrays, write, writes_outputs=True, per_position_outputs=True)]


def _no_score(outputs):
  raise ValueError("the SQuAD training split is not scored")
