"""An article's wikitext -> its text passages, by the paper's rules.

"For Wikipedia we extract only the text passages and ignore lists, tables,
and headers." The wikitext is read with mwparserfromhell, the parser
TensorFlow Datasets' `wikipedia` builder uses: a maintained tokenizer (in C)
of MediaWiki's grammar that says what each piece of markup is, so a rule
drops a construct (a template, a heading, a list item) rather than guessing
its extent with regular expressions.

Dropped: headings; list items (`*`, `#`, `;`, `:` lines); tables and the
leftovers of table syntax; templates and template arguments (`{{ }}`:
infoboxes, navboxes, citations); `<ref>` and `<references>`; files, images
and galleries; categories and interlanguage links; HTML comments; math,
chemistry, code and preformatted blocks (markup_scan.DROPPED_TAGS); external
links without a title and bare URLs; the trailing sections
(markup_scan.END_SECTIONS) with their subsections; behaviour switches
(`__NOTOC__`). Kept: link text (`[[A|B]]` gives B, `[[A]]` gives A,
`[[A (b)|]]` gives A), the words inside bold and italic markup and other
inline tags (`<code>` among them), the titles of external links, `<nowiki>`
text as it is, entities decoded (`&nbsp;` a space).

`passages` is the fast path: markup_scan's pre-pass cuts what the rules drop
whole, mwparserfromhell's tokenizer reads the rest, and the tokens are
rendered directly (building mwparserfromhell's node tree costs four times
the tokenizing). `reference_passages` parses the whole page into that tree
and walks it with the same rules (wikitext_tree.py): the reference the tests
hold the fast path to.
"""

import html
import re

from mwparserfromhell import parser as mwparser
from mwparserfromhell.parser import tokens as T

from bertjax.corpus import markup_scan

# Marks a line the rules drop (a heading, a list item) in the rendered text.
DROP_LINE = "\x01"
_SPACE = re.compile(r"[^\S\n]+")  # Within a line.
_QUOTES = re.compile(r"'{2,}")
_SWITCH = re.compile(r"__[A-Z]+__")
# Brackets that a dropped template or reference left empty, "( ; )".
_EMPTY_BRACKETS = re.compile(r"\( ?[,;:]? ?\)|\[ ?\]")
_SPACE_BEFORE_PUNCT = re.compile(r" +([,.;:!?)\]])")
_LETTER = re.compile(r"[^\W\d_]")
_REDIRECT = re.compile(r"\s*#\s*redirect", re.I)
# Disambiguation templates and their common aliases: a page that uses one
# lists the meanings of its title rather than telling about one.
_DISAMBIGUATION = re.compile(
    r"\{\{\s*(?:disambig\w*|dab|disamb|dis|hndis|hndis-cleanup|geodis|"
    r"numberdis|mil-unit-dis|letter-number combination disambiguation|"
    r"hospital disambiguation|school disambiguation|place name "
    r"disambiguation|species latin name disambiguation|given name "
    r"disambiguation|surname disambiguation)\s*(?:\||\}\})", re.I)


class ParseFailure(ValueError):
  """mwparserfromhell could not read a page (counted as parser_error)."""


def is_redirect(text: str) -> bool:
  """A redirect page's text (`#REDIRECT [[Target]]`)."""
  return bool(_REDIRECT.match(text))


def is_disambiguation(title: str, text: str) -> bool:
  """A disambiguation page: its title says so, or it uses a disambiguation
  template."""
  return (title.rstrip().endswith("(disambiguation)")
          or bool(_DISAMBIGUATION.search(text)))


def tag_rendering(name: str, wiki_markup) -> str | None:
  """What a tag renders as, if not its contents: "" for a dropped element
  (or one without contents), DROP_LINE for a list item's marker, a space for
  a line break, a newline for a rule; None for "its contents"."""
  name = name.strip().lower()
  if name in markup_scan.DROPPED_TAGS:
    return ""
  if wiki_markup and name in ("li", "dt", "dd"):
    return DROP_LINE
  if name in ("br", "wbr"):
    return " "
  if name == "hr":
    return "\n"
  return None


def pipe_trick(title: str) -> str:
  """What `[[title|]]` shows: the title without a namespace prefix or a
  final parenthesis (`[[Paris (band)|]]` shows "Paris")."""
  title = title.strip().lstrip(":")
  if ":" in title:
    title = title.split(":", 1)[1]
  return re.sub(r"\s*\([^()]*\)\s*$", "", title.split(",")[0]).strip()


def passages(text: str, links: markup_scan.LinkRules) -> list[str]:
  """The text passages (paragraphs of prose, whitespace collapsed) of an
  article's wikitext. Raises ParseFailure if the tokenizer fails."""
  text = markup_scan.cut(text, links)
  try:
    tokens = _tokenizer().tokenize(text, 0, False)
  except Exception as e:  # pylint: disable=broad-except
    raise ParseFailure(f"mwparserfromhell: {e}") from e
  return paragraphs(_TokenRenderer(tokens, links).top())


def reference_passages(text: str, links: markup_scan.LinkRules) -> list[str]:
  """`passages` by mwparserfromhell's node tree of the whole page, without
  the pre-pass: the reference (wikitext_tree.py)."""
  from bertjax.corpus import wikitext_tree  # pylint: disable=g-import-not-at-top
  return paragraphs(wikitext_tree.render(text, links))


# mwparserfromhell's tokenizer in C, which the speed figures assume; without
# its compiled extension the package falls back to a Python one, ten times
# slower (the driver says so in its log).
C_TOKENIZER = bool(mwparser.use_c and mwparser.CTokenizer)


def _tokenizer():
  if C_TOKENIZER:
    return mwparser.CTokenizer()
  from mwparserfromhell.parser import tokenizer  # pylint: disable=g-import-not-at-top
  return tokenizer.Tokenizer()


class _TokenRenderer:
  """Renders mwparserfromhell's tokens to text with the rules' drops. The
  token list is well nested (the tokenizer's guarantee), so a construct is
  skipped by counting its own opening and closing tokens."""

  def __init__(self, tokens: list, links: markup_scan.LinkRules):
    self.tokens = tokens
    self.i = 0
    self.links = links

  def top(self) -> str:
    """The whole page, the trailing sections cut at the top level."""
    out, cut_level = [], 0
    tokens = self.tokens
    while self.i < len(tokens):
      tok = tokens[self.i]
      if type(tok) is T.HeadingStart:  # pylint: disable=unidiomatic-typecheck
        level = tok["level"]
        self.i += 1
        title = self.until(T.HeadingEnd)
        self.i += 1
        if cut_level and level > cut_level:
          continue
        cut_level = 0
        if markup_scan.heading_title(title) in markup_scan.END_SECTIONS:
          cut_level = level
        else:
          out.append(DROP_LINE)
        continue
      piece = self.one()
      if not cut_level:
        out.append(piece)
    return "".join(out)

  def until(self, *stops) -> str:
    """Renders tokens up to (not including) one of the types `stops`."""
    out, tokens = [], self.tokens
    while self.i < len(tokens) and type(tokens[self.i]) not in stops:
      out.append(self.one())
    return "".join(out)

  def skip(self, opening, closings) -> None:
    """Skips a construct whose opening token is at self.i."""
    depth, tokens = 0, self.tokens
    while self.i < len(tokens):
      kind = type(tokens[self.i])
      self.i += 1
      if kind is opening:
        depth += 1
      elif kind in closings:
        depth -= 1
        if depth == 0:
          return

  def one(self) -> str:  # pylint: disable=too-many-return-statements
    """Renders the construct at self.i and moves past it."""
    tok = self.tokens[self.i]
    kind = type(tok)
    if kind is T.Text:
      self.i += 1
      return tok["text"]
    if kind is T.WikilinkOpen:
      return self.wikilink()
    if kind is T.TagOpenOpen:
      return self.tag(tok)
    if kind is T.TemplateOpen:
      self.skip(T.TemplateOpen, (T.TemplateClose,))
    elif kind is T.ArgumentOpen:
      self.skip(T.ArgumentOpen, (T.ArgumentClose,))
    elif kind is T.CommentStart:
      self.skip(T.CommentStart, (T.CommentEnd,))
    elif kind is T.HTMLEntityStart:
      return self.entity()
    elif kind is T.ExternalLinkOpen:
      return self.external_link(tok)
    elif kind is T.HeadingStart:  # Not at the top level: a dropped line.
      self.skip(T.HeadingStart, (T.HeadingEnd,))
      return DROP_LINE
    else:  # A stray separator: nothing to show.
      self.i += 1
    return ""

  def raw_text(self, *stops) -> tuple[str, bool]:
    """(the Text tokens' text, whether there were only Text tokens) up to
    one of `stops`, the tokens left in place."""
    j, parts, plain = self.i, [], True
    tokens = self.tokens
    while j < len(tokens) and type(tokens[j]) not in stops:
      if type(tokens[j]) is T.Text:  # pylint: disable=unidiomatic-typecheck
        parts.append(tokens[j]["text"])
      else:
        plain = False
      j += 1
    return "".join(parts), plain

  def wikilink(self) -> str:
    start = self.i
    self.i += 1
    title, _ = self.raw_text(T.WikilinkSeparator, T.WikilinkClose)
    if self.links.drops(title):
      self.i = start
      self.skip(T.WikilinkOpen, (T.WikilinkClose,))
      return ""
    shown = self.until(T.WikilinkSeparator, T.WikilinkClose)
    if type(self.tokens[self.i]) is T.WikilinkSeparator:  # pylint: disable=unidiomatic-typecheck
      self.i += 1
      text, plain = self.raw_text(T.WikilinkClose)
      shown = self.until(T.WikilinkClose)
      if plain and not text.strip():
        shown = pipe_trick(title)
    else:
      shown = shown.strip().lstrip(":")
    self.i += 1
    return shown

  def tag(self, tok) -> str:
    start = self.i
    self.i += 1
    name, _ = self.raw_text(T.TagAttrStart, T.TagCloseOpen, T.TagCloseSelfclose)
    rendering = tag_rendering(name, tok.get("wiki_markup"))
    if rendering is not None:
      self.i = start
      self.skip(T.TagOpenOpen, (T.TagCloseSelfclose, T.TagCloseClose))
      return rendering
    # Past the name and attributes (attribute values may hold constructs).
    depth, tokens = 0, self.tokens
    while True:
      kind = type(tokens[self.i])
      if depth == 0 and kind in (T.TagCloseOpen, T.TagCloseSelfclose):
        break
      depth += kind is T.TagOpenOpen
      depth -= kind in (T.TagCloseSelfclose, T.TagCloseClose)
      self.i += 1
    self.i += 1
    if kind is T.TagCloseSelfclose:
      return ""
    contents = self.until(T.TagOpenClose)
    self.skip(T.TagOpenClose, (T.TagCloseClose,))
    return contents

  def entity(self) -> str:
    parts = []
    while type(self.tokens[self.i]) is not T.HTMLEntityEnd:
      tok = self.tokens[self.i]
      kind = type(tok)
      parts.append({T.HTMLEntityStart: "&", T.HTMLEntityNumeric: "#"}.get(kind)
                   or tok.get("char") or tok.get("text") or "")
      self.i += 1
    self.i += 1
    return html.unescape("".join(parts) + ";")

  def external_link(self, tok) -> str:
    self.i += 1
    self.until(T.ExternalLinkSeparator, T.ExternalLinkClose)
    shown = ""
    if type(self.tokens[self.i]) is T.ExternalLinkSeparator:  # pylint: disable=unidiomatic-typecheck
      self.i += 1
      shown = self.until(T.ExternalLinkClose)
    self.i += 1
    return shown if tok.get("brackets") else ""


def paragraphs(rendered: str) -> list[str]:
  """Paragraphs of rendered text: runs of lines kept, ended by a blank line
  or a dropped one (a heading, a list item, a line of table syntax), with
  leftover quotes, switches and emptied brackets removed and whitespace
  collapsed; those without a letter are left out."""
  out, current = [], []
  for line in rendered.split("\n"):
    stripped = line.strip()
    drop = DROP_LINE in line or stripped.startswith(("{|", "|", "!"))
    if stripped and not drop:
      current.append(stripped)
      continue
    if current:
      out.append(" ".join(current))
      current = []
  if current:
    out.append(" ".join(current))
  # The clean-up on all paragraphs at once, a paragraph a line.
  text = _QUOTES.sub("", _SWITCH.sub("", "\n".join(out)))
  text = _EMPTY_BRACKETS.sub("", _SPACE.sub(" ", text))
  text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
  return [p.strip() for p in text.split("\n") if _LETTER.search(p)]
