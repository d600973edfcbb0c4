"""Prepared TFDS text -> documents, with the rules that still apply.

TensorFlow Datasets' `wikipedia/*` examples hold an article's `title` and
its `text`, already plain: mwparserfromhell's `strip_code` of the page with
templates, `<ref>`s, tables and file and category links removed, but each
section's heading kept as a line of its own and each list item as a line
without its marker. From that text:
  * disambiguation pages are dropped (their title, or a first paragraph
    ending in "may refer to:");
  * the trailing sections are cut: from the first line that is one of
    markup_scan.END_SECTIONS to the end (the text no longer says where a
    section ends, so everything after such a heading goes);
  * lines without sentence-ending punctuation of up to ten words are dropped:
    headings and list items.
What it cannot undo: a list item or a heading that ends with punctuation (a
question as a heading, a full sentence as a list item) stays; the text of
templates, tables and captions is gone already, as the rules want; redirects
and other namespaces are not in the dataset.

`pg19` examples hold a book's `book_text`; books.py's rules apply to it
whole (PG-19 has already cut the Gutenberg header and licence).
"""

from bertjax.corpus import markup_scan

_SENTENCE_END = tuple(".!?\"')\u201d\u2019")
_DISAMBIGUATION = ("may refer to:", "may also refer to:", "may stand for:")


def wikipedia_paragraphs(title: str, text: str, counts) -> list[str] | None:
  """The passages of a TFDS wikipedia example, or None for a
  disambiguation page. `counts` gets `headings_or_list_lines` (dropped)."""
  lines = [line.strip() for line in text.replace("\r", "").split("\n")]
  lines = [line for line in lines if line]
  if title.rstrip().endswith("(disambiguation)") or (
      lines and lines[0].rstrip().endswith(_DISAMBIGUATION)):
    return None
  out = []
  for line in lines:
    if markup_scan.heading_title(line) in markup_scan.END_SECTIONS:
      break
    if len(line.split()) <= 10 and not line.endswith(_SENTENCE_END):
      counts["headings_or_list_lines"] += 1
      continue
    out.append(" ".join(line.split()))
  return out
