"""BERT's basic tokenization, run by Hugging Face `tokenizers` as the original.

The original release (google-research/bert tokenization.py, FullTokenizer)
does, in Python: drop NUL, U+FFFD and control characters (categories Cc and
Cf, but not tab, newline, return), put spaces around CJK ideographs, split
on whitespace; when lower-casing, `str.lower()` each word and strip accents
(NFD, drop category Mn); then make every punctuation character (category P*
and ASCII's non-alphanumerics) a word of its own. Cased text is not
normalised at all. WordPiece then gives [UNK] to words of over 200
characters.

`BasicTokenizer` gives the same words from a compiled pipeline built of
`tokenizers`' own pieces: a normaliser that drops the dropped characters
(and, lower-cased, the Mn marks) and a pre-tokenizer that splits on
whitespace and isolates punctuation and CJK ideographs. Their character
classes are regular expressions made from this interpreter's `unicodedata`,
the tables the original uses when it runs here, because `tokenizers`'
ready-made BertNormalizer and BertPreTokenizer use tables of their own:
they drop unassigned and private-use characters (🫨, U+1FAE8, is unassigned
in Unicode 14; the original keeps it), classify some characters differently
and lower-case per character.

With `do_lower_case`, `prepare_batch` also does in Python what the compiled
pieces cannot do as the original does:
* `str.lower()` of every text: the compiled Lowercase maps one character at
  a time ("ΟΔΟΣ" -> "οδοσ"; the original's "οδος" ends in a final sigma),
  and its case tables are newer (it lower-cases U+1C89, unassigned in
  Unicode 14, which the original keeps).
* NFD of non-ASCII texts: the compiled NFD leaves U+11938 as it is, the
  original decomposes it to U+11935 U+11930.
* Before both, non-ASCII texts lose their dropped characters, as in the
  original: a control character between two letters is no word boundary for
  the final sigma ("ΑΣ\\x01Β" -> "ασβ") and blocks no reordering of marks.

`compat="hf"` gives `transformers.BertTokenizer`'s variant instead: every
character of category C* is dropped (unassigned and private-use ones too),
the text is NFC-normalised after cleaning, lower-casing is per character
(Σ always becomes σ) and words of over 100 characters become [UNK].
Special-token literals such as "[MASK]", which BertTokenizer keeps whole,
are split in both variants (tokenization.py).
"""

import functools
import re
import sys
from typing import Optional, Sequence
import unicodedata

from tokenizers import normalizers
from tokenizers import pre_tokenizers
from tokenizers import Regex

COMPATS = ("original", "hf")
# Longest word WordPiece splits; longer ones become [UNK].
MAX_INPUT_CHARS_PER_WORD = {"original": 200, "hf": 100}
# The original's CJK ideograph ranges (tokenization.py, _is_chinese_char).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
               (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),
               (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# The original's ASCII punctuation: every printable non-alphanumeric.
_ASCII_PUNCTUATION = ((33, 47), (58, 64), (91, 96), (123, 126))
_WHITESPACE_CONTROLS = frozenset((9, 10, 13))  # Whitespace, not dropped.
_SURROGATES = (0xD800, 0xDFFF)  # Never in text `tokenizers` accepts.

Ranges = tuple[tuple[int, int], ...]


def check_compat(compat: str) -> str:
  if compat not in COMPATS:
    raise ValueError(f"compat={compat!r}: must be one of "
                     f"{', '.join(COMPATS)}.")
  return compat


Runs = tuple[tuple[str, int, int], ...]  # (category, first, last) code points.


@functools.lru_cache(maxsize=None)
def _category_runs() -> Runs:
  """The runs of code points of one category, over all of Unicode."""
  names = sorted({unicodedata.category(chr(cp)) for cp in range(0x10000)}
                 | {"Cn", "Co", "Cs"})
  letter = {name: chr(65 + i) for i, name in enumerate(names)}
  # One letter per code point (all in C), then its runs by regex.
  cats = "".join(map(letter.__getitem__, map(
      unicodedata.category, map(chr, range(sys.maxunicode + 1)))))
  name = {v: k for k, v in letter.items()}
  return tuple((name[m.group()[0]], m.start(), m.end() - 1)
               for m in re.finditer(r"(.)\1*", cats, re.DOTALL))


def _runs_of(chars: frozenset[str]) -> Runs:
  """The categories of the given characters only."""
  return tuple((unicodedata.category(c), ord(c), ord(c)) for c in sorted(chars))


def _merge(ranges) -> Ranges:
  out = []
  for a, b in sorted(ranges):
    if out and a <= out[-1][1] + 1:
      out[-1] = (out[-1][0], max(b, out[-1][1]))
    else:
      out.append((a, b))
  return tuple(out)


def _without(ranges: Ranges, code_points: range | frozenset[int]) -> Ranges:
  out = []
  for a, b in ranges:
    if isinstance(code_points, range):  # The cuts of a run, not all of it.
      cuts = range(max(a, code_points.start), min(b + 1, code_points.stop))
    else:
      cuts = sorted(cp for cp in code_points if a <= cp <= b)
    for cp in cuts:
      if a < cp:
        out.append((a, cp - 1))
      a = cp + 1
    if a <= b:
      out.append((a, b))
  return tuple(out)


def _dropped_ranges(compat: str, runs: Runs) -> Ranges:
  """What cleaning drops: NUL, U+FFFD and control characters."""
  categories = ("Cc", "Cf") if compat == "original" else (
      "Cc", "Cf", "Cn", "Co", "Cs")
  ranges = [(a, b) for cat, a, b in runs if cat in categories]
  return _without(_merge(ranges + [(0xFFFD, 0xFFFD)]), _WHITESPACE_CONTROLS)


def _category_ranges(prefix: str, runs: Runs) -> Ranges:
  return _merge((a, b) for cat, a, b in runs if cat.startswith(prefix))


def _isolated_ranges(runs: Runs) -> Ranges:
  """Punctuation and CJK ideographs: each character is a word of its own."""
  return _merge(_category_ranges("P", runs) + _ASCII_PUNCTUATION + _CJK_RANGES)


def _char_class(ranges: Ranges, escape) -> str:
  return "[" + "".join(escape(a) if a == b else f"{escape(a)}-{escape(b)}"
                       for a, b in ranges) + "]"


def _onig_class(ranges: Ranges) -> str:
  """A character class for `tokenizers.Regex` (Oniguruma syntax)."""
  ranges = _without(ranges, range(_SURROGATES[0], _SURROGATES[1] + 1))
  return _char_class(ranges, lambda cp: f"\\x{{{cp:X}}}")


class BasicTokenizer:
  """The original's basic tokenization: `prepare_batch`, then the compiled
  `normalizer` and `pre_tokenizer` (see the module docstring).

  With `chars`, for texts of those characters only: the character classes
  then take the categories of `chars` alone, not a pass over all of Unicode
  (about half a second); before and after `prepare` a text must hold no
  other character (`chars_of` gives what a batch holds).
  """

  def __init__(self, do_lower_case: bool = True, compat: str = "original",
               chars: Optional[frozenset[str]] = None):
    self.do_lower_case = bool(do_lower_case)
    self.compat = check_compat(compat)
    self.chars = chars

  @functools.cached_property
  def _runs(self) -> Runs:
    return _category_runs() if self.chars is None else _runs_of(self.chars)

  @property
  def max_input_chars_per_word(self) -> int:
    return MAX_INPUT_CHARS_PER_WORD[self.compat]

  @property
  def normalizer(self) -> normalizers.Normalizer:
    steps = [normalizers.Replace(
        Regex(_onig_class(_dropped_ranges(self.compat, self._runs))), "")]
    marks = _category_ranges("Mn", self._runs)
    if self.do_lower_case and marks:  # prepare_batch lower-cased and decomposed.
      steps.append(normalizers.Replace(Regex(_onig_class(marks)), ""))
    return normalizers.Sequence(steps)

  @property
  def pre_tokenizer(self) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(_onig_class(_isolated_ranges(self._runs))),
                             behavior="isolated")])

  @functools.cached_property
  def _dropped_pattern(self) -> re.Pattern:
    """_dropped_ranges as a Python regex."""
    return re.compile(_char_class(_dropped_ranges(self.compat, self._runs),
                                  lambda cp: f"\\U{cp:08x}"))

  def prepare(self, text: str) -> str:
    """What must happen in Python before the compiled pipeline."""
    if not text.isascii():
      if self.do_lower_case or self.compat == "hf":
        text = self._dropped_pattern.sub("", text)
      if self.compat == "hf":
        text = unicodedata.normalize("NFC", text)
      if self.do_lower_case:
        if self.compat == "hf":  # It lower-cases character by character.
          text = text.replace("\u03a3", "\u03c3")
        return unicodedata.normalize("NFD", text.lower())
    return text.lower() if self.do_lower_case else text

  def prepare_batch(self, texts: Sequence[str]) -> list[str]:
    """`prepare` of each text."""
    prepare = self.prepare
    return [prepare(t) for t in texts]


def chars_of(texts: Sequence[str]) -> frozenset[str]:
  """The characters of `texts`."""
  return frozenset("".join(texts))
