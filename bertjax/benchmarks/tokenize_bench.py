"""WordPiece tokenization speed on text that does not repeat itself.

  python -m bertjax.benchmarks.tokenize_bench [--min_mb 20] [--rounds 5]
      [--vocab_size 30522] [--reference_mb 1] [--cased] [--corpus FILE]

Takes the installed packages' docstrings (benchmarks/corpus.py, at least
--min_mb MB, no sentence repeated; or --corpus, one sentence per line),
trains a WordPiece vocab on them, then times, in --rounds rounds whose order
alternates, on one thread (TOKENIZERS_PARALLELISM=false):

* fast path: bertjax's `encode_flat` with a new tokenizer each time (ASCII
  texts split in numpy, each distinct word through `tokenizers` once,
  ascii_words.py; the others through the compiled pipeline);
* compiled: bertjax's compiled `tokenizers` pipeline alone on every text;
* transformers: `transformers.BertTokenizer` (Python) on the first
  --reference_mb MB of the sentences (it is slow).

Prints each one's median and range of MB/s of input text and of the paired
per-round ratios, and checks that the fast path and the compiled pipeline
give the same ids, and that bertjax's compat="hf" variant gives
BertTokenizer's ids on the reference part (special-token literals aside).
Figures depend on the machine and its load; nothing here is a test.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

from bertjax.benchmarks import corpus as corpus_lib
from bertjax.records import schema
from bertjax.text import tokenization
from bertjax.text import vocab as vocab_lib


def _sentences(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


def _size(texts) -> int:
  return sum(len(s.encode("utf-8")) + 1 for s in texts)


def _corpus(args, tmp: str) -> str:
  if args.corpus:
    return args.corpus
  path = os.path.join(tmp, "docstrings.txt")
  corpus_lib.write_corpus(path, corpus_lib.docstring_corpus(
      int(args.min_mb * 1e6)))
  return path


def _timed(fn, *inputs) -> tuple[float, object]:
  start = time.perf_counter()
  out = fn(*inputs)
  return time.perf_counter() - start, out


def _runners(vocab: str, lower: bool, sentences, reference):
  """name -> (a function of nothing that returns ids, MB it reads)."""
  import transformers  # pylint: disable=g-import-not-at-top
  load = lambda: tokenization.load_tokenizer("wordpiece", vocab, lower)
  compiled = load()
  ref = transformers.BertTokenizer(vocab, do_lower_case=lower)
  return {
      "fast path": (lambda: load().encode_flat(sentences),
                    _size(sentences) / 1e6),
      "compiled": (lambda: compiled._encode_compiled(sentences),  # pylint: disable=protected-access
                   _size(sentences) / 1e6),
      "transformers": (lambda: [ref.convert_tokens_to_ids(ref.tokenize(s))
                                for s in reference],
                       _size(reference) / 1e6),
  }


def _summary(values) -> str:
  return (f"median {statistics.median(values):8.2f}  range "
          f"{min(values):.2f}-{max(values):.2f}")


def _check(vocab, lower, sentences, reference, outputs) -> None:
  ids, lengths = outputs["fast path"]
  flat = [i for x in outputs["compiled"] for i in x]
  same = ids.tolist() == flat and lengths.tolist() == [
      len(x) for x in outputs["compiled"]]
  print(f"fast path and compiled give the same ids on all "
        f"{len(sentences):,} sentences: {same}")
  hf = tokenization.load_tokenizer("wordpiece", vocab, lower, compat="hf")
  # BertTokenizer keeps special-token literals ("[MASK]") whole; bertjax
  # splits them.
  pairs = [(g, w) for s, g, w in zip(
      reference, hf.encode_batch(reference), outputs["transformers"])
           if not any(t in s for t in schema.SPECIAL_TOKENS)]
  agree = sum(g == w for g, w in pairs)
  print(f"compat='hf' gives BertTokenizer's ids on {agree:,} of the "
        f"{len(pairs):,} reference sentences without special-token literals")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--min_mb", type=float, default=20.0)
  parser.add_argument("--corpus", default=None)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--vocab_size", type=int, default=30522)
  parser.add_argument("--reference_mb", type=float, default=1.0)
  parser.add_argument("--cased", action="store_true")
  args = parser.parse_args()
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  tmp = tempfile.mkdtemp(prefix="tokenize_bench_")
  try:
    path = _corpus(args, tmp)
    vocab = os.path.join(tmp, "vocab.txt")
    vocab_lib.build_wordpiece_vocab([path], vocab, vocab_size=args.vocab_size,
                                    do_lower_case=not args.cased)
    sentences = _sentences(path)
    reference, size = [], 0
    for s in sentences:
      if size >= args.reference_mb * 1e6:
        break
      reference.append(s)
      size += len(s.encode("utf-8")) + 1
    non_ascii = sum(not s.isascii() for s in sentences) / len(sentences)
    print(f"corpus {_size(sentences) / 1e6:.1f} MB, {len(sentences):,} "
          f"sentences ({non_ascii:.1%} with non-ASCII characters, "
          f"{len(set(sentences)) / len(sentences):.1%} distinct), vocab "
          f"{args.vocab_size}, {'cased' if args.cased else 'uncased'}, one "
          f"thread, {os.cpu_count()} cores")
    _time_rounds(args, vocab, sentences, reference)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _time_rounds(args, vocab, sentences, reference) -> None:
  runners = _runners(vocab, not args.cased, sentences, reference)
  names = list(runners)
  rates = {name: [] for name in names}
  outputs = {}
  for r in range(args.rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      fn, megabytes = runners[name]
      seconds, outputs[name] = _timed(fn)
      rates[name].append(megabytes / seconds)
      print(f"round {r + 1} {name:<14} {seconds:8.2f} s "
            f"{megabytes / seconds:8.2f} MB/s", flush=True)
  for name in names:
    print(f"{name:<14} MB/s {_summary(rates[name])}")
  for a, b in (("fast path", "compiled"), ("fast path", "transformers"),
               ("compiled", "transformers")):
    ratios = [x / y for x, y in zip(rates[a], rates[b])]
    print(f"{a} / {b:<14} {_summary(ratios)} (paired by round)")
  _check(vocab, not args.cased, sentences, reference, outputs)


if __name__ == "__main__":
  main()
