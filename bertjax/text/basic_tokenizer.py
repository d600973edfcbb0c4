"""BERT's basic tokenization in compiled code, matched to the original.

The original release's tokenizer and `transformers.BertTokenizer` run, in
Python: clean the text (drop NUL, U+FFFD and control characters, map
whitespace to spaces), put spaces around CJK ideographs, NFC-normalise, split
on whitespace, optionally lower-case and strip accents (NFD, drop Mn marks),
and split off punctuation. Hugging Face `tokenizers` implements the same steps
in Rust (`BertNormalizer`, `BertPreTokenizer`) a hundred times faster, but
its character classes come from an older Unicode table than Python's
`unicodedata`: it keeps unassigned code points the original drops (e.g. emoji
newer than the Python's Unicode version), some marks and punctuation changed
category since, one CJK range differs, and its NFC orders some newer
combining marks differently.

`BasicTokenizer` closes those gaps. The first time it meets a non-ASCII text
in a process it compares, for every code point, the original's result with
the compiled one (about a second, then cached) and keeps a table of the few
hundred characters where they differ plus the unassigned ranges; `prepare`
rewrites those characters, with one regex pass over non-ASCII texts only,
into what the original makes of them, and NFC-normalises cased text in
Python; the compiled pipeline then gives the original's tokens. ASCII text
is passed through untouched.

Lower-casing follows `transformers.BertTokenizer`, which lower-cases
character by character, as the compiled code does (a word-final capital
sigma becomes "σ"; the original's `str.lower()` of whole words gives "ς").
What cannot be rewritten is listed in `unmatched`: characters the compiled
code splits or strips but the original keeps, because their Unicode category
changed (U+166D, Canadian syllabics chi sign, is one). They are rare outside
of Unicode test files.
"""

import bisect
import functools
import json
import os
import re
import sys
from typing import NamedTuple, Optional, Sequence
import unicodedata

import tokenizers
from tokenizers import normalizers
from tokenizers import pre_tokenizers

# The original's CJK ideograph ranges (tokenization.py, _is_chinese_char).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF),
               (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF),
               (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# Code points compared one by one, and ranges the original always drops:
# surrogates and private use (D800-F8FF, planes 15 and 16), and ranges with
# no assigned character in any Unicode version so far (checked by sampling).
_SCANNED = ((0x80, 0xD800), (0xF900, 0x40000), (0xE0000, 0xE1000))
_ALWAYS_DROPPED = ((0xD800, 0xF8FF), (0xF0000, 0x10FFFF))
_UNASSIGNED = ((0x40000, 0xDFFFF), (0xE1000, 0xEFFFF))
# Probe separator: no character normalises into it (else the probe falls
# back to one character at a time).
_SEP = "#"


def compiled_normalizer(do_lower_case: bool) -> normalizers.Normalizer:
  """The compiled normaliser: clean, CJK spaces, then accents and case.

  Cased text is NFC-normalised by `BasicTokenizer.prepare` instead.
  """
  return normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=True,
      strip_accents=do_lower_case, lowercase=do_lower_case)


def _ranges(code_points: Sequence[int]) -> list[tuple[int, int]]:
  out = []
  for cp in code_points:
    if out and out[-1][1] == cp - 1:
      out[-1] = (out[-1][0], cp)
    else:
      out.append((cp, cp))
  return out


def _char_class(ranges: Sequence[tuple[int, int]]) -> str:
  esc = lambda cp: f"\\U{cp:08x}"
  return "[" + "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}"
                       for a, b in ranges) + "]"


class _Calibration(NamedTuple):
  """What `prepare` rewrites, for one lower-casing mode."""
  pattern: re.Pattern  # What to rewrite (and every astral character).
  astral: re.Pattern  # The astral characters to drop.
  table: dict[str, str]  # Replacements; other matches are dropped.
  unmatched: str


_CALIBRATION_VERSION = 1  # Bump when _compare changes.


def cache_path(do_lower_case: bool) -> Optional[str]:
  """Where a calibration is kept between processes, or None for nowhere.

  $BERTJAX_CACHE_DIR, else $XDG_CACHE_HOME/bertjax, else ~/.cache/bertjax;
  BERTJAX_CACHE_DIR="" turns the cache off. The name holds everything the
  result depends on: this code's version, Python's Unicode tables and the
  `tokenizers` version.
  """
  root = os.environ.get("BERTJAX_CACHE_DIR")
  if root is None:
    root = os.path.join(os.environ.get("XDG_CACHE_HOME")
                        or os.path.expanduser("~/.cache"), "bertjax")
  if not root:
    return None
  return os.path.join(root, (
      f"basic_tokenizer-v{_CALIBRATION_VERSION}-py{sys.version_info[0]}."
      f"{sys.version_info[1]}-unicode{unicodedata.unidata_version}-tokenizers"
      f"{tokenizers.__version__}-{'uncased' if do_lower_case else 'cased'}"
      ".json"))


@functools.lru_cache(maxsize=2)
def _calibrate(do_lower_case: bool) -> _Calibration:
  """The calibration: from the cache file if there is one, else computed.

  Computing takes about a second; worker processes of a data creation run
  would each pay it, so the result is kept on disk. An unreadable cache file
  is ignored (and replaced), as is one that cannot be written.
  """
  path = cache_path(do_lower_case)
  if path is not None:
    try:
      with open(path, encoding="utf-8") as f:
        saved = json.load(f)
      return _Calibration(re.compile(saved["pattern"]),
                          re.compile(saved["astral"]), saved["table"],
                          saved["unmatched"])
    except (OSError, ValueError, KeyError, TypeError, re.error):
      pass
  cal = _compare(do_lower_case)
  if path is not None:
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      tmp = f"{path}.tmp-{os.getpid()}"
      with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"pattern": cal.pattern.pattern,
                   "astral": cal.astral.pattern, "table": cal.table,
                   "unmatched": cal.unmatched}, f)
      os.replace(tmp, path)
    except OSError:
      pass
  return cal


def _compare(do_lower_case: bool) -> _Calibration:
  """Compares the original and the compiled code on every character."""
  category = unicodedata.category
  scanned, dropped = list(_SCANNED), list(_ALWAYS_DROPPED)
  for a, b in _UNASSIGNED:
    if all(k == "Cn" for k in map(category, map(chr, range(a, b + 1, 61)))):
      dropped.append((a, b))
    else:  # A newer Unicode assigned characters there: compare them too.
      scanned.append((a, b + 1))
  chars = "".join(map(chr, (cp for a, b in scanned for cp in range(a, b))))
  cats = list(map(category, chars))
  # Every C* character (but tab, newline, return) goes: the original drops
  # them, the compiled code keeps unassigned ones.
  removed = [ord(ch) for ch, k in zip(chars, cats) if k[0] == "C"]
  probe = "".join([ch for ch, k in zip(chars, cats) if k[0] != "C"])
  # The original's result per character. lower(), NFC and NFD of the
  # NUL-joined string give the per-character results (NUL is not cased and
  # blocks composition and reordering).
  joined = "\x00".join(probe)
  if do_lower_case:  # transformers lower-cases each character first.
    joined = unicodedata.normalize("NFC", joined.lower())
    joined = unicodedata.normalize("NFD", joined.lower())
    joined = "".join([ch for ch, k in zip(joined, map(category, joined))
                      if k != "Mn"])
    inputs = probe
  else:  # prepare() NFC-normalises before the compiled code.
    joined = unicodedata.normalize("NFC", joined)
    inputs = joined.split("\x00")
  refs = joined.split("\x00")
  for i in [i for i, ch in enumerate(probe) if ch.isspace()]:
    refs[i] = " "
  refs[probe.index("\ufffd")] = ""
  for a, b in _CJK_RANGES:
    for i in range(_index(probe, a), _index(probe, b + 1)):
      refs[i] = f" {refs[i]} "
  norm = compiled_normalizer(do_lower_case)
  compiled = norm.normalize_str(_SEP + _SEP.join(inputs) + _SEP).split(_SEP)
  compiled = compiled[1:-1]
  if len(compiled) != len(probe):
    compiled = [norm.normalize_str(ch) for ch in inputs]
  table = {ch: r for ch, r, c in zip(probe, refs, compiled) if r != c}

  # Punctuation: split by the compiled pre-tokenizer where the original does.
  seen = "".join(sorted(ch for ch in set("".join(refs)) if not ch.isascii()))
  text = "b" + "b".join(seen) + "b"
  split, starts = set(), set()
  for _, (s, e) in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(text):
    if e - s == 1 and text[s] != "b":
      split.add(text[s])
    starts.add(s)
  unmatched, wrap = set(), set()
  punct = {ch for ch, k in zip(seen, map(category, seen)) if k[0] == "P"}
  for i, ch in enumerate(seen):
    if ch in punct and ch not in split:
      wrap.add(ch)
    elif ch in split and ch not in punct:
      unmatched.add(ch)
    elif 2 * i + 1 not in starts and 2 * i + 2 in starts:
      unmatched.add(ch)  # Dropped as whitespace by the compiled code.
  if wrap:
    for ch, r in zip(probe, refs):
      if not wrap.isdisjoint(r):
        table[ch] = "".join(f" {c} " if c in wrap else c for c in r)
  for ch, r in list(table.items()):
    if r.strip() and norm.normalize_str(r) != r:
      unmatched.add(ch)  # The compiled code would change the replacement.
  keys = sorted(set(removed) | {ord(ch) for ch in table})
  ranges = sorted(_ranges(keys) + dropped)
  # One regex pass finds the BMP characters to rewrite and every astral
  # one: a character class of astral ranges is tested range by range, a BMP
  # one in constant time. Astral matches are then checked one by one.
  bmp = [(a, min(b, 0xFFFF)) for a, b in ranges if a <= 0xFFFF]
  astral = [(max(a, 0x10000), b) for a, b in ranges if b > 0xFFFF]
  return _Calibration(
      pattern=re.compile(_char_class(bmp + [(0x10000, 0x10FFFF)])),
      astral=re.compile(_char_class(astral)), table=table,
      unmatched="".join(sorted(unmatched)))


def _index(probe: str, cp: int) -> int:
  """Index of the first probed character at or after code point `cp`."""
  return bisect.bisect_left(probe, chr(cp))


def _rewrite(cal: _Calibration, match: re.Match) -> str:
  ch = match.group()
  out = cal.table.get(ch)
  if out is not None:
    return out
  if ch <= "\uffff" or cal.astral.match(ch):
    return ""
  return ch


class BasicTokenizer:
  """Text preparation plus the compiled normaliser and pre-tokenizer.

  `prepare(text)` must run before the compiled pipeline; together they give
  the original's basic tokens (see the module docstring).
  """

  def __init__(self, do_lower_case: bool = True):
    self.do_lower_case = bool(do_lower_case)

  @property
  def unmatched(self) -> str:
    """Characters whose tokens may differ from the original's."""
    return _calibrate(self.do_lower_case).unmatched

  @property
  def normalizer(self) -> normalizers.Normalizer:
    return compiled_normalizer(self.do_lower_case)

  @property
  def pre_tokenizer(self) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.BertPreTokenizer()

  def prepare(self, text: str) -> str:
    """Rewrites what the compiled code would treat otherwise (see above)."""
    if text.isascii():
      return text
    cal = _calibrate(self.do_lower_case)
    text = cal.pattern.sub(functools.partial(_rewrite, cal), text)
    if not self.do_lower_case:
      text = unicodedata.normalize("NFC", text)
    return text

  def prepare_batch(self, texts: Sequence[str]) -> list[str]:
    """`prepare` of each text; ASCII texts pass through as they are."""
    prepare = self.prepare
    return [t if t.isascii() else prepare(t) for t in texts]
