"""The pre-pass: markup the paper's rules drop, cut by one linear scan.

mwparserfromhell (wikitext.py) parses about 70 real article pages a second on
one core, most of that time in templates (infoboxes, citations, navboxes),
references and tables, all of which the rules drop whole. `cut` removes them
before the parser sees the text, so it parses what is left: prose, links and
bold and italic markup, headings and list lines, a fraction of the page.

One left-to-right scan with compiled regular expressions finds the earliest
construct at each point and skips to its end, counting nesting:
  * HTML comments `<!-- ... -->`;
  * templates and arguments `{{ ... }}` (nested, with links, comments and
    verbatim tags inside them skipped whole);
  * tables `{| ... |}` opening at a line's start (nested);
  * the tags of DROPPED_TAGS with their contents (`<ref>`, `<math>`, ...), or
    self-closing (`<ref name="a"/>`); nowiki elements are passed on whole, as
    their contents are literal text;
  * links into the namespaces and interlanguage prefixes `LinkRules` drops
    (files, images, categories), captions with nested links included;
and then `cut_end_sections` removes the trailing sections (See also,
References, ...) by their headings.

Each construct is recognised as mwparserfromhell recognises it (an element
without its end is text to both), so the parser's view of what remains is
the same as its view of the whole page: tests/test_create_text_wikitext.py
checks that both paths give the same passages for every rule.
"""

import re
from typing import Optional

# Elements dropped with their contents: references, math, chemistry, code and
# preformatted blocks, galleries and other media, tables in HTML, inputs.
DROPPED_TAGS = frozenset({
    "ref", "references", "math", "chem", "ce", "pre", "source",
    "syntaxhighlight", "gallery", "timeline", "score", "graph", "hiero",
    "imagemap", "inputbox", "templatedata", "categorytree", "section",
    "mapframe", "maplink", "table", "includeonly"})
# Elements whose contents mwparserfromhell does not parse (its
# PARSER_BLACKLIST): a brace or bracket inside them is text.
VERBATIM_TAGS = frozenset({
    "categorytree", "ce", "chem", "gallery", "graph", "hiero", "imagemap",
    "inputbox", "math", "nowiki", "pre", "score", "section", "source",
    "syntaxhighlight", "templatedata", "timeline"})
# Trailing sections dropped whole, by their heading (lower case).
END_SECTIONS = frozenset({
    "see also", "references", "notes", "footnotes", "citations", "sources",
    "further reading", "external links", "bibliography", "works cited",
    "notes and references", "references and notes", "explanatory notes",
    "general references", "selected bibliography", "reference",
    "external link", "literature", "related pages", "other websites"})
# Interwiki prefixes to other projects: such a link shows its text in the
# page (`[[wikt:word|word]]`), unlike an interlanguage link.
_INTERWIKI = frozenset({
    "w", "wikt", "wiktionary", "wikipedia", "s", "wikisource", "b",
    "wikibooks", "q", "wikiquote", "n", "wikinews", "v", "wikiversity",
    "voy", "wikivoyage", "d", "wikidata", "c", "commons", "m", "meta",
    "mw", "species", "wikispecies", "foundation", "wmf", "phab", "doi",
    "iarchive", "gutenberg", "imdbname", "imdbtitle"})
# A language code (de, fr, zh-min-nan, be-x-old, simple): an interlanguage
# link, which MediaWiki shows beside the page, not in it.
_LANGUAGE = re.compile(r"(?:[a-z]{2,3}(?:-[a-z0-9]{1,8})*|simple)\Z")


class LinkRules:
  """Which `[[...]]` links the rules drop: files, images and media,
  categories (by the dump's names for namespaces 6, 14 and -2 and their
  English aliases) and interlanguage links; a leading colon
  (`[[:Category:X]]`) makes any link a visible one."""

  def __init__(self, namespace_names: Optional[dict[int, str]] = None):
    names = {"file", "image", "media", "category"}
    for key, name in (namespace_names or {}).items():
      if key in (-2, 6, 14) and name:
        names.add(name.lower())
    self.dropped_namespaces = frozenset(names)
    alternatives = "|".join(sorted(("[ _]".join(map(re.escape, n.split(" ")))
                                    for n in names), key=len, reverse=True))
    # The start of a dropped link: namespace names in any case, language
    # codes in lower case.
    self.start = re.compile(
        r"\[\[[ \t]*(?:(?i:" + alternatives + r")|(?:[a-z]{2,3}(?:-[a-z0-9]{1,8})*"
        r"|simple))[ \t]*:")

  def drops(self, title: str) -> bool:
    """True for a link target the rules drop (`File:A.jpg`, `de:Haus`)."""
    title = title.strip()
    if title.startswith(":") or ":" not in title:
      return False
    prefix = title.split(":", 1)[0].strip()
    if prefix.lower().replace("_", " ") in self.dropped_namespaces:
      return True
    return bool(_LANGUAGE.match(prefix)) and prefix not in _INTERWIKI


def _tag_names(names) -> str:
  return "|".join(sorted(names, key=len, reverse=True))


_DROP_OR_VERBATIM = _tag_names(DROPPED_TAGS | VERBATIM_TAGS)
# What the main scan stops at; the rest is copied as it is.
_MAIN = re.compile(
    r"<!--|\{\{+|^[ \t]*\{\||<(" + _DROP_OR_VERBATIM + r")(?=[\s/>])", re.I | re.M)
# What a scan inside a template, a table or a dropped link stops at.
_NESTED = re.compile(r"<!--|\{\{+|\}\}+|\[\[|\]\]|^[ \t]*\{\||^[ \t]*\|\}|<("
                     + _tag_names(VERBATIM_TAGS | {"ref"}) + r")(?=[\s/>])",
                     re.I | re.M)
_TAG_OPEN_END = re.compile(r"[^<>]*?(/?)>", re.S)
# What a cut construct leaves: an empty comment, a node that renders as
# nothing, as the construct did, so that the markup around it (bold quotes
# on either side, a line's start) parses as it did.
GAP = "<!---->"
_HEADING = re.compile(r"^(={1,6})(.+?)(={1,6})[ \t]*$", re.M)


def _comment_end(text: str, pos: int) -> int:
  """The end of a comment opening at `pos`, or -1 if it is never closed
  (mwparserfromhell then reads `<!--` as text)."""
  end = text.find("-->", pos + 4)
  return -1 if end < 0 else end + 3


def _tag_end(text: str, pos: int, name: str) -> int:
  """The end of the element whose opening tag `<name` is at `pos`: after
  `/>` for a self-closing tag, after the matching `</name>` otherwise
  (counting nested elements of the same name where the contents are
  parsed); -1 if the tag is not closed."""
  m = _TAG_OPEN_END.match(text, pos + 1 + len(name))
  if m is None:
    return -1
  if m.group(1):
    return m.end()
  close = re.compile(r"</" + name + r"\s*>|<" + name + r"(?=[\s/>])[^<>]*?(/?)>",
                     re.I)
  depth, at = 1, m.end()
  while True:
    c = close.search(text, at)
    if c is None:
      return -1
    at = c.end()
    if c.group().startswith("</"):
      depth -= 1
      if depth == 0:
        return at
    elif not c.group(1) and name.lower() not in VERBATIM_TAGS:
      depth += 1  # Parsed contents: the same element may nest.


def _nested_end(text: str, at: int, kind: str, braces: int = 2) -> int:
  """The end of a template, table or link (`kind`) whose opening (`braces`
  braces, `{|` or `[[`) ends at `at`, nested constructs skipped; -1 if it
  is never closed. Braces are counted one by one, so that arguments
  (`{{{1}}}`) and templates in them close where they open."""
  depth = braces if kind == "template" else 1
  while True:
    m = _NESTED.search(text, at)
    if m is None:
      return -1
    token, at = m.group(), m.end()
    if token == "<!--":
      end = _comment_end(text, m.start())
      at = end if end >= 0 else at
    elif m.group(1):
      end = _tag_end(text, m.start(), m.group(1))
      at = end if end >= 0 else at
    elif token.startswith("{{"):
      if kind == "template":
        depth += len(token)
      else:
        end = _nested_end(text, at, "template", len(token))
        at = end if end >= 0 else at
    elif token.startswith("}}"):
      if kind == "template":
        closed = min(len(token), depth)
        depth -= closed
        at = m.start() + closed
    elif token == "[[":
      if kind == "link":
        depth += 1
    elif token == "]]":
      if kind == "link":
        depth -= 1
    elif token.endswith("{|"):
      if kind == "table":
        depth += 1
    elif token.endswith("|}"):
      if kind == "table":
        depth -= 1
    if depth == 0:
      return at


def cut(text: str, links: LinkRules) -> str:
  """The text with comments, templates, tables, the DROPPED_TAGS elements,
  dropped links and then the trailing sections cut out."""
  out, pos = [], 0
  start = links.start
  while True:
    m = _MAIN.search(text, pos)
    link = start.search(text, pos, m.start() if m else len(text))
    if link is not None:
      m = link
    if m is None:
      break
    out.append(text[pos:m.start()])
    token = m.group()
    if link is not None:
      if not links.drops(token[2:]):  # An interwiki link: kept.
        out.append("[[")
        pos = m.start() + 2
        continue
      end = _nested_end(text, m.start() + 2, "link")
    elif token == "<!--":
      end = _comment_end(text, m.start())
    elif token.startswith("{{"):
      end = _nested_end(text, m.end(), "template", len(token))
    elif token.endswith("{|"):
      # The spaces before the table stay, as they do around the parser's node.
      out.append(token[:-2])
      end = _nested_end(text, m.end(), "table")
      if end < 0:
        out.append("{|")
        pos = m.end()
        continue
    else:
      name = m.group(1)
      end = _tag_end(text, m.start(), name)
      if end >= 0 and name.lower() not in DROPPED_TAGS:  # nowiki: kept whole.
        out.append(text[m.start():end])
        pos = end
        continue
    if end < 0:  # Not closed: text, as to the parser.
      out.append(token)
      pos = m.end()
    else:
      out.append(GAP)
      pos = end
  out.append(text[pos:])
  return cut_end_sections("".join(out))


_TITLE_MARKUP = re.compile(r"<!--.*?-->|\{\{[^{}]*\}\}|'{2,}", re.S)


def heading_title(title: str) -> str:
  """A heading's title as END_SECTIONS holds it: lower case, without
  comments, templates, bold or italic quotes, or spaces or a colon around
  it."""
  return " ".join(_TITLE_MARKUP.sub("", title).split()).strip(" :").lower()


def cut_end_sections(text: str) -> str:
  """The text without the sections END_SECTIONS names: from such a heading
  to the next heading of the same or a higher level (its subsections go
  with it)."""
  out, pos, cut_level = [], 0, 0
  for m in _HEADING.finditer(text):
    level = min(len(m.group(1)), len(m.group(3)))
    if cut_level and level > cut_level:
      continue
    if cut_level:  # The cut ends at this heading.
      pos, cut_level = m.start(), 0
    if heading_title(_title(m, level)) in END_SECTIONS:
      out.append(text[pos:m.start()])
      cut_level = level
  if not cut_level:
    out.append(text[pos:])
  return "".join(out)


def _title(m: re.Match, level: int) -> str:
  """A heading's title: the text between its first and last `level` `=`s."""
  whole = m.group(0).rstrip()
  return whole[level:len(whole) - level]
