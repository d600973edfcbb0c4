"""Pretraining data creation speed: bertjax vs the original release's script.

  pip install -e ".[bench]"  # The original release (bert-tensorflow 1.0.4).
  python -m bertjax.benchmarks.create_data_bench [--copies 8] [--dupe_factor 10]
      [--max_seq_length 128] [--workers 2] [--repeat 1]

Builds a corpus from copies of the demo documents (Python's own
documentation, about 1.5 MB a copy; each copy with the documents shuffled
and every document's sentences rotated, so copies differ), a WordPiece vocab,
and then times, on the same corpus, vocab and settings:

* the original: google-research/bert's create_pretraining_data.py itself,
  as PyPI's bert-tensorflow package ships it, run in this process (imports
  not timed) with the same flags;
* bertjax with one worker process and the tokenizer on one thread (per-core
  figures), and with --workers processes.

Prints tokens/s and instances/s (tokens = non-padding tokens written) and
bertjax's speed-up over the original. Figures depend on the machine;
nothing here is a test. With --repeat N each bertjax run is repeated and
every run printed, since a shared machine's timings vary.
"""

import argparse
import os
import random
import shutil
import tempfile
import time

from bertjax.create import creation
from bertjax.create import demo
from bertjax.create import documents
from bertjax.records import schema


# --- The original. -----------------------------------------------------------

def run_original(input_file, vocab_file, output_file, max_seq_length,
                 max_pred, dupe_factor, seed=12345):
  """Runs the original script; returns (seconds, instances, tokens)."""
  try:
    from bert import create_pretraining_data as original  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit("The original script comes from the bert-tensorflow "
                     "package: pip install -e \".[bench]\" (or pass "
                     "--skip_reference).") from e
  original.FLAGS([
      "create_pretraining_data", f"--input_file={input_file}",
      f"--output_file={output_file}", f"--vocab_file={vocab_file}",
      "--do_lower_case=True", f"--max_seq_length={max_seq_length}",
      f"--max_predictions_per_seq={max_pred}", f"--random_seed={seed}",
      f"--dupe_factor={dupe_factor}", "--masked_lm_prob=0.15",
      "--short_seq_prob=0.1"])
  start = time.time()
  original.main(None)
  seconds = time.time() - start
  instances, tokens = _count(output_file, max_seq_length)
  return seconds, instances, tokens


def _count(path, max_seq_length):
  """(records, non-padding tokens) of a TFRecord file, with tf.data."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = {"input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64)}
  instances = tokens = 0
  for batch in tf.data.TFRecordDataset(path).batch(8192).map(
      lambda x: tf.io.parse_example(x, spec)["input_mask"]):
    instances += int(batch.shape[0])
    tokens += int(tf.reduce_sum(batch))
  return instances, tokens


# --- The benchmark. ----------------------------------------------------------

def build_corpus(directory, copies, seed=0):
  """Writes `copies` varied copies of the demo documents; returns the path."""
  docs = demo.demo_documents()
  rng = random.Random(seed)
  path = os.path.join(directory, "corpus.txt")
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(copies):
      order = list(range(len(docs)))
      rng.shuffle(order)
      for d in order:
        k = rng.randrange(len(docs[d]))
        f.write("\n".join(docs[d][k:] + docs[d][:k]) + "\n\n")
  return path


def _build_vocab(corpus, path, vocab_size):
  from bertjax.text import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  vocab_lib.build_wordpiece_vocab([corpus], path, vocab_size=vocab_size,
                                  do_lower_case=True)


def _report(name, seconds, instances, tokens, cores):
  print(f"{name:<34} {seconds:8.2f} s {instances / seconds:12,.0f} inst/s "
        f"{tokens / seconds:14,.0f} tok/s  ({cores} core{'s' * (cores > 1)})",
        flush=True)
  return instances / seconds


def _split_corpus(corpus, directory, n):
  """The corpus's documents dealt into n files, for the multi-process run."""
  os.makedirs(directory)
  with open(corpus, encoding="utf-8") as f:
    docs = f.read().split("\n\n")
  for p in range(n):
    with open(os.path.join(directory, f"part{p:02d}.txt"), "w",
              encoding="utf-8") as f:
      f.write("\n\n".join(docs[p::n]))
  return documents.list_input_shards(os.path.join(directory, "*.txt"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--copies", type=int, default=8)
  parser.add_argument("--dupe_factor", type=int, default=10)
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--max_predictions_per_seq", type=int, default=20)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--repeat", type=int, default=1)
  parser.add_argument("--skip_reference", action="store_true")
  args = parser.parse_args()
  os.environ["TOKENIZERS_PARALLELISM"] = "false"  # One thread: per-core figures.
  tmp = tempfile.mkdtemp(prefix="create_data_bench_")
  try:
    corpus = build_corpus(tmp, args.copies)
    vocab = os.path.join(tmp, "vocab.txt")
    _build_vocab(corpus, vocab, args.vocab_size)
    mb = os.path.getsize(corpus) / 1e6
    print(f"corpus {mb:.1f} MB, vocab {vocab}, max_seq_length "
          f"{args.max_seq_length}, dupe_factor {args.dupe_factor}")
    spec = creation.TokenizerSpec("wordpiece", vocab, True)
    runs = [("bertjax, 1 process", 1, documents.list_input_shards(corpus))]
    if args.workers > 1:
      runs.append((f"bertjax, {args.workers} processes", args.workers,
                   _split_corpus(corpus, os.path.join(tmp, "parts"),
                                 args.workers * 2)))
    config = creation.CreationConfig(
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        dupe_factor=args.dupe_factor, num_output_shards=8)
    best = {}
    for _ in range(args.repeat):
      for name, workers, shards in runs:
        out = os.path.join(tmp, "out")
        shutil.rmtree(out, ignore_errors=True)
        start = time.time()
        md = creation.create_pretraining_data(
            shards, spec, config, out, num_workers=workers,
            show_progress=False, log=lambda *a: None)
        rate = _report(name, time.time() - start, md.num_instances,
                       md.num_tokens, workers)
        best[name] = max(best.get(name, 0.0), rate)
        assert schema.read_metadata(out).num_instances == md.num_instances
    if not args.skip_reference:
      seconds, count, tokens = run_original(
          corpus, vocab, os.path.join(tmp, "original.tfrecord"),
          args.max_seq_length, args.max_predictions_per_seq, args.dupe_factor)
      ref = _report("original create_pretraining_data", seconds, count,
                    tokens, 1)
      for name, workers, _ in runs:
        print(f"{name}: {best[name] / ref:.1f}x the original's instances/s"
              + (f" ({best[name] / ref / workers:.1f}x per core)"
                 if workers > 1 else ""))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
