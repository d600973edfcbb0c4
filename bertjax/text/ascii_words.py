"""WordPiece of ASCII text by word: split in numpy, each distinct word once.

For ASCII text, BERT's basic tokenization is simple: drop control characters
(all but tab, newline and return), optionally lower-case, split on
whitespace, and make every punctuation character (every printable
non-alphanumeric, ASCII's 33-47, 58-64, 91-96 and 123-126) a word of its
own. WordPiece then maps each word to its pieces on its own. So `AsciiWords`
does the basic step on a whole batch of texts at once in numpy, and sends
only the words it has not seen before through the compiled WordPiece
(`tokenizers`; its basic steps have nothing left to do on such words);
every other word is a dictionary lookup. The compiled WordPiece stays the
reference for every word (the unknown-word rule and the word length limit
included), so the ids are its ids. Texts with any
non-ASCII character do not come here (tokenization.WordPieceTokenizer).

The cache starts over when a batch's new words would take it past
`max_words` (a single batch's own words are always kept while it is
encoded), so memory stays bounded on any corpus: about 165 bytes a word,
some 22 MB per process at the default of 2**17 words.
"""

from typing import Callable, Sequence

import numpy as np

from bertjax.text import ragged

_MARK = b"\x00"  # Ends each text in the split stream (NUL is always dropped).


def _byte_tables(do_lower_case: bool):
  """(byte -> byte, byte -> copies): 0 drops a byte, 3 makes " c "."""
  to_byte = np.arange(256, dtype=np.uint8)
  copies = np.ones(256, np.int64)
  for cp in range(128):
    ch = chr(cp)
    if ch == "\n":
      copies[cp] = 3  # " \0 ": the end of a text.
      to_byte[cp] = 0
    elif ch in "\t\r ":
      pass
    elif cp < 32 or cp == 127:
      copies[cp] = 0  # Control characters go, as in the original.
    elif not ch.isalnum():
      copies[cp] = 3  # Punctuation is a word of its own.
    elif do_lower_case and ch.isupper():
      to_byte[cp] = ord(ch.lower())
  return to_byte, copies


class AsciiWords:
  """Ids of ASCII texts, with each distinct word tokenized once."""

  def __init__(self, encode_words: Callable[[list[str]], list[list[int]]],
               do_lower_case: bool, max_words: int = 1 << 17):
    self._encode_words = encode_words
    self._to_byte, self._copies = _byte_tables(do_lower_case)
    self.max_words = max_words
    self._reset()

  def _reset(self):
    self._index = {_MARK: 0}  # Word -> its row in the tables below.
    self._pieces = np.zeros(0, np.int32)  # Every word's ids, back to back.
    self._start = np.zeros(1, np.int64)  # Where each word's ids begin.
    self._count = np.zeros(1, np.int64)  # How many ids each word has.

  def _add(self, words: list[bytes]) -> None:
    pieces, counts = ragged.flatten(
        self._encode_words([w.decode("ascii") for w in words]))
    first = len(self._index)
    self._index.update(zip(words, range(first, first + len(words))))
    self._start = np.concatenate(
        [self._start, len(self._pieces) + np.cumsum(counts) - counts])
    self._count = np.concatenate([self._count, counts])
    self._pieces = np.concatenate([self._pieces, pieces])

  def split(self, texts: Sequence[str]) -> list[bytes]:
    """Every text's basic tokens, each text followed by a NUL word."""
    raw = np.frombuffer("\n".join(
        t.replace("\n", " ") if "\n" in t else t for t in texts
    ).encode("ascii") + b"\n", np.uint8)
    copies = self._copies[raw]
    out = np.repeat(self._to_byte[raw], copies)
    # The first and last copy of a tripled byte become spaces.
    ends = np.cumsum(copies)
    ends = ends[copies == 3]
    out[ends - 3] = 32
    out[ends - 1] = 32
    return out.tobytes().split()

  def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(ids of all texts back to back as int32, number of ids per text)."""
    if not texts:
      return np.zeros(0, np.int32), np.zeros(0, np.int64)
    words = self.split(texts)
    new = set(words).difference(self._index)
    if new:
      if len(self._index) + len(new) > self.max_words:
        self._reset()
        new = set(words).difference(self._index)
      self._add(sorted(new))
    rows = np.fromiter(map(self._index.__getitem__, words), np.int64,
                       len(words))
    counts = self._count[rows]
    ids = self._pieces[ragged.ranges(self._start[rows], counts)]
    is_end = rows == 0
    text_of_word = np.cumsum(is_end) - is_end
    lengths = np.bincount(text_of_word, weights=counts,
                          minlength=len(texts)).astype(np.int64)
    return ids, lengths
