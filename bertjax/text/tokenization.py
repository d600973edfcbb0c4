"""Tokenizers for pretraining data: WordPiece (Google vocab.txt), SentencePiece.

Both give what data creation needs: `encode_batch(texts)` (ids without
special tokens; `encode_flat` gives them as one int32 array and a count per
text), `vocab_size`, `special_ids` ({"pad", "unk", "cls", "sep",
"mask"} -> id), `is_word_start` (per id: does the piece start a word, for
whole-word masking), `vocab_hash()` (schema.vocab_hash of the pieces in id
order, recorded in metadata.json) and `describe()`.

WordPiece is Google's algorithm, id for id as the original release's
FullTokenizer with the same vocab: basic tokenization (clean, CJK, optional
lower-casing and accent stripping, punctuation; basic_tokenizer.py), then
greedy longest-match-first WordPiece with "##" continuations and [UNK] for
words of more than 200 characters or with no matching pieces. It runs in
Hugging Face `tokenizers` (Rust, batched). ASCII texts, most of an English
corpus, are split into words in numpy and each distinct word goes through
`tokenizers`' WordPiece once (ascii_words.py). The other texts take the
whole compiled pipeline, whose character classes cover the characters seen
so far (basic_tokenizer.py), so a tokenizer starts in a few hundredths of a
second instead of classifying all of Unicode first. `compat="hf"` gives
`transformers.BertTokenizer`'s variant instead (basic_tokenizer.py says how
it differs; words of more than 100 characters become [UNK]).
Special-token literals in text are not kept whole, as in the original:
"[MASK]" becomes "[", "mask", "]" (BertTokenizer keeps them whole unless
`split_special_tokens=True`), so text never yields a special id other than
[UNK].

SentencePiece models (unigram or BPE, trained by vocab.py with BERT's
special tokens at ids 0-4) use the `sentencepiece` library. With
`do_lower_case` the text is lower-cased in Python before encoding (models
trained lower-cased also fold case in their own normaliser, nmt_nfkc_cf).

Tokenizers pickle to their vocab (not their path), so worker processes and
Beam workers rebuild them without access to the vocab file.
"""

import functools
import os
import unicodedata
from typing import Iterator, Optional, Sequence

import numpy as np
import tokenizers

from bertjax.records import fileio
from bertjax.records import schema
from bertjax.text import ascii_words
from bertjax.text import basic_tokenizer
from bertjax.text import ragged

KINDS = ("wordpiece", "sentencepiece")
# special_ids keys, in schema.SPECIAL_TOKENS order.
SPECIAL_KEYS = ("pad", "unk", "cls", "sep", "mask")
WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁", starting a word's first piece.
_BATCH_CHARS = 1 << 20  # Characters of text encoded together (encode_flat).
_WORD_TEXTS = 8  # Texts new ASCII words are joined into (_encode_words).


def read_vocab(path: str) -> list[str]:
  """The tokens of a WordPiece vocab.txt (one per line) in id order."""
  try:
    data = fileio.read_bytes(path)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: cannot read the vocab file ({e}).") from e
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(
        f"{path}: not a UTF-8 vocab.txt (bad byte at offset {e.start}); for "
        "a SentencePiece .model use --tokenizer=sentencepiece.") from e
  tokens = [line.rstrip("\r") for line in text.split("\n")]
  if tokens and not tokens[-1]:
    tokens.pop()  # The final newline.
  first = {}
  for i, token in enumerate(tokens):
    if token in first:
      raise ValueError(
          f"{path}: line {i + 1}: token {token!r} is already on line "
          f"{first[token] + 1}; every token must appear once.")
    first[token] = i
  if not tokens:
    raise ValueError(f"{path}: the vocab file is empty.")
  return tokens


def _special_ids(vocab: dict[str, int], path: str,
                 fallback: Optional[dict[str, int]] = None) -> dict[str, int]:
  ids, missing = {}, []
  for key, token in zip(SPECIAL_KEYS, schema.SPECIAL_TOKENS):
    if token in vocab:
      ids[key] = vocab[token]
    elif fallback and fallback.get(key, -1) >= 0:
      ids[key] = fallback[key]
    else:
      missing.append(token)
  if missing:
    raise ValueError(
        f"{path}: the vocab lacks {', '.join(missing)}; BERT needs "
        f"{', '.join(schema.SPECIAL_TOKENS)}. Build a vocab with "
        "`python -m bertjax.text.vocab`, or add the missing tokens.")
  return ids


class Tokenizer:
  """The interface of both tokenizers; subclasses set these fields."""
  kind: str  # "wordpiece" or "sentencepiece".
  path: str  # The vocab.txt or .model it was loaded from.
  do_lower_case: bool
  tokens: tuple[str, ...]  # Pieces in id order.
  vocab: dict[str, int]  # Piece -> id.
  special_ids: dict[str, int]  # SPECIAL_KEYS -> id.
  is_word_start: tuple[bool, ...]  # Per id.

  @property
  def vocab_size(self) -> int:
    return len(self.tokens)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text, without special tokens."""
    raise NotImplementedError

  def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all texts back to back as int32, number of ids per text)."""
    return ragged.flatten(self.encode_batch(texts))

  def encode(self, text: str) -> list[int]:
    return self.encode_batch([text])[0]

  def tokenize(self, text: str) -> list[str]:
    return self.convert_ids_to_tokens(self.encode(text))

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    unk = self.special_ids["unk"]
    return [self.vocab.get(t, unk) for t in tokens]

  def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
    return [self.tokens[i] for i in ids]

  def vocab_hash(self) -> str:
    return schema.vocab_hash(self.tokens)

  def describe(self) -> dict:
    """The metadata's `tokenizer` entry."""
    return {"type": self.kind, "do_lower_case": self.do_lower_case,
            "vocab_file": os.path.basename(self.path),
            "vocab_size": self.vocab_size}


class WordPieceTokenizer(Tokenizer):
  """Google's WordPiece over a vocab.txt (see the module docstring)."""
  kind = "wordpiece"

  def __init__(self, vocab_file: str, do_lower_case: bool = True,
               tokens: Optional[Sequence[str]] = None,
               compat: str = "original"):
    self.path = vocab_file
    self.do_lower_case = bool(do_lower_case)
    self.tokens = tuple(read_vocab(vocab_file) if tokens is None else tokens)
    self.vocab = {t: i for i, t in enumerate(self.tokens)}
    self.special_ids = _special_ids(self.vocab, vocab_file)
    self.is_word_start = tuple(not t.startswith("##") for t in self.tokens)
    self.basic = basic_tokenizer.BasicTokenizer(self.do_lower_case, compat)
    self.compat = self.basic.compat
    self._ascii = ascii_words.AsciiWords(self._encode_words,
                                         self.do_lower_case)
    # (BasicTokenizer, compiled pipeline) for the characters seen so far.
    self._scoped = None

  def __reduce__(self):
    return (WordPieceTokenizer,
            (self.path, self.do_lower_case, self.tokens, self.compat))

  def describe(self) -> dict:
    return {**super().describe(), "compat": self.compat}

  @functools.cached_property
  def _tokenizer(self) -> tokenizers.Tokenizer:
    """The whole compiled pipeline (for decode), built on first use: its
    character classes take a pass over every code point."""
    return compiled_wordpiece(self.basic, self.vocab)

  @functools.cached_property
  def _word_pieces(self) -> tokenizers.Tokenizer:
    """WordPiece alone, for words that basic tokenization has made already:
    ASCII words with no punctuation, control character or (lower-cased)
    capital, which the whole pipeline leaves as they are."""
    return compiled_wordpiece(None, self.vocab,
                              self.basic.max_input_chars_per_word)

  def _encode_compiled(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids from the compiled pipeline alone (on all cores), with character
    classes of the characters seen so far (rebuilt when a text brings new
    ones, before and after `prepare`)."""
    if not texts:
      return []
    self._know(basic_tokenizer.chars_of(texts))
    texts = self._scoped[0].prepare_batch(texts)
    self._know(basic_tokenizer.chars_of(texts))
    return _ids(self._scoped[1], texts)

  def _know(self, chars: frozenset[str]) -> None:
    if self._scoped is None:
      basic = basic_tokenizer.BasicTokenizer(self.do_lower_case, self.compat,
                                             chars)
      self._scoped = (basic, compiled_wordpiece(basic, self.vocab))
    elif not chars <= self._scoped[0].chars:
      basic = basic_tokenizer.BasicTokenizer(
          self.do_lower_case, self.compat, self._scoped[0].chars | chars)
      pipeline = self._scoped[1]  # The same WordPiece, new classes.
      pipeline.normalizer = basic.normalizer
      pipeline.pre_tokenizer = basic.pre_tokenizer
      self._scoped = (basic, pipeline)

  def _encode_words(self, words: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of ASCII words made by ascii_words back to back as int32, ids per
    word). The words go to WordPiece joined by spaces into a few texts (on
    all cores unless TOKENIZERS_PARALLELISM=false), one `Encoding` per text
    instead of per word; each id's `word_ids` entry says which word it came
    from."""
    if not words:
      return np.zeros(0, np.int32), np.zeros(0, np.int64)
    cuts = np.linspace(0, len(words), min(_WORD_TEXTS, len(words)) + 1).astype(int).tolist()
    texts = [" ".join(words[a:b]) for a, b in zip(cuts, cuts[1:])]
    ids, counts = [], []
    for (a, b), e in zip(zip(cuts, cuts[1:]), self._word_pieces.encode_batch(
        texts, add_special_tokens=False)):
      ids.append(np.asarray(e.ids, np.int32))
      counts.append(np.bincount(np.asarray(e.word_ids, np.int64), minlength=b - a))
    counts = np.concatenate(counts)
    if len(counts) != len(words) or not counts.all():
      raise RuntimeError("WordPiece split the joined words differently")
    return np.concatenate(ids), counts

  def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all texts back to back as int32, number of ids per text).

    ASCII texts go through ascii_words (each distinct word tokenized once by
    WordPiece), the others through the compiled pipeline; about
    `_BATCH_CHARS` characters at a time, which bounds the memory the
    batch's words and arrays take.
    """
    parts = [self._encode_flat_batch(batch) for batch in _batches(list(texts))]
    if len(parts) == 1:
      return parts[0]
    ids, lengths = zip(*parts)
    return np.concatenate(ids), np.concatenate(lengths)

  def _encode_flat_batch(self, texts: list[str]
                         ) -> tuple[np.ndarray, np.ndarray]:
    is_ascii = np.fromiter(map(str.isascii, texts), bool, len(texts))
    if is_ascii.all():
      return self._ascii.encode_flat(texts)
    where = np.flatnonzero(is_ascii)
    ids_a, len_a = self._ascii.encode_flat([texts[i] for i in where])
    other = np.flatnonzero(~is_ascii)
    ids_o, len_o = ragged.flatten(
        self._encode_compiled([texts[i] for i in other]))
    lengths = np.zeros(len(texts), np.int64)
    lengths[where], lengths[other] = len_a, len_o
    # Each text's ids go where its run starts in the output.
    starts = np.cumsum(lengths) - lengths
    ids = np.empty(int(lengths.sum()), np.int32)
    ids[ragged.ranges(starts[where], len_a)] = ids_a
    ids[ragged.ranges(starts[other], len_o)] = ids_o
    return ids, lengths

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text, without special tokens."""
    ids, lengths = self.encode_flat(texts)
    ends = np.cumsum(lengths).tolist()
    flat = ids.tolist()
    return [flat[e - n:e] for e, n in zip(ends, lengths.tolist())]

  def decode(self, ids: Sequence[int]) -> str:
    return self._tokenizer.decode(list(ids), skip_special_tokens=False)


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model with BERT's special tokens (see vocab.py)."""
  kind = "sentencepiece"

  def __init__(self, model_file: str, do_lower_case: bool = True,
               model_proto: Optional[bytes] = None):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.path = model_file
    self.do_lower_case = bool(do_lower_case)
    if model_proto is None:
      try:
        model_proto = fileio.read_bytes(model_file)
      except (OSError, ValueError) as e:
        raise ValueError(f"{model_file}: cannot read the SentencePiece "
                         f"model ({e}).") from e
    self._proto = model_proto
    try:
      sp = spm.SentencePieceProcessor(model_proto=model_proto)
    except (RuntimeError, TypeError) as e:
      raise ValueError(
          f"{model_file}: not a SentencePiece model ({e}); for a WordPiece "
          "vocab.txt use --tokenizer=wordpiece.") from e
    self._sp = sp
    n = sp.get_piece_size()
    self.tokens = tuple(sp.id_to_piece(i) for i in range(n))
    self.vocab = {t: i for i, t in enumerate(self.tokens)}
    # Models from elsewhere (ALBERT's) name padding and unknown "<pad>" and
    # "<unk>": their declared ids stand in for [PAD] and [UNK].
    self.special_ids = _special_ids(self.vocab, model_file,
                                    {"pad": sp.pad_id(), "unk": sp.unk_id()})
    # Text always starts a word with a "▁" piece: [UNK] (an unknown
    # character) continues a word, a piece of punctuation starts one.
    self.is_word_start = tuple(
        t.startswith(WORD_BOUNDARY) or sp.is_control(i)
        or (_is_punctuation_piece(t) and not sp.is_unknown(i))
        for i, t in enumerate(self.tokens))

  def __reduce__(self):
    return (SentencePieceTokenizer,
            (self.path, self.do_lower_case, self._proto))

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text, without special tokens."""
    if not texts:
      return []
    if self.do_lower_case:
      texts = [t.lower() for t in texts]
    threads = 1 if os.environ.get("TOKENIZERS_PARALLELISM") == "false" else -1
    return self._sp.encode(list(texts), out_type=int, num_threads=threads)

  def decode(self, ids: Sequence[int]) -> str:
    return self._sp.decode(list(ids))


def _is_punctuation_piece(piece: str) -> bool:
  """A piece of punctuation only: a word of its own, as in WordPiece."""
  return bool(piece) and all(
      unicodedata.category(c).startswith("P") or (c.isascii() and
                                                   not c.isalnum())
      for c in piece)


def compiled_wordpiece(basic: Optional[basic_tokenizer.BasicTokenizer],
                       vocab: Optional[dict[str, int]] = None,
                       max_input_chars_per_word: Optional[int] = None
                       ) -> tokenizers.Tokenizer:
  """A `tokenizers` WordPiece over `basic`'s normaliser and pre-tokenizer;
  texts must go through `basic.prepare_batch` first. Without `vocab`, for
  training one. Without `basic`, WordPiece of whitespace-separated words
  only, each word of up to `max_input_chars_per_word` characters."""
  tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(
      vocab, unk_token=schema.SPECIAL_TOKENS[1],
      max_input_chars_per_word=(basic.max_input_chars_per_word if basic
                                else max_input_chars_per_word)))
  if basic is None:
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  else:
    tok.normalizer = basic.normalizer
    tok.pre_tokenizer = basic.pre_tokenizer
  tok.decoder = tokenizers.decoders.WordPiece()
  return tok


def _batches(texts: list[str]) -> Iterator[list[str]]:
  """`texts` in consecutive runs of about _BATCH_CHARS characters (at least
  one run)."""
  start, size = 0, 0
  for i, text in enumerate(texts):
    size += len(text)
    if size >= _BATCH_CHARS:
      yield texts[start:i + 1]
      start, size = i + 1, 0
  if start < len(texts) or not texts:
    yield texts[start:]


def _ids(tok: tokenizers.Tokenizer, texts: Sequence[str]) -> list[list[int]]:
  encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
  return [e.ids for e in encode(texts, add_special_tokens=False)]


def load_tokenizer(kind: str, path: str, do_lower_case: bool = True,
                   compat: str = "original") -> Tokenizer:
  """A WordPiece (vocab.txt) or SentencePiece (.model) tokenizer.

  `compat` (WordPiece only): "original" (the original release's
  FullTokenizer) or "hf" (transformers.BertTokenizer); see
  basic_tokenizer.py.
  """
  basic_tokenizer.check_compat(compat)
  if kind == "wordpiece":
    if path.endswith(".model"):
      raise ValueError(f"--vocab_file={path}: looks like a SentencePiece "
                       "model; use --tokenizer=sentencepiece.")
    return WordPieceTokenizer(path, do_lower_case, compat=compat)
  if kind == "sentencepiece":
    if compat != "original":
      raise ValueError(f"compat={compat!r}: only WordPiece has variants; "
                       "SentencePiece models carry their own normaliser.")
    return SentencePieceTokenizer(path, do_lower_case)
  raise ValueError(f"--tokenizer={kind}: must be one of {', '.join(KINDS)}.")
