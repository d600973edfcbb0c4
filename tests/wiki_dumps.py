"""MediaWiki dumps that the create_text tests write, in the real dump schema.

`dump_xml` gives a `<mediawiki>` document as Wikimedia exports it (schema
0.10: `<siteinfo>` with its namespaces, then `<page>`s with `<title>`,
`<ns>`, `<id>`, `<redirect title=.../>` and a `<revision>` whose `<text
xml:space="preserve">` holds the wikitext); `write_dump` writes it plain,
gzip, bz2 (one stream) or multistream bz2 (a stream for the header, one per
`pages_per_stream` pages, one for the footer, and the index file
`offset:pageid:title` beside it, as Wikimedia's `*-multistream.xml.bz2`).
`ARTICLE` holds every construct the rules drop or keep.
"""

import bz2
import gzip
from xml.sax import saxutils

NAMESPACES = {-2: "Media", -1: "Special", 0: "", 1: "Talk", 2: "User",
              4: "Wikipedia", 6: "File", 10: "Template", 14: "Category",
              100: "Portal"}

# An article with every construct of the rules, and what is kept of it.
ARTICLE = """{{Short description|A town}}
{{Infobox settlement
| name = Testville
| population = {{formatnum:1234}}
| map = [[File:Map.png|thumb|A map]]
}}
'''Testville''' is a [[town]] in the [[Example County|county]] of ''Examplia''.<ref>{{cite web|url=http://x.org|title=Source}}</ref> It has a [[river]]s and &nbsp;three&mdash;bridges.<!-- a hidden comment --> The mayor said so.<ref name="a" />

[[File:Testville.jpg|thumb|The centre, with a [[church]]]]
== History ==
The town was founded in 1850 by [[settler]]s from the [[Old World|east]].{{citation needed|date=May 2020}} Its first [[mill (grinding)|]] stood by the water.
Trade grew along the [http://example.org railway line] after 1880.

=== Growth ===
* A list item that is dropped.
# A numbered item that is dropped.
; A term : its definition
: An indented line.
The population doubled between 1900 and 1950, as <math>x^2</math> shows.

{| class="wikitable"
! Year !! Population
|-
| 1900 || 500
|}
<gallery>
File:A.jpg|Caption one
</gallery>
A closing paragraph with <nowiki>[[literal brackets]]</nowiki> and <code>code words</code>.<syntaxhighlight lang="python">print(1)</syntaxhighlight>
<pre>preformatted text</pre>

== See also ==
* [[Other town]]

== References ==
{{Reflist}}

== External links ==
* [http://testville.example.org Official site]

[[Category:Towns]]
[[de:Testville]]
[[fr:Testville]]
"""

ARTICLE_PASSAGES = [
    "Testville is a town in the county of Examplia. It has a rivers and "
    "three\u2014bridges. The mayor said so.",
    "The town was founded in 1850 by settlers from the east. Its first mill "
    "stood by the water. Trade grew along the railway line after 1880.",
    "The population doubled between 1900 and 1950, as shows.",
    "A closing paragraph with [[literal brackets]] and code words.",
]


def page_xml(title: str, text: str | None, page_id: int, ns: int = 0,
             redirect: str | None = None, with_ns: bool = True) -> str:
  """One `<page>` element as a dump writes it."""
  lines = ["  <page>", f"    <title>{saxutils.escape(title)}</title>"]
  if with_ns:
    lines.append(f"    <ns>{ns}</ns>")
  lines.append(f"    <id>{page_id}</id>")
  if redirect is not None:
    lines.append(f"    <redirect title={saxutils.quoteattr(redirect)} />")
  lines += ["    <revision>", f"      <id>{page_id + 1000}</id>",
            "      <timestamp>2020-01-01T00:00:00Z</timestamp>",
            "      <contributor><username>Tester</username><id>1</id>"
            "</contributor>", "      <model>wikitext</model>",
            "      <format>text/x-wiki</format>"]
  if text is not None:
    lines.append(f'      <text bytes="{len(text.encode())}" xml:space="preserve">'
                 f"{saxutils.escape(text)}</text>")
  lines += ["    </revision>", "  </page>"]
  return "\n".join(lines) + "\n"


def header(namespaces=None) -> str:
  namespaces = NAMESPACES if namespaces is None else namespaces
  ns = "\n".join(
      f'      <namespace key="{k}" case="first-letter"'
      + (f">{saxutils.escape(v)}</namespace>" if v else " />")
      for k, v in sorted(namespaces.items()))
  return ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" '
          'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
          'version="0.10" xml:lang="en">\n  <siteinfo>\n'
          "    <sitename>Wikipedia</sitename>\n    <dbname>enwiki</dbname>\n"
          "    <case>first-letter</case>\n    <namespaces>\n"
          f"{ns}\n    </namespaces>\n  </siteinfo>\n")


FOOTER = "</mediawiki>\n"


def dump_xml(pages: list[str], namespaces=None) -> str:
  return header(namespaces) + "".join(pages) + FOOTER


def write_dump(path: str, pages: list[str], kind: str = "xml",
               pages_per_stream: int = 100, namespaces=None) -> str:
  """Writes pages as a dump file of `kind` (xml, gz, bz2, multistream)."""
  if kind == "xml":
    with open(path, "w", encoding="utf-8") as f:
      f.write(dump_xml(pages, namespaces))
  elif kind == "gz":
    with gzip.open(path, "wb") as f:
      f.write(dump_xml(pages, namespaces).encode())
  elif kind == "bz2":
    with open(path, "wb") as f:
      f.write(bz2.compress(dump_xml(pages, namespaces).encode(), 1))
  else:
    streams = [bz2.compress(header(namespaces).encode())]
    index, offset = [], len(streams[0])
    for i in range(0, len(pages), pages_per_stream):
      group = pages[i:i + pages_per_stream]
      for page in group:
        title = page.split("<title>", 1)[1].split("</title>", 1)[0]
        page_id = page.split("<id>", 1)[1].split("</id>", 1)[0]
        index.append(f"{offset}:{page_id}:{saxutils.unescape(title)}")
      streams.append(bz2.compress("".join(group).encode()))
      offset += len(streams[-1])
    streams.append(bz2.compress(FOOTER.encode()))
    with open(path, "wb") as f:
      f.write(b"".join(streams))
    index_path = path.replace("multistream", "multistream-index").replace(
        ".xml.bz2", ".txt.bz2")
    with open(index_path, "wb") as f:
      f.write(bz2.compress(("\n".join(index) + "\n").encode()))
  return path


def filler(seed: int, words: int = 150) -> str:
  """An article body of prose, different for each seed."""
  vocab = ("river town market bridge valley church school mill road field "
           "harbour station north south east west old new great small "
           "people built founded grew trade farm hill lake forest").split()
  out, k = [], seed
  for n in range(words):
    k = (k * 1103515245 + 12345) % 2**31
    out.append(vocab[k % len(vocab)])
    if n % 12 == 11:
      out[-1] += "."
  text = " ".join(out)
  return f"Place {seed} is a [[village]] of note. " + text.capitalize() + "."
