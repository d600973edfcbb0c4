"""WordPiece tokenization speed: bertjax vs transformers' BertTokenizer.

  python -m bertjax.benchmarks.tokenize_bench [--copies 16] [--vocab_size 8000]
      [--reference_mb 1]

Builds a corpus of a few MB from the demo documents (Python's reference
documentation, create_data_bench.build_corpus) and a WordPiece vocab on it,
then times on its sentences:

* bertjax's `encode_batch` with the `tokenizers` thread pool (all cores) and
  on one thread, each time with a new tokenizer (an empty cache of ASCII
  words, ascii_words.py; the Unicode table check of basic_tokenizer.py is
  paid before timing), and the compiled `tokenizers` pipeline alone, which
  bertjax uses for non-ASCII text and for each new ASCII word;
* transformers' `BertTokenizer`, the original algorithm in Python, on the
  first --reference_mb MB of the same sentences (it is slow), checking that
  both give the same ids there.

Prints tokens/s and MB/s of input text. Figures depend on the machine;
nothing here is a test.
"""

import argparse
import os
import shutil
import tempfile
import time

from bertjax.benchmarks import create_data_bench
from bertjax.text import tokenization
from bertjax.text import vocab as vocab_lib


def _sentences(path):
  with open(path, encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


def _report(name, seconds, num_tokens, num_bytes):
  print(f"{name:<40} {seconds:8.3f} s {num_tokens / seconds:14,.0f} tok/s "
        f"{num_bytes / seconds / 1e6:8.2f} MB/s")
  return num_tokens / seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--copies", type=int, default=16)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--reference_mb", type=float, default=1.0)
  parser.add_argument("--cased", action="store_true")
  args = parser.parse_args()
  tmp = tempfile.mkdtemp(prefix="tokenize_bench_")
  try:
    corpus = create_data_bench.build_corpus(tmp, args.copies)
    vocab = os.path.join(tmp, "vocab.txt")
    vocab_lib.build_wordpiece_vocab([corpus], vocab,
                                    vocab_size=args.vocab_size,
                                    do_lower_case=not args.cased)
    sentences = _sentences(corpus)
    num_bytes = sum(len(s.encode("utf-8")) + 1 for s in sentences)
    non_ascii = sum(not s.isascii() for s in sentences) / len(sentences)
    print(f"corpus {num_bytes / 1e6:.1f} MB, {len(sentences):,} sentences "
          f"({non_ascii:.1%} with non-ASCII characters), vocab "
          f"{args.vocab_size}, {'cased' if args.cased else 'uncased'}, "
          f"{os.cpu_count()} cores")

    def fresh():  # A new tokenizer: its cache of ASCII words starts empty.
      tok = tokenization.load_tokenizer("wordpiece", vocab, not args.cased)
      tok.encode_batch([s for s in sentences[:1000] if not s.isascii()])
      return tok

    tok = fresh()
    start = time.time()
    ids = tok.encode_batch(sentences)
    num_tokens = sum(map(len, ids))
    ours = _report("bertjax encode_batch, all cores", time.time() - start,
                   num_tokens, num_bytes)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = fresh()
    start = time.time()
    tok.encode_batch(sentences)
    ours_one = _report("bertjax encode_batch, one thread", time.time() - start,
                       num_tokens, num_bytes)
    tok = fresh()
    start = time.time()
    tok._encode_compiled(sentences)  # pylint: disable=protected-access
    _report("compiled pipeline alone, one thread", time.time() - start,
            num_tokens, num_bytes)

    try:
      import transformers  # pylint: disable=g-import-not-at-top
    except ImportError:
      print("transformers is not installed: no reference figures.")
      return
    ref = transformers.BertTokenizer(vocab, do_lower_case=not args.cased)
    part, size = [], 0
    for s in sentences:
      if size >= args.reference_mb * 1e6:
        break
      part.append(s)
      size += len(s.encode("utf-8")) + 1
    start = time.time()
    ref_ids = [ref.convert_tokens_to_ids(ref.tokenize(s)) for s in part]
    seconds = time.time() - start
    ref_rate = _report("transformers BertTokenizer (Python)", seconds,
                       sum(map(len, ref_ids)), size)
    same = sum(a == b for a, b in zip(ids, ref_ids))
    print(f"identical ids on {same:,} of {len(part):,} reference sentences")
    print(f"speedup: {ours / ref_rate:.0f}x (all cores), "
          f"{ours_one / ref_rate:.0f}x (one thread)")
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
