"""Creates pre-masked BERT pretraining TFRecords from text.

  python -m bertjax.create_data --input_file='corpus/*.txt' \\
      --vocab_file=vocab.txt --output_dir=data/train_128 \\
      --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=10

The flags keep the names of the original BERT release's
create_pretraining_data.py; the output is a directory of shards
`part-XXXXX-of-YYYYY.tfrecord` (+ `.index`) and `metadata.json`. Runs on all
cores, streams, and resumes where it stopped when rerun with the same flags.
`--runner=beam:DataflowRunner` (or any Beam runner) runs the same creation as
an Apache Beam pipeline; further Beam options follow the flags.
"""

import os
import sys

from absl import app
from absl import flags

from bertjax.train import cli

_INPUT_FILE = flags.DEFINE_string(
    "input_file", None, "Input text files: comma-separated globs, local or "
    "gs://, .gz decompressed (for --input_format=directory: directories).")
_INPUT_FORMAT = flags.DEFINE_enum(
    "input_format", "sentences", ["sentences", "documents", "directory", "tfds"],
    "sentences: one sentence per line, blank lines between documents (the "
    "original format); documents: raw text, blank lines between documents; "
    "directory: one document per file; tfds: a TensorFlow Datasets split.")
_TFDS_NAME = flags.DEFINE_string("tfds_name", None,
                                 "TFDS dataset for --input_format=tfds.")
_TFDS_SPLIT = flags.DEFINE_string("tfds_split", "train", "TFDS split.")
_TFDS_FEATURE = flags.DEFINE_string("tfds_feature", "text",
                                    "TFDS feature holding a document's text.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None,
                                  "Directory for the shards and metadata.json.")
_VOCAB_FILE = flags.DEFINE_string(
    "vocab_file", None, "WordPiece vocab.txt, or SentencePiece .model with "
    "--tokenizer=sentencepiece.")
_TOKENIZER = flags.DEFINE_enum("tokenizer", "wordpiece",
                               ["wordpiece", "sentencepiece"], "Tokenizer kind.")
_TOKENIZER_COMPAT = flags.DEFINE_enum(
    "tokenizer_compat", "original", ["original", "hf"],
    "WordPiece's variant. original: the ids of the original BERT release's "
    "FullTokenizer (cased text not normalised, words of up to 200 "
    "characters, str.lower() lower-casing, e.g. a word-final sigma); hf: "
    "the ids of "
    "transformers.BertTokenizer (every category C* character dropped, text "
    "NFC-normalised, lower-casing per character, words over 100 characters "
    "become [UNK]).")
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", True,
                                   "Lower-case the input (uncased models).")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128,
                                       "Maximum sequence length.")
_MAX_PREDICTIONS = flags.DEFINE_integer(
    "max_predictions_per_seq", 20, "Maximum masked LM predictions per sequence.")
_MASKED_LM_PROB = flags.DEFINE_float("masked_lm_prob", 0.15,
                                     "Masked LM probability.")
_SHORT_SEQ_PROB = flags.DEFINE_float(
    "short_seq_prob", 0.1, "Probability of a shorter target sequence length.")
_DUPE_FACTOR = flags.DEFINE_integer(
    "dupe_factor", 10, "Passes over the input, each with different masks.")
_RANDOM_SEED = flags.DEFINE_integer("random_seed", 12345, "Random seed.")
_OBJECTIVE = flags.DEFINE_enum(
    "objective", "mlm+nsp", ["mlm+nsp", "mlm", "ltr"],
    "The records' objective (recorded in metadata.json; training checks it "
    "against --config.objective). mlm+nsp: the paper's sentence pairs; mlm: "
    "contiguous sentences filled to --max_seq_length across documents, a "
    "[SEP] between documents, no pairs (RoBERTa's FULL-SENTENCES); ltr: the "
    "same rows unmasked, for a left-to-right LM.")
_WWM = flags.DEFINE_bool("do_whole_word_mask", False,
                         "Mask all pieces of a word together.")
_NUM_OUTPUT_SHARDS = flags.DEFINE_integer("num_output_shards", 16,
                                          "Number of output TFRecord files.")
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", None, "Worker processes (default: all cores).")
_DOCS_PER_CHUNK = flags.DEFINE_integer(
    "docs_per_chunk", 2048, "Documents processed together, drawn at random "
    "from the whole input; the random-next segment B comes from another "
    "document of the same chunk.")
_PARTITION_MB = flags.DEFINE_float(
    "partition_mb", 4.0, "Megabytes of input per partition (the unit of "
    "work that makes instances); part of the settings the output depends on.")
_SPLIT_MB = flags.DEFINE_float(
    "split_mb", 64.0, "Uncompressed input files larger than this are read "
    "by several workers, in byte ranges of this size (the output does not "
    "depend on it).")
_RUNNER = flags.DEFINE_string(
    "runner", "local", "local (worker processes) or beam:<Runner>, e.g. "
    "beam:DirectRunner, beam:DataflowRunner, beam:FlinkRunner.")
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "Hide the progress bar.")


def main(argv):
  # Creation does no linear algebra: one OpenBLAS thread, not one per core
  # polling for work in every process.
  os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
  from bertjax.create import creation  # pylint: disable=g-import-not-at-top
  from bertjax.create import documents  # pylint: disable=g-import-not-at-top
  pipeline_args = argv[1:]
  runner = cli.beam_runner(_RUNNER.value, pipeline_args)
  if not _OUTPUT_DIR.value:
    raise app.UsageError("--output_dir is required.")
  if not _VOCAB_FILE.value:
    raise app.UsageError("--vocab_file is required.")
  from bertjax.records import fileio  # pylint: disable=g-import-not-at-top
  if not fileio.exists(_VOCAB_FILE.value):
    raise app.UsageError(f"--vocab_file={_VOCAB_FILE.value}: no such file.")
  if _TOKENIZER.value != "wordpiece" and _TOKENIZER_COMPAT.value != "original":
    raise app.UsageError(f"--tokenizer_compat={_TOKENIZER_COMPAT.value}: only "
                         "--tokenizer=wordpiece has variants.")
  if _NUM_WORKERS.value is not None and _NUM_WORKERS.value < 1:
    raise app.UsageError(f"--num_workers={_NUM_WORKERS.value}: must be >= 1.")
  config = creation.CreationConfig(
      max_seq_length=_MAX_SEQ_LENGTH.value,
      max_predictions_per_seq=_MAX_PREDICTIONS.value,
      masked_lm_prob=_MASKED_LM_PROB.value,
      short_seq_prob=_SHORT_SEQ_PROB.value,
      dupe_factor=_DUPE_FACTOR.value,
      random_seed=_RANDOM_SEED.value,
      whole_word_mask=_WWM.value,
      objective=_OBJECTIVE.value,
      num_output_shards=_NUM_OUTPUT_SHARDS.value,
      docs_per_chunk=_DOCS_PER_CHUNK.value,
      partition_bytes=max(1, int(_PARTITION_MB.value * 2**20)))
  try:
    config.validate()
    shards = documents.list_input_shards(
        _INPUT_FILE.value, _INPUT_FORMAT.value, tfds_name=_TFDS_NAME.value,
        tfds_split=_TFDS_SPLIT.value, tfds_feature=_TFDS_FEATURE.value,
        split_bytes=max(1, int(_SPLIT_MB.value * 2**20)))
    spec = creation.TokenizerSpec(_TOKENIZER.value, _VOCAB_FILE.value,
                                  _DO_LOWER_CASE.value, _TOKENIZER_COMPAT.value)
    source = documents.describe_source(_INPUT_FORMAT.value, _INPUT_FILE.value,
                                      _TFDS_NAME.value, _TFDS_SPLIT.value)
    if runner is None:
      creation.create_pretraining_data(
          shards, spec, config, _OUTPUT_DIR.value,
          num_workers=_NUM_WORKERS.value, source=source,
          show_progress=not _NO_PROGRESS.value)
    else:
      from bertjax.create import beam_pipeline  # pylint: disable=g-import-not-at-top
      beam_pipeline.run_beam(shards, spec, config, _OUTPUT_DIR.value,
                             runner=runner, source=source,
                             pipeline_args=pipeline_args)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def run():
  """Console-script entry point (bertjax-create-data)."""
  # Arguments after the flags go to Beam (or are refused by main).
  cli.run(main, flags_parser=cli.known_flags)


if __name__ == "__main__":
  run()
