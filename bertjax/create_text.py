"""Writes the paper's corpora as text: Wikipedia dumps and books to documents.

  python -m bertjax.create_text --source=wikipedia \\
      --input_file='enwiki-*-pages-articles*.xml*' --output_dir=text/wiki
  python -m bertjax.create_text --source=books --input_file='books/*.txt' \\
      --output_dir=text/books
  python -m bertjax.create_text --source=tfds --tfds_name=wikipedia/20230601.en \\
      --output_dir=text/wiki

The output is the original release's text format (one sentence a line, a
blank line between documents; one article or one book a document) in
balanced shards `part-XXXXX-of-YYYYY.txt` with `manifest.json`, the input
of `python -m bertjax.create_data --input_file='DIR/part-*.txt'`. Runs on all
cores, streams, and resumes where it stopped when rerun with the same flags.
`--runner=beam:DataflowRunner` (or any Beam runner) runs the same extraction
as an Apache Beam pipeline. The rules: docs/corpus.md.
"""

from absl import app
from absl import flags

from bertjax.train import cli

_SOURCE = flags.DEFINE_enum(
    "source", None, ["wikipedia", "books", "tfds"],
    "wikipedia: MediaWiki XML dumps (plain, .bz2, multistream .bz2, .gz); "
    "books: plain-text books (Project Gutenberg's format); tfds: a prepared "
    "TFDS split, wikipedia/* or pg19.")
_INPUT_FILE = flags.DEFINE_string(
    "input_file", None, "Input files: comma-separated globs, local or gs://.")
_TFDS_NAME = flags.DEFINE_string(
    "tfds_name", None, "TFDS dataset for --source=tfds, e.g. "
    "wikipedia/20230601.en or pg19.")
_TFDS_SPLIT = flags.DEFINE_string("tfds_split", "train", "TFDS split.")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "Directory for the text shards and manifest.json.")
_MIN_WORDS = flags.DEFINE_integer(
    "min_words", 100, "Documents with fewer words are dropped (stubs; about "
    "one 128-token sequence, docs/corpus.md).")
_NUM_OUTPUT_SHARDS = flags.DEFINE_integer(
    "num_output_shards", 64, "Output text files, of equal size to a "
    "document (fewer if there are fewer documents).")
_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", None, "Worker processes (default: all cores).")
_SPLIT_MB = flags.DEFINE_float(
    "split_mb", 32.0, "Megabytes of stored input per task: dump files are "
    "read in byte ranges of this size (the output does not depend on it).")
_RUNNER = flags.DEFINE_string(
    "runner", "local", "local (worker processes) or beam:<Runner>, e.g. "
    "beam:DirectRunner, beam:DataflowRunner.")
_NO_PROGRESS = flags.DEFINE_bool("no_progress", False, "Hide the progress bar.")


def main(argv):
  from bertjax.corpus import extraction  # pylint: disable=g-import-not-at-top
  pipeline_args = argv[1:]
  runner = cli.beam_runner(_RUNNER.value, pipeline_args)
  if not _SOURCE.value:
    raise app.UsageError("--source is required (wikipedia, books or tfds).")
  if not _OUTPUT_DIR.value:
    raise app.UsageError("--output_dir is required.")
  if _NUM_WORKERS.value is not None and _NUM_WORKERS.value < 1:
    raise app.UsageError(f"--num_workers={_NUM_WORKERS.value}: must be >= 1.")
  settings = extraction.Settings(
      source=_SOURCE.value, input_file=_INPUT_FILE.value or "",
      tfds_name=_TFDS_NAME.value or "", tfds_split=_TFDS_SPLIT.value,
      min_words=_MIN_WORDS.value, num_output_shards=_NUM_OUTPUT_SHARDS.value,
      split_mb=_SPLIT_MB.value)
  if runner is None:
    extraction.extract(settings, _OUTPUT_DIR.value,
                       num_workers=_NUM_WORKERS.value,
                       show_progress=not _NO_PROGRESS.value)
  else:
    from bertjax.corpus import beam_pipeline  # pylint: disable=g-import-not-at-top
    beam_pipeline.run_beam(settings, _OUTPUT_DIR.value,
                           runner=runner,
                           pipeline_args=pipeline_args)


def run():
  """Console-script entry point (bertjax-create-text)."""
  # Arguments after the flags go to Beam (or are refused by main).
  cli.run(main, flags_parser=cli.known_flags)


if __name__ == "__main__":
  run()
