"""The paper's rules for Wikipedia text, a case per rule, and the pre-pass
held to the parser-only path (bertjax/corpus/wikitext.py, markup_scan.py)."""

import pytest

import wiki_dumps
from bertjax.corpus import markup_scan
from bertjax.corpus import wikitext

_LINKS = markup_scan.LinkRules(wiki_dumps.NAMESPACES)
_KEEP = "Kept words stay."

# (rule, wikitext, passages): each drops its construct around a kept sentence.
CASES = [
    ("heading", f"== Early life ==\n{_KEEP}", [_KEEP]),
    ("heading level 4", f"==== Deep ====\n{_KEEP}", [_KEEP]),
    ("list item *", f"* An item.\n{_KEEP}", [_KEEP]),
    ("list item #", f"# An item.\n{_KEEP}", [_KEEP]),
    ("definition ;", f"; Term : definition\n{_KEEP}", [_KEEP]),
    ("indent :", f": Indented.\n{_KEEP}", [_KEEP]),
    ("table", f'{{| class="wikitable"\n! A !! B\n|-\n| 1 || 2\n|}}\n{_KEEP}',
     [_KEEP]),
    ("nested table", f"{{|\n|\n{{|\n| inner\n|}}\n|}}\n{_KEEP}", [_KEEP]),
    ("indented table", f":{{|\n| cell\n|}}\n{_KEEP}", [_KEEP]),
    ("html table", f"<table><tr><td>cell</td></tr></table>\n{_KEEP}", [_KEEP]),
    ("template", "Kept {{convert|5|km}}words stay.", [_KEEP]),
    ("infobox", f"{{{{Infobox town\n| name = X\n| map = [[File:M.png]]\n}}}}\n{_KEEP}",
     [_KEEP]),
    ("navbox", f"{_KEEP}\n\n{{{{Navbox|list1=[[A]] [[B]]}}}}", [_KEEP]),
    ("nested templates", "Kept {{a|{{b|{{c}}}}}}words stay.", [_KEEP]),
    ("citation", "Kept words stay.{{cite book|title=T|url=http://x.y}}",
     [_KEEP]),
    ("template argument", "Kept {{{1|default}}}words stay.", [_KEEP]),
    ("ref", "Kept words stay.<ref>A [[source]], {{cite web|url=u}}.</ref>",
     [_KEEP]),
    ("ref named", 'Kept words<ref name="a">x</ref> stay.<ref name="a" />',
     [_KEEP]),
    ("ref upper case", "Kept words stay.<REF>x</REF>", [_KEEP]),
    ("references", f"{_KEEP}\n<references />", [_KEEP]),
    ("file", f"[[File:A.jpg|thumb|A [[caption]] here]]\n{_KEEP}", [_KEEP]),
    ("image", f"[[Image:A.jpg|left|Caption]]{_KEEP}", [_KEEP]),
    ("media", f"[[Media:A.ogg|sound]]{_KEEP}", [_KEEP]),
    ("gallery", f"<gallery>\nFile:A.jpg|One\n</gallery>\n{_KEEP}", [_KEEP]),
    ("category", f"{_KEEP}\n[[Category:Towns|Sort key]]", [_KEEP]),
    ("interlanguage", f"{_KEEP}\n[[de:Stadt]]\n[[zh-min-nan:Siâⁿ]]", [_KEEP]),
    ("comment", "Kept <!-- hidden\nlines -->words stay.", [_KEEP]),
    ("math", "Kept <math>x^2</math>words stay.", [_KEEP]),
    ("chem", "Kept <chem>H2O</chem>words stay.", [_KEEP]),
    ("syntaxhighlight", f'{_KEEP}<syntaxhighlight lang="c">int x;</syntaxhighlight>',
     [_KEEP]),
    ("source", f"{_KEEP}<source>x = 1</source>", [_KEEP]),
    ("pre", f"{_KEEP}<pre>pre text</pre>", [_KEEP]),
    ("see also", f"{_KEEP}\n== See also ==\nLater text here.", [_KEEP]),
    ("references section", f"{_KEEP}\n==References==\nText {{{{Reflist}}}}.",
     [_KEEP]),
    ("notes and further reading",
     f"{_KEEP}\n== Notes ==\nA note.\n== Further reading ==\nA book.", [_KEEP]),
    ("external links", f"{_KEEP}\n== External links ==\n* [http://a.b Site]",
     [_KEEP]),
    ("bibliography subsections",
     f"{_KEEP}\n== Bibliography ==\n=== Primary ===\nA work.", [_KEEP]),
    ("section after end matter",
     f"{_KEEP}\n== See also ==\nDropped.\n== Legacy ==\nAlso kept here.",
     [_KEEP, "Also kept here."]),
    ("switch", f"__NOTOC__\n{_KEEP}", [_KEEP]),
    ("bare url", "Kept http://example.org words stay.", [_KEEP]),
    ("untitled external link", "Kept [http://example.org] words stay.",
     [_KEEP]),
    # What is kept.
    ("link text", "A [[Target page|kept text]] here.", ["A kept text here."]),
    ("plain link", "A [[Target]] here.", ["A Target here."]),
    ("link trail", "Two [[river]]s here.", ["Two rivers here."]),
    ("pipe trick", "The [[Mill (grinding)|]] here.", ["The Mill here."]),
    ("visible category link", "See [[:Category:Towns]] here.",
     ["See Category:Towns here."]),
    ("interwiki text", "A [[wikt:word|word]] here.", ["A word here."]),
    ("bold and italic", "A '''bold''' and ''italic'' and '''''both''''' word.",
     ["A bold and italic and both word."]),
    ("titled external link", "The [http://x.org railway line] ran.",
     ["The railway line ran."]),
    ("entities", "Caf&eacute; &amp; bar&nbsp;now &#8212; &#x41;.",
     ["Café & bar now \u2014 A."]),
    ("inline tags", "A <small>small</small> <sup>1</sup> <span>span</span>.",
     ["A small 1 span."]),
    ("nowiki", "A <nowiki>[[not a link]]</nowiki> here.",
     ["A [[not a link]] here."]),
    ("line break", "One<br />two.", ["One two."]),
    ("paragraphs", "First line\nsame paragraph.\n\nSecond one.",
     ["First line same paragraph.", "Second one."]),
]


@pytest.mark.parametrize("rule,text,expected", CASES, ids=[c[0] for c in CASES])
def test_rule(rule, text, expected):
  del rule
  assert wikitext.passages(text, _LINKS) == expected


@pytest.mark.parametrize("rule,text,expected", CASES, ids=[c[0] for c in CASES])
def test_prepass_matches_the_parser_only_path(rule, text, expected):
  del rule, expected
  assert wikitext.passages(text, _LINKS) == wikitext.reference_passages(
      text, _LINKS)


def test_article_with_every_construct():
  assert wikitext.passages(wiki_dumps.ARTICLE, _LINKS) == (
      wiki_dumps.ARTICLE_PASSAGES)
  assert wikitext.reference_passages(wiki_dumps.ARTICLE, _LINKS) == (
      wiki_dumps.ARTICLE_PASSAGES)
  # Every case at once, in one page, both ways.
  page = "\n\n".join(text for _, text, _ in CASES if "==" not in text)
  assert wikitext.passages(page, _LINKS) == wikitext.reference_passages(
      page, _LINKS)


def test_unclosed_constructs_are_text_to_both_paths():
  for text in ["A {{b c", "A <ref>x", "A <!-- b", "A [[File:x", "A\n{|\n| b"]:
    assert wikitext.passages(text, _LINKS) == wikitext.reference_passages(
        text, _LINKS), text


def test_the_cut_leaves_markup_around_it_as_it_was():
  # Quotes around a cut template still close: "Algeria" is bold, not text.
  text = "'''Algeria''' ({{lang|ar|x}} ''{{transl|y}}''; ''Dzayer'') is a state."
  assert wikitext.passages(text, _LINKS) == ["Algeria (; Dzayer) is a state."]
  assert markup_scan.cut("a {{b}} c", _LINKS) == f"a {markup_scan.GAP} c"


def test_localized_namespaces_and_interwiki_prefixes():
  german = markup_scan.LinkRules({6: "Datei", 14: "Kategorie"})
  assert german.drops("Datei:Bild.png") and german.drops("Kategorie:Orte")
  assert german.drops("File:Bild.png")  # English aliases work everywhere.
  assert german.drops("fr:Ville") and german.drops("simple:Town")
  assert not german.drops(":Kategorie:Orte")
  assert not german.drops("wikt:word") and not german.drops("voy:Paris")
  assert not german.drops("Star Trek: Voyager")
  text = "[[Datei:Bild.png|mini|Bild]]Der Ort liegt am Fluss."
  assert wikitext.passages(text, german) == ["Der Ort liegt am Fluss."]


def test_redirect_and_disambiguation():
  assert wikitext.is_redirect("#REDIRECT [[Target]]")
  assert wikitext.is_redirect("  #redirect[[Target]]")
  assert not wikitext.is_redirect("A #REDIRECT in text.")
  assert wikitext.is_disambiguation("Mercury (disambiguation)", "")
  for template in ("{{disambiguation}}", "{{Disambig|geo}}", "{{dab}}",
                   "{{hndis|Smith, John}}", "{{geodis}}"):
    assert wikitext.is_disambiguation("Mercury", "Mercury may be:\n" + template)
  assert not wikitext.is_disambiguation("Mercury", "{{Infobox planet}}")


def test_end_section_titles_are_normalised():
  assert markup_scan.heading_title(" ''See also'' ") == "see also"
  assert markup_scan.heading_title("References<!-- x -->") == "references"
  assert markup_scan.cut_end_sections(
      "a\n== Notes ==\nb\n=== Sub ===\nc\n== Life ==\nd") == "a\n== Life ==\nd"
