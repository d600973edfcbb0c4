"""Pretraining data creation speed: bertjax vs the original script's design.

  python -m bertjax.benchmarks.create_data_bench [--copies 8] [--dupe_factor 10]
      [--max_seq_length 128] [--workers 2]

Builds a corpus from copies of the demo documents (Python's own
documentation, about 1.5 MB a copy; each copy with the documents shuffled
and every document's sentences rotated, so copies differ), a WordPiece vocab,
and then times, on the same corpus, vocab and settings:

* the reference: a single-process pure-Python port of the original release's
  create_pretraining_data.py: its Python tokenizer (basic tokenization with
  accent stripping and punctuation splitting, then greedy longest-match
  WordPiece), all documents in memory, the original instance loop with
  Python's random, and tf.train.Example + TFRecordWriter output;
* bertjax with one worker process and the tokenizer on one thread (per-core
  figures), and with --workers processes.

Prints tokens/s and instances/s (tokens = non-padding tokens written) and the
per-core ratio. Figures depend on the machine; nothing here is a test.
"""

import argparse
import collections
import os
import random
import shutil
import tempfile
import time
import unicodedata

from bertjax.data import creation
from bertjax.data import documents
from bertjax.data import demo
from bertjax.data import schema


# --- The reference: a port of the original script. ---------------------------

def _is_whitespace(ch):
  return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch):
  if ch in "\t\n\r":
    return False
  return unicodedata.category(ch).startswith("C")


def _is_punctuation(ch):
  cp = ord(ch)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(ch).startswith("P")


def _is_cjk(cp):
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF
          or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
          or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
          or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _whitespace_split(text):
  text = text.strip()
  return text.split() if text else []


class ReferenceTokenizer:
  """The original's FullTokenizer, pass for pass, in pure Python.

  Basic tokenization (clean text, space around CJK characters, split on
  whitespace, lower-case and strip accents, split on punctuation) followed by
  greedy longest-match-first WordPiece, with the same passes and per-character
  helper calls as the original, so its cost is the original's.
  """

  def __init__(self, vocab_file, do_lower_case=True):
    self.vocab = collections.OrderedDict()
    with open(vocab_file, encoding="utf-8") as f:
      for i, line in enumerate(f):
        self.vocab[line.strip()] = i
    self.do_lower_case = do_lower_case

  @staticmethod
  def _clean_text(text):
    out = []
    for ch in text:
      cp = ord(ch)
      if cp == 0 or cp == 0xFFFD or _is_control(ch):
        continue
      out.append(" " if _is_whitespace(ch) else ch)
    return "".join(out)

  @staticmethod
  def _space_cjk(text):
    out = []
    for ch in text:
      if _is_cjk(ord(ch)):
        out.extend((" ", ch, " "))
      else:
        out.append(ch)
    return "".join(out)

  @staticmethod
  def _strip_accents(text):
    out = []
    for ch in unicodedata.normalize("NFD", text):
      if unicodedata.category(ch) == "Mn":
        continue
      out.append(ch)
    return "".join(out)

  @staticmethod
  def _split_on_punc(text):
    chars, i, start_new_word, output = list(text), 0, True, []
    while i < len(chars):
      ch = chars[i]
      if _is_punctuation(ch):
        output.append([ch])
        start_new_word = True
      else:
        if start_new_word:
          output.append([])
        start_new_word = False
        output[-1].append(ch)
      i += 1
    return ["".join(x) for x in output]

  def _basic(self, text):
    text = self._space_cjk(self._clean_text(text))
    split_tokens = []
    for token in _whitespace_split(text):
      if self.do_lower_case:
        token = self._strip_accents(token.lower())
      split_tokens.extend(self._split_on_punc(token))
    return _whitespace_split(" ".join(split_tokens))

  def _wordpiece(self, text):
    output = []
    for token in _whitespace_split(text):
      chars = list(token)
      if len(chars) > 200:
        output.append("[UNK]")
        continue
      is_bad, start, sub_tokens = False, 0, []
      while start < len(chars):
        end, cur = len(chars), None
        while start < end:
          substr = "".join(chars[start:end])
          if start > 0:
            substr = "##" + substr
          if substr in self.vocab:
            cur = substr
            break
          end -= 1
        if cur is None:
          is_bad = True
          break
        sub_tokens.append(cur)
        start = end
      if is_bad:
        output.append("[UNK]")
      else:
        output.extend(sub_tokens)
    return output

  def tokenize(self, text):
    return [p for token in self._basic(text) for p in self._wordpiece(token)]

  def convert_tokens_to_ids(self, tokens):
    return [self.vocab[t] for t in tokens]


def _ref_masked_lm(tokens, masked_lm_prob, max_pred, vocab_words, rng):
  cand = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
  rng.shuffle(cand)
  output = list(tokens)
  num_to_predict = min(max_pred, max(1, int(round(len(tokens) * masked_lm_prob))))
  masked, covered = [], set()
  for index in cand:
    if len(masked) >= num_to_predict:
      break
    if index in covered:
      continue
    covered.add(index)
    if rng.random() < 0.8:
      output[index] = "[MASK]"
    elif rng.random() < 0.5:
      output[index] = tokens[index]
    else:
      output[index] = vocab_words[rng.randint(0, len(vocab_words) - 1)]
    masked.append((index, tokens[index]))
  masked.sort(key=lambda x: x[0])
  return output, [m[0] for m in masked], [m[1] for m in masked]


def _ref_document(all_documents, document_index, max_seq_length,
                  short_seq_prob, masked_lm_prob, max_pred, vocab_words, rng):
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3
  target = max_num_tokens
  if rng.random() < short_seq_prob:
    target = rng.randint(2, max_num_tokens)
  out, chunk, length, i = [], [], 0, 0
  while i < len(document):
    chunk.append(document[i])
    length += len(document[i])
    if i == len(document) - 1 or length >= target:
      if chunk:
        a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
        tokens_a = [t for seg in chunk[:a_end] for t in seg]
        tokens_b = []
        if len(chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          for _ in range(10):
            r = rng.randint(0, len(all_documents) - 1)
            if r != document_index:
              break
          other = all_documents[r]
          for j in range(rng.randint(0, len(other) - 1), len(other)):
            tokens_b.extend(other[j])
            if len(tokens_b) >= target - len(tokens_a):
              break
          i -= len(chunk) - a_end
        else:
          is_random_next = False
          for j in range(a_end, len(chunk)):
            tokens_b.extend(chunk[j])
        while len(tokens_a) + len(tokens_b) > max_num_tokens:
          longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
          if rng.random() < 0.5:
            del longer[0]
          else:
            longer.pop()
        tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
        tokens, positions, labels = _ref_masked_lm(
            tokens, masked_lm_prob, max_pred, vocab_words, rng)
        out.append((tokens, segment_ids, positions, labels, is_random_next))
      chunk, length = [], 0
    i += 1
  return out


def run_reference(input_file, vocab_file, output_file, max_seq_length,
                  max_pred, dupe_factor, seed=12345, masked_lm_prob=0.15,
                  short_seq_prob=0.1):
  """The original script end to end; returns (instances, tokens written)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tokenizer = ReferenceTokenizer(vocab_file)
  rng = random.Random(seed)
  all_documents = [[]]
  with tf.io.gfile.GFile(input_file, "r") as reader:
    while True:
      line = reader.readline()
      if not line:
        break
      line = line.strip()
      if not line:
        all_documents.append([])
      tokens = tokenizer.tokenize(line)
      if tokens:
        all_documents[-1].append(tokens)
  all_documents = [d for d in all_documents if d]
  rng.shuffle(all_documents)
  vocab_words = list(tokenizer.vocab.keys())
  made = []
  for _ in range(dupe_factor):
    for d in range(len(all_documents)):
      made.extend(_ref_document(all_documents, d, max_seq_length,
                                short_seq_prob, masked_lm_prob, max_pred,
                                vocab_words, rng))
  rng.shuffle(made)

  def ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

  num_tokens = 0
  with tf.io.TFRecordWriter(output_file) as writer:
    for tokens, segment_ids, positions, labels, is_random_next in made:
      input_ids = tokenizer.convert_tokens_to_ids(tokens)
      num_tokens += len(input_ids)
      input_mask = [1] * len(input_ids)
      segment_ids = list(segment_ids)
      while len(input_ids) < max_seq_length:
        input_ids.append(0)
        input_mask.append(0)
        segment_ids.append(0)
      positions = list(positions)
      label_ids = tokenizer.convert_tokens_to_ids(labels)
      weights = [1.0] * len(label_ids)
      while len(positions) < max_pred:
        positions.append(0)
        label_ids.append(0)
        weights.append(0.0)
      features = collections.OrderedDict()
      features["input_ids"] = ints(input_ids)
      features["input_mask"] = ints(input_mask)
      features["segment_ids"] = ints(segment_ids)
      features["masked_lm_positions"] = ints(positions)
      features["masked_lm_ids"] = ints(label_ids)
      features["masked_lm_weights"] = tf.train.Feature(
          float_list=tf.train.FloatList(value=weights))
      features["next_sentence_labels"] = ints([1 if is_random_next else 0])
      example = tf.train.Example(features=tf.train.Features(feature=features))
      writer.write(example.SerializeToString())
  return len(made), num_tokens


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
  from bertjax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  vocab_lib.build_wordpiece_vocab([corpus], path, vocab_size=vocab_size,
                                  do_lower_case=True)


def _report(name, seconds, instances, tokens, cores):
  print(f"{name:<34} {seconds:8.2f} s {instances / seconds:12,.0f} inst/s "
        f"{tokens / seconds:14,.0f} tok/s  ({cores} core{'s' * (cores > 1)})")
  return instances / seconds / cores


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--copies", type=int, default=8)
  parser.add_argument("--dupe_factor", type=int, default=10)
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--max_predictions_per_seq", type=int, default=20)
  parser.add_argument("--vocab_size", type=int, default=8000)
  parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
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
    shards = documents.list_input_shards(corpus)
    # The same corpus cut into files, for the multi-process run.
    parts_dir = os.path.join(tmp, "parts")
    os.makedirs(parts_dir)
    with open(corpus, encoding="utf-8") as f:
      docs = f.read().split("\n\n")
    n = max(args.workers * 2, 2)
    for p in range(n):
      with open(os.path.join(parts_dir, f"part{p:02d}.txt"), "w",
                encoding="utf-8") as f:
        f.write("\n\n".join(docs[p::n]))
    config = creation.CreationConfig(
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        dupe_factor=args.dupe_factor, num_output_shards=8)
    results = {}
    start = time.time()
    md = creation.create_pretraining_data(
        shards, spec, config, os.path.join(tmp, "ours1"), num_workers=1,
        show_progress=False, log=lambda *a: None)
    results["ours"] = _report("bertjax, 1 process", time.time() - start,
                              md.num_instances, md.num_tokens, 1)
    if args.workers > 1:
      start = time.time()
      md2 = creation.create_pretraining_data(
          documents.list_input_shards(os.path.join(parts_dir, "*.txt")), spec,
          config, os.path.join(tmp, "oursN"), num_workers=args.workers,
          show_progress=False, log=lambda *a: None)
      _report(f"bertjax, {args.workers} processes", time.time() - start,
              md2.num_instances, md2.num_tokens, args.workers)
    if not args.skip_reference:
      start = time.time()
      count, tokens = run_reference(
          corpus, vocab, os.path.join(tmp, "ref.tfrecord"), args.max_seq_length,
          args.max_predictions_per_seq, args.dupe_factor)
      results["ref"] = _report("original design, pure Python", time.time() - start,
                               count, tokens, 1)
      print(f"per-core speedup (instances/s): {results['ours'] / results['ref']:.1f}x")
    assert schema.read_metadata(os.path.join(tmp, "ours1")) is not None
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
