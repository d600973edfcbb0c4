"""Builds a WordPiece vocab.txt or a SentencePiece model for a new corpus.

  python -m bertjax.text.vocab --input_file='corpus/*.txt' \\
      --output=vocab.txt --vocab_size=30522 [--nodo_lower_case]
  python -m bertjax.text.vocab --input_file='corpus/*.txt.gz' \\
      --output=spm.model --vocab_size=32000 --tokenizer=sentencepiece \\
      --model_type=unigram

Inputs are text files (comma-separated globs, local or gs://, .gz read
decompressed), one sentence or paragraph per line. Both kinds put BERT's
special tokens first, in schema.SPECIAL_TOKENS order: [PAD]=0, [UNK]=1,
[CLS]=2, [SEP]=3, [MASK]=4, then (optionally) [unused0], [unused1], ...
slots for tokens added later.

WordPiece: Hugging Face's WordPiece trainer over the same normaliser and
pre-tokenizer as tokenization.WordPieceTokenizer, so the vocab is learnt from
the pieces the tokenizer will see. The vocab then holds every character of
its alphabet both as a word start "c" and as a continuation "##c" (as
Google's vocabs do, so no word of known characters becomes [UNK]); the
last-learnt pieces make room for them. The output is a Google-format
vocab.txt: one token per line, in id order. The trainer numbers "##" pieces in
hash-map order and breaks ties between equally frequent pairs by those
numbers, so two builds on the same corpus can differ in their late pieces
(huggingface/tokenizers issue 1794): keep the vocab.txt that a dataset was
made with.

SentencePiece: the `sentencepiece` trainer (unigram or BPE) with [PAD] and
[UNK] as its pad and unknown pieces and [CLS], [SEP], [MASK] as control
symbols (never produced from text); lower-cased models fold case in their
normaliser (nmt_nfkc_cf). Writes `PREFIX.model` and `PREFIX.vocab`.
"""

import io
import os
import sys
from typing import Iterator, Optional, Sequence

from absl import app
from absl import flags
import tokenizers

from bertjax.records import fileio
from bertjax.records import schema
from bertjax.text import basic_tokenizer
from bertjax.text import corpus
from bertjax.text import tokenization

_BATCH = 1000  # Lines handed to the trainer together.


def _text_batches(files: Sequence[str], prepare=None) -> Iterator[list[str]]:
  batch = []
  for line in corpus.iter_lines(files):
    batch.append(line)
    if len(batch) == _BATCH:
      yield prepare(batch) if prepare else batch
      batch = []
  if batch:
    yield prepare(batch) if prepare else batch


def _check_files(files: Sequence[str]) -> None:
  if not files:
    raise ValueError("--input_file: no input files given.")
  for path in files:
    if not fileio.exists(path):
      raise ValueError(f"--input_file: {path} does not exist.")


def _unused(num_unused: int) -> list[str]:
  return [f"[unused{i}]" for i in range(num_unused)]


def build_wordpiece_vocab(files: Sequence[str], output_path: str,
                          vocab_size: int = 30522, do_lower_case: bool = True,
                          min_frequency: int = 0,
                          limit_alphabet: Optional[int] = 1000,
                          num_unused: int = 0,
                          show_progress: bool = False) -> list[str]:
  """Trains a WordPiece vocab on `files`, writes it; returns its tokens.

  `limit_alphabet` keeps that many of the most frequent characters (raise
  it for scripts with large alphabets, e.g. 10000 or more for Chinese; None
  keeps all). The vocab holds at most `vocab_size` tokens; a small corpus
  may give fewer.
  """
  files = list(files)
  _check_files(files)
  specials = list(schema.SPECIAL_TOKENS) + _unused(num_unused)
  if vocab_size <= len(specials):
    raise ValueError(f"--vocab_size={vocab_size}: must exceed the "
                     f"{len(specials)} special and unused tokens.")
  basic = basic_tokenizer.BasicTokenizer(do_lower_case)
  tok = tokenization.compiled_wordpiece(basic)
  trainer = tokenizers.trainers.WordPieceTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency,
      show_progress=show_progress, special_tokens=specials,
      limit_alphabet=limit_alphabet, continuing_subword_prefix="##")
  tok.train_from_iterator(_text_batches(files, basic.prepare_batch),
                          trainer=trainer)
  ids = tok.get_vocab()
  tokens = sorted(ids, key=ids.get)
  if tokens[:len(specials)] != specials:
    raise RuntimeError(f"the trainer placed special tokens at "
                       f"{[ids.get(t) for t in specials]}.")
  if len(tokens) == len(specials):
    raise ValueError(f"--input_file: no text in {', '.join(files[:3])}.")
  tokens = _complete_alphabet(tokens, len(specials), vocab_size)
  fileio.write_bytes(output_path, ("\n".join(tokens) + "\n").encode("utf-8"))
  return tokens


def _complete_alphabet(tokens: list[str], num_special: int,
                       vocab_size: int) -> list[str]:
  """Adds "##c" for each character c and c for each "##c" missing.

  The trainer numbers pieces in the order it learns them, and a piece is
  made of earlier ones, so dropping the last-learnt pieces to make room
  leaves a consistent vocab.
  """
  chars = {t[2:] if t.startswith("##") else t for t in tokens[num_special:]
           if len(t) == 1 or (len(t) == 3 and t.startswith("##"))}
  alphabet = chars | {"##" + c for c in chars}
  missing = sorted(alphabet - set(tokens))
  excess = len(tokens) + len(missing) - vocab_size
  if excess > 0:
    learnt = [i for i in range(len(tokens) - 1, num_special - 1, -1)
              if tokens[i] not in alphabet]
    if len(learnt) < excess:
      raise ValueError(f"--vocab_size={vocab_size}: too small for the "
                       f"{len(alphabet)} pieces of the corpus' alphabet; "
                       "raise it or lower --limit_alphabet.")
    drop = set(learnt[:excess])
    tokens = [t for i, t in enumerate(tokens) if i not in drop]
  return tokens + missing


def train_sentencepiece(files: Sequence[str], model_prefix: str,
                        vocab_size: int, model_type: str = "unigram",
                        do_lower_case: bool = True,
                        character_coverage: float = 0.9995,
                        input_sentence_size: int = 10_000_000,
                        num_threads: Optional[int] = None,
                        hard_vocab_limit: bool = True) -> str:
  """Trains a SentencePiece model; returns the path of `PREFIX.model`.

  At most `input_sentence_size` lines, sampled, are used. With
  `hard_vocab_limit=False` a small corpus may give fewer pieces than
  `vocab_size` instead of an error.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  files = list(files)
  _check_files(files)
  if model_type not in ("unigram", "bpe"):
    raise ValueError(f"--model_type={model_type}: must be unigram or bpe.")
  pad, unk, cls, sep, mask = schema.SPECIAL_TOKENS
  model = io.BytesIO()
  lines = (line for batch in _text_batches(files) for line in batch)
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines, model_writer=model, vocab_size=vocab_size,
        model_type=model_type, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
        pad_piece=pad, unk_piece=unk, control_symbols=[cls, sep, mask],
        normalization_rule_name="nmt_nfkc_cf" if do_lower_case else "nmt_nfkc",
        character_coverage=character_coverage,
        input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
        num_threads=num_threads or os.cpu_count() or 1,
        hard_vocab_limit=hard_vocab_limit, minloglevel=2)
  except RuntimeError as e:
    raise ValueError(f"--vocab_size={vocab_size} --input_file="
                     f"{','.join(files[:3])}: SentencePiece training failed "
                     f"({e}).") from e
  data = model.getvalue()
  path = model_prefix + ".model"
  fileio.write_bytes(path, data)
  sp = spm.SentencePieceProcessor(model_proto=data)
  fileio.write_bytes(model_prefix + ".vocab", "".join(
      f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n"
      for i in range(sp.get_piece_size())).encode("utf-8"))
  return path


# ---------------------------------------------------------------------------
# Command line (flags are defined only when run as a program, so importing
# this module next to other flag-defining modules is safe).

def _define_flags():
  flags.DEFINE_string("input_file", None,
                      "Text files: comma-separated globs (local, gs://, .gz).")
  flags.DEFINE_string("output", None, "vocab.txt to write (WordPiece), or the "
                      "model path PREFIX.model (SentencePiece).")
  flags.DEFINE_integer("vocab_size", 30522, "Vocab size, special tokens "
                       "included.")
  flags.DEFINE_enum("tokenizer", "wordpiece", list(tokenization.KINDS),
                    "Kind of vocab.")
  flags.DEFINE_enum("model_type", "unigram", ["unigram", "bpe"],
                    "SentencePiece model type.")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case (uncased model).")
  flags.DEFINE_integer("min_frequency", 0, "WordPiece: least count of a "
                       "merged pair.")
  flags.DEFINE_integer("limit_alphabet", 1000, "WordPiece: characters kept "
                       "(0: all); raise for CJK.")
  flags.DEFINE_integer("num_unused", 0, "[unusedN] slots after the special "
                       "tokens.")
  flags.DEFINE_float("character_coverage", 0.9995, "SentencePiece: share of "
                     "characters covered (1.0 for small alphabets).")
  flags.DEFINE_integer("input_sentence_size", 10_000_000, "SentencePiece: "
                       "lines sampled for training.")


def main(argv):
  f = flags.FLAGS
  if len(argv) > 1:
    raise app.UsageError(f"Unknown arguments {argv[1:]}.")
  if not f.input_file:
    raise app.UsageError("--input_file is required (comma-separated globs).")
  if not f.output:
    raise app.UsageError("--output is required.")
  try:
    files = fileio.expand(f.input_file, "--input_file")
    if f.tokenizer == "wordpiece":
      tokens = build_wordpiece_vocab(
          files, f.output, vocab_size=f.vocab_size,
          do_lower_case=f.do_lower_case, min_frequency=f.min_frequency,
          limit_alphabet=f.limit_alphabet or None, num_unused=f.num_unused,
          show_progress=True)
      print(f"Wrote {len(tokens)} tokens to {f.output}")
    else:
      prefix = (f.output[:-len(".model")] if f.output.endswith(".model")
                else f.output)
      path = train_sentencepiece(
          files, prefix, f.vocab_size, model_type=f.model_type,
          do_lower_case=f.do_lower_case,
          character_coverage=f.character_coverage,
          input_sentence_size=f.input_sentence_size)
      print(f"Wrote {path} and {prefix}.vocab")
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
