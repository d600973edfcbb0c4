"""A plain-text book -> its paragraphs: one book a document.

For books in Project Gutenberg's plain-text format (and any other plain
text, from which nothing but headings is removed):
  * the header and the licence are cut: the text kept lies between the
    "*** START OF THE PROJECT GUTENBERG EBOOK ..." line (or its older forms:
    "START OF THIS PROJECT GUTENBERG EBOOK", the small print's
    "*END*THE SMALL PRINT!") and the "*** END OF ..." line (or "End of the
    Project Gutenberg EBook of ...", "End of Project Gutenberg's ...");
  * the producers' credits at the start ("Produced by ..."), transcriber's
    notes, and bracketed notes ("[Illustration: ...]", "[Footnote ...]");
  * headings: chapter and part headings ("CHAPTER IV", "Chapter 12.",
    "BOOK ONE", "PART II. THE RETURN") and a title line under one, lone
    numerals ("IV.", "12"), lines
    in capitals of up to ten words ("THE END", "CONTENTS"), and tables of
    contents (paragraphs whose every line is such a heading, or three or
    more short lines none of which ends in punctuation);
  * hard-wrapped lines are joined into paragraphs (a blank line ends one);
    `_italic_` underscores are removed and their words kept.
`markers` in the counts says whether the Gutenberg markers were found.
"""

import re

_START = re.compile(
    r"^[ \t]*(?:\*{3}[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG.*"
    r"|\*END\*THE SMALL PRINT!.*)$", re.I | re.M)
_END = re.compile(
    r"^[ \t]*(?:\*{3}[ \t]*END OF (?:THE|THIS) PROJECT GUTENBERG.*"
    r"|End of (?:the |this )?Project Gutenberg.*)$", re.I | re.M)
_CREDITS = re.compile(
    r"^(?:produced by|e-?text prepared by|transcribed (?:from|by)|"
    r"this (?:e-?book|etext) was (?:produced|prepared)|updated editions will)",
    re.I)
_TRANSCRIBER = re.compile(r"^\[?\s*transcriber['’]?s? notes?\b", re.I)
_BRACKETED = re.compile(r"\[(?:Illustration|Footnote|Sidenote|Transcriber)[^\]]*\]",
                        re.I | re.S)
_ITALIC = re.compile(r"(?<![\w_])_([^_\n]+?)_(?![\w_])")
_NUMBER_WORDS = (
    "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
    "thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|"
    "thirty|forty|fifty|first|second|third|fourth|fifth|sixth|seventh|"
    "eighth|ninth|tenth|last|the first|the second|the third|the last")
_CHAPTER = re.compile(
    r"^(?:chapter|book|part|volume|vol\.|section|canto|act|scene|stave|"
    r"letter|fit|chap\.)\s+(?:[ivxlcdm]+|\d+|(?:" + _NUMBER_WORDS + r"))\b",
    re.I)
_LONE_NUMBER = re.compile(r"^(?:[IVXLCDM]+|\d+)[.:]?$")
_LINE_END_PUNCTUATION = tuple(".!?,;:'\")]-’”—")


def strip_gutenberg(text: str, counts) -> str:
  """The text between the Project Gutenberg markers (all of it without)."""
  start = _START.search(text)
  if start is not None:
    # The small print of old texts comes after the first marker: the last
    # marker in the first half of the text ends the header.
    for later in _START.finditer(text, start.end()):
      if later.start() < len(text) // 2:
        start = later
    text = text[start.end():]
  end = _END.search(text)
  if end is not None:
    text = text[:end.start()]
  counts["markers"] += int(start is not None or end is not None)
  return text


def _is_heading(line: str) -> bool:
  """A chapter or part heading, a lone numeral, or a short line in capitals."""
  if _CHAPTER.match(line) and len(line.split()) <= 12:
    return True
  if _LONE_NUMBER.match(line):
    return True
  words = line.split()
  return (len(words) <= 10 and any(c.isalpha() for c in line)
          and not any(c.islower() for c in line))


def _is_title(line: str) -> bool:
  """A line that can be a chapter's title: up to ten words, no sentence
  punctuation at its end."""
  return len(line.split()) <= 10 and not line.endswith(_LINE_END_PUNCTUATION)


def _is_contents(lines: list[str]) -> bool:
  """A table of contents or a list of titles: three or more title lines
  (verse has lines that end in punctuation)."""
  return len(lines) >= 3 and all(map(_is_title, lines))


def paragraphs(text: str, counts) -> list[str]:
  """A book's paragraphs of prose, by the rules above; `counts` gets
  `markers` (1 if Gutenberg markers were found) and `headings` (dropped)."""
  text = strip_gutenberg(text.replace("\r\n", "\n").replace("\r", "\n"),
                         counts)
  text = _BRACKETED.sub("", text)
  blocks = [[line.strip() for line in block.split("\n") if line.strip()]
            for block in re.split(r"\n[ \t]*\n", text)]
  out, started, drop_next, after_heading = [], False, False, False
  for lines in blocks:
    if not lines:
      continue
    first = lines[0]
    if after_heading and len(lines) == 1 and _is_title(first):
      counts["headings"] += 1  # A chapter's title, under its number.
      continue
    after_heading = False
    if drop_next:  # The note after a "Transcriber's Notes:" heading.
      drop_next = False
      continue
    if not started and _CREDITS.match(first):
      continue
    if _TRANSCRIBER.match(first):
      drop_next = len(lines) == 1 and first.rstrip().endswith(":")
      continue
    if all(map(_is_heading, lines)) or _is_contents(lines):
      counts["headings"] += 1
      after_heading = True
      continue
    started = True
    paragraph = _ITALIC.sub(r"\1", " ".join(lines))
    out.append(" ".join(paragraph.split()))
  return out
