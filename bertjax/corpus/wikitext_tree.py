"""The reference rendering: mwparserfromhell's node tree of a whole page.

The page is parsed as it is, without markup_scan's pre-pass, into
mwparserfromhell's tree, and the tree is walked with the rules of
wikitext.py (the same tag, link, heading and pipe-trick decisions). It is
the parser-only path that tests/test_create_text_wikitext.py and the
benchmark hold wikitext.passages to; extraction does not use it.
"""

import html

import mwparserfromhell
from mwparserfromhell import nodes as N

from bertjax.corpus import markup_scan
from bertjax.corpus import wikitext


def render(text: str, links: markup_scan.LinkRules) -> str:
  """The page rendered to text with wikitext.DROP_LINE marks."""
  try:
    code = mwparserfromhell.parse(text)
  except Exception as e:  # pylint: disable=broad-except
    raise wikitext.ParseFailure(f"mwparserfromhell: {e}") from e
  walker = _Walker(links)
  out, cut_level = [], 0
  for node in code.nodes:
    if isinstance(node, N.Heading):
      if cut_level and node.level > cut_level:
        continue
      cut_level = 0
      title = walker.render(node.title.nodes)
      if markup_scan.heading_title(title) in markup_scan.END_SECTIONS:
        cut_level = node.level
      else:
        out.append(wikitext.DROP_LINE)
      continue
    if not cut_level:
      out.append(walker.node(node))
  return "".join(out)


def _text_of(nodes) -> tuple[str, bool]:
  """(the Text nodes' text, whether there were only Text nodes)."""
  parts = [n.value for n in nodes if isinstance(n, N.Text)]
  return "".join(parts), len(parts) == len(nodes)


class _Walker:
  """Renders nodes with the rules' drops."""

  def __init__(self, links: markup_scan.LinkRules):
    self.links = links

  def render(self, nodes) -> str:
    return "".join(self.node(n) for n in nodes)

  def node(self, node) -> str:  # pylint: disable=too-many-return-statements
    if isinstance(node, N.Text):
      return node.value
    if isinstance(node, N.Wikilink):
      title, _ = _text_of(node.title.nodes)
      if self.links.drops(title):
        return ""
      if node.text is None:
        return self.render(node.title.nodes).strip().lstrip(":")
      text, plain = _text_of(node.text.nodes)
      if plain and not text.strip():
        return wikitext.pipe_trick(title)
      return self.render(node.text.nodes)
    if isinstance(node, N.Tag):
      name, _ = _text_of(node.tag.nodes)
      rendering = wikitext.tag_rendering(name, node.wiki_markup)
      if rendering is not None:
        return rendering
      return "" if node.contents is None else self.render(node.contents.nodes)
    if isinstance(node, N.HTMLEntity):
      return html.unescape(str(node))
    if isinstance(node, N.ExternalLink):
      if node.brackets and node.title is not None:
        return self.render(node.title.nodes)
      return ""
    if isinstance(node, N.Heading):
      return wikitext.DROP_LINE
    return ""  # Templates, arguments, comments.
