"""WordPiece of ASCII text by word: split in numpy, each distinct word once.

For ASCII text, BERT's basic tokenization is simple: drop control characters
(all but tab, newline and return), optionally lower-case, split on
whitespace, and make every punctuation character (every printable
non-alphanumeric, ASCII's 33-47, 58-64, 91-96 and 123-126) a word of its
own. WordPiece then maps each word to its pieces on its own. So `AsciiWords`
does the basic step on a whole batch of texts at once in numpy, and sends
only the words it has not seen before through the compiled WordPiece
(`tokenizers`; its basic steps have nothing left to do on such words);
every other word is found in a cache of the words seen so far. The compiled
WordPiece stays the reference for every word (the unknown-word rule and the
word length limit included), so the ids are its ids. Texts with any
non-ASCII character do not come here (tokenization.WordPieceTokenizer).

The cache is searched without a Python object per word: every word of a
batch gets a 64-bit hash in numpy (a random number per byte value and place
in the word, the places from the 64th on sharing one table, summed with the
word's length), the hashes are looked up in an open-addressing table of the
cached words' hashes, and then every word's bytes are compared with those
of the cached word it was matched to, so a hash collision can never give a
wrong id: on one, the cache is hashed again with new random tables.

The cache starts over when a batch's new words would take it past
`max_words` (a single batch's own words are always kept while it is
encoded), so memory stays bounded on any corpus: about 130 bytes a word of
English text (its bytes, ids, hash and hash-table slots), some 16 MB at the
default of 2**17 words.
"""

from typing import Callable, Sequence

import numpy as np

from bertjax.text import ragged

_TEXT_END = 0  # NUL, always dropped from text, ends each text in the stream.
_PLACES = 64  # Places in a word with their own hash tables (then they repeat).


def _byte_tables(do_lower_case: bool):
  """(byte -> byte, byte -> copies): 0 drops a byte, 3 makes " c "."""
  to_byte = np.arange(256, dtype=np.uint8)
  copies = np.ones(256, np.int64)
  for cp in range(128):
    ch = chr(cp)
    if ch == "\n":
      copies[cp] = 3  # " \0 ": the end of a text.
      to_byte[cp] = _TEXT_END
    elif ch in "\t\r ":
      to_byte[cp] = 32  # Whitespace separates words.
    elif cp < 32 or cp == 127:
      copies[cp] = 0  # Control characters go, as in the original.
    elif not ch.isalnum():
      copies[cp] = 3  # Punctuation is a word of its own.
    elif do_lower_case and ch.isupper():
      to_byte[cp] = ord(ch.lower())
  return to_byte, copies


class Words:
  """A batch's words: their bytes back to back (`chars`), where each starts
  there and its length."""

  def __init__(self, chars: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    self.chars, self.starts, self.lengths = chars, starts, lengths

  def __len__(self) -> int:
    return len(self.lengths)


class AsciiWords:
  """Ids of ASCII texts, with each distinct word tokenized once."""

  def __init__(self, encode_words: Callable[[list[str]], tuple[np.ndarray, np.ndarray]],
               do_lower_case: bool, max_words: int = 1 << 17, seed: int = 0):
    """`encode_words(words)`: (their ids back to back, ids per word)."""
    self._encode_words = encode_words
    self._to_byte, self._copies = _byte_tables(do_lower_case)
    self.max_words = max_words
    self._rng = np.random.default_rng(seed)
    self._new_tables()
    self._reset()

  def __len__(self) -> int:
    """The number of words cached (the text end included)."""
    return len(self._count)

  def _new_tables(self) -> None:
    self._tables = self._rng.integers(0, 2**64, (_PLACES, 256), np.uint64,
                                      endpoint=False).ravel()
    self._length_mix = self._rng.integers(1, 2**64, dtype=np.uint64) | np.uint64(1)

  def _reset(self) -> None:
    # Row 0 is the text end, which has no ids.
    self._chars = np.array([_TEXT_END], np.uint8)  # Every word's bytes, back to back.
    self._char_start = np.zeros(1, np.int64)  # Where each word's bytes begin.
    self._length = np.ones(1, np.int64)  # Each word's number of bytes.
    self._pieces = np.zeros(0, np.int32)  # Every word's ids, back to back.
    self._start = np.zeros(1, np.int64)  # Where each word's ids begin.
    self._count = np.zeros(1, np.int64)  # How many ids each word has.
    self._rehash()

  def _hash(self, words: Words) -> np.ndarray:
    """A uint64 per word (_PLACES tables of 256 random numbers)."""
    if not len(words):
      return np.zeros(0, np.uint64)
    # Each byte's place in its word: a running count that restarts at words.
    place = np.ones(len(words.chars), np.int32)
    place[words.starts[1:]] = 1 - words.lengths[:-1]
    place[0] = 0
    np.cumsum(place, out=place)
    np.minimum(place, _PLACES - 1, out=place)
    place <<= 8
    place += words.chars
    with np.errstate(over="ignore"):
      sums = np.add.reduceat(np.take(self._tables, place), words.starts)
      return sums + words.lengths.astype(np.uint64) * self._length_mix

  def _rehash(self) -> None:
    """Hashes every cached word again and rebuilds the hash table."""
    self._hashes = self._hash(Words(self._chars, self._char_start, self._length))
    self._build_table()

  def _build_table(self) -> None:
    """An open-addressing table (linear probing) of the cached words' hashes,
    at most a quarter full: slot -> (hash, row; -1 where empty)."""
    bits = max(12, (4 * len(self._hashes) - 1).bit_length())
    self._shift = np.uint64(64 - bits)
    self._slot_hash = np.zeros(1 << bits, np.uint64)
    self._slot_row = np.full(1 << bits, -1, np.int64)
    self._insert(self._hashes, np.arange(len(self._hashes)))

  def _insert(self, hashes: np.ndarray, rows: np.ndarray) -> None:
    wrap = len(self._slot_row) - 1
    slots = (hashes >> self._shift).astype(np.int64)
    while len(rows):
      free = np.flatnonzero(self._slot_row[slots] < 0)
      # Of the rows that reach one free slot, the first takes it; the others
      # and those that found it full go on to the next.
      _, first = np.unique(slots[free], return_index=True)
      won = free[first]
      self._slot_hash[slots[won]], self._slot_row[slots[won]] = hashes[won], rows[won]
      left = np.ones(len(rows), bool)
      left[won] = False
      hashes, rows, slots = hashes[left], rows[left], (slots[left] + 1) & wrap

  def _find(self, hashes: np.ndarray) -> np.ndarray:
    """The cached row of each hash, or -1."""
    wrap = len(self._slot_row) - 1
    found = np.full(len(hashes), -1, np.int64)
    todo = np.arange(len(hashes))
    slots = (hashes >> self._shift).astype(np.int64)
    while len(todo):
      rows = self._slot_row[slots]
      hit = self._slot_hash[slots] == hashes[todo]
      hit &= rows >= 0
      found[todo[hit]] = rows[hit]
      on = (rows >= 0) & ~hit
      todo, slots = todo[on], (slots[on] + 1) & wrap
    return found

  def _add(self, words: Words, hashes: np.ndarray, firsts: np.ndarray) -> None:
    """Caches the words at `firsts` (hashes: theirs)."""
    lengths = words.lengths[firsts]
    chars = words.chars[ragged.ranges(words.starts[firsts], lengths)]
    text = chars.tobytes().decode("ascii")
    ends = np.cumsum(lengths).tolist()
    pieces, counts = self._encode_words(
        [text[e - n:e] for e, n in zip(ends, lengths.tolist())])
    first_row = len(self._count)
    self._char_start = np.concatenate(
        [self._char_start, len(self._chars) + np.cumsum(lengths) - lengths])
    self._length = np.concatenate([self._length, lengths])
    self._chars = np.concatenate([self._chars, chars])
    self._start = np.concatenate(
        [self._start, len(self._pieces) + np.cumsum(counts) - counts])
    self._count = np.concatenate([self._count, counts])
    self._pieces = np.concatenate([self._pieces, pieces])
    self._hashes = np.concatenate([self._hashes, hashes])
    if 4 * len(self._hashes) > len(self._slot_row):
      self._build_table()
    else:
      self._insert(hashes, first_row + np.arange(len(hashes)))

  def split(self, texts: Sequence[str]) -> Words:
    """Every text's basic tokens, each text followed by a NUL word."""
    raw = np.frombuffer("\n".join(
        t.replace("\n", " ") if "\n" in t else t for t in texts
    ).encode("ascii") + b"\n", np.uint8)
    copies = self._copies[raw]
    out = np.repeat(self._to_byte[raw], copies)
    # The first and last copy of a tripled byte become spaces.
    ends = np.compress(copies == 3, np.cumsum(copies))
    out[ends - 3] = 32
    out[ends - 1] = 32
    keep = out != 32
    edges = np.flatnonzero(np.diff(keep, prepend=False, append=False))
    starts, word_ends = edges[0::2], edges[1::2]
    lengths = word_ends - starts
    chars = np.compress(keep, out)
    return Words(chars, np.cumsum(lengths) - lengths, lengths)

  def _rows(self, words: Words) -> np.ndarray:
    """The cached row of every word, caching the new ones; every match is
    checked byte for byte."""
    while True:
      hashes = self._hash(words)
      rows = self._find(hashes)
      missing = np.flatnonzero(rows < 0)
      if len(missing):
        new_hashes, firsts = np.unique(hashes[missing], return_index=True)
        if len(self._count) + len(new_hashes) > self.max_words:
          self._reset()
          missing = np.arange(len(words))
          new_hashes, firsts = np.unique(hashes, return_index=True)
          keep = self._find(new_hashes) < 0  # All but the text end.
          new_hashes, firsts = new_hashes[keep], firsts[keep]
        self._add(words, new_hashes, missing[firsts])
        rows[missing] = self._find(hashes[missing])
      same = np.array_equal(self._length[rows], words.lengths) and np.array_equal(
          self._chars[ragged.ranges(self._char_start[rows], words.lengths)], words.chars)
      if same:
        return rows
      # Two different words with one hash: new tables, the same words.
      self._new_tables()
      self._rehash()
      if len(np.unique(self._hashes)) < len(self._hashes):
        self._reset()

  def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all texts back to back as int32, number of ids per text)."""
    if not texts:
      return np.zeros(0, np.int32), np.zeros(0, np.int64)
    rows = self._rows(self.split(texts))
    counts = self._count[rows]
    ids = self._pieces[ragged.ranges(self._start[rows], counts)]
    is_end = rows == 0
    text_of_word = np.cumsum(is_end) - is_end
    lengths = np.bincount(text_of_word, weights=counts,
                          minlength=len(texts)).astype(np.int64)
    return ids, lengths
