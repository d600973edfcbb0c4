"""Books and prepared TFDS text: Project Gutenberg's markers, licence, notes
and headings; TFDS wikipedia and pg19 examples (bertjax/corpus/books.py,
tfds_text.py, sources.py)."""

import collections

import pytest

from bertjax.corpus import books
from bertjax.corpus import sources
from bertjax.corpus import tfds_text

_PROSE = ("It was a cold morning when the miller walked down to the\n"
          "river. He carried a _heavy_ sack on his back, and the road\n"
          "was long.")
_KEPT = ("It was a cold morning when the miller walked down to the river. He "
         "carried a heavy sack on his back, and the road was long.")


def book(body: str, start: str = "*** START OF THE PROJECT GUTENBERG EBOOK "
         "A TALE ***", end: str = "*** END OF THE PROJECT GUTENBERG EBOOK "
         "A TALE ***") -> str:
  return ("The Project Gutenberg eBook of A Tale\r\n\r\nThis eBook is for the "
          "use of anyone anywhere.\r\n\r\n" + start + "\r\n\r\n" + body
          + "\r\n\r\n" + end + "\r\n\r\nSection 1. General Terms of Use and "
          "Redistributing Project Gutenberg electronic works.\r\n")


def _paragraphs(text):
  counts = collections.Counter()
  return books.paragraphs(text, counts), counts


@pytest.mark.parametrize("start,end", [
    ("*** START OF THE PROJECT GUTENBERG EBOOK A TALE ***",
     "*** END OF THE PROJECT GUTENBERG EBOOK A TALE ***"),
    ("*** START OF THIS PROJECT GUTENBERG EBOOK A TALE ***",
     "*** END OF THIS PROJECT GUTENBERG EBOOK A TALE ***"),
    ("***START OF THE PROJECT GUTENBERG EBOOK A TALE***",
     "End of the Project Gutenberg EBook of A Tale, by Someone"),
    ("*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*",
     "End of Project Gutenberg's A Tale, by Someone"),
])
def test_header_and_licence_removed(start, end):
  paragraphs, counts = _paragraphs(book(_PROSE, start, end))
  assert paragraphs == [_KEPT] and counts["markers"] == 1


def test_small_print_after_the_first_marker_is_removed():
  text = ("**The Project Gutenberg Etext of A Tale**\n\n"
          "*** START OF THE PROJECT GUTENBERG EBOOK ***\n\n"
          "**Welcome To The World of Free Plain Vanilla Electronic Texts**\n\n"
          "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n"
          + _PROSE + "\n\n" + "More prose of the tale follows here. " * 40)
  paragraphs, _ = _paragraphs(text)
  assert paragraphs[0] == _KEPT


def test_without_markers_everything_but_headings_is_kept():
  paragraphs, counts = _paragraphs("CHAPTER I.\n\n" + _PROSE)
  assert paragraphs == [_KEPT] and counts["markers"] == 0


def test_credits_notes_and_illustrations_removed():
  body = ("Produced by Jane Doe and the Online Distributed\nProofreading Team.\n\n"
          "[Transcriber's Note: Obvious printer errors have been corrected.]\n\n"
          "Transcriber's Notes:\n\nSpelling has been kept as printed.\n\n"
          + _PROSE + "\n\n[Illustration: The miller at the river.]\n\n"
          "He rested.[Footnote 1: At the bridge.]")
  paragraphs, _ = _paragraphs(book(body))
  assert paragraphs == [_KEPT, "He rested."]


@pytest.mark.parametrize("heading", [
    "CHAPTER IV", "CHAPTER IV.", "Chapter 12.", "Chapter 12. In Which Nothing "
    "Happens", "BOOK ONE", "Book the First", "PART II. THE RETURN", "IV.",
    "XII", "12", "THE END", "CONTENTS", "PREFACE", "VOLUME III", "Canto 3",
])
def test_chapter_headings_dropped(heading):
  paragraphs, counts = _paragraphs(book(f"{heading}\n\n{_PROSE}"))
  assert paragraphs == [_KEPT] and counts["headings"] >= 1


def test_chapter_title_under_its_number_and_tables_of_contents_dropped():
  body = ("CONTENTS\n\nCHAPTER I. The Mill\nCHAPTER II. The River\n\n"
          "Loomings\nThe Carpet-Bag\nThe Spouter-Inn\n\n"
          "CHAPTER I.\n\nThe Mill\n\n" + _PROSE + '\n\n"Good day," said he.')
  paragraphs, _ = _paragraphs(book(body))
  assert paragraphs == [_KEPT, '"Good day," said he.']


def test_sentences_that_start_like_headings_are_kept():
  body = ("Book one of his trilogy was published in 1820, and it sold well "
          "across the whole country.\n\nPart of the crowd stayed behind.")
  paragraphs, _ = _paragraphs(book(body))
  assert len(paragraphs) == 2


def test_tfds_wikipedia_rules():
  counts = collections.Counter()
  text = ("Testville is a town in the county of Examplia, by the river.\n\n"
          "History\n\nThe town was founded in 1850 by settlers.\n"
          "A list item\nAnother list item\n\nSee also\n\nOther town\n\n"
          "References\n\nA book about it, 1990.")
  assert tfds_text.wikipedia_paragraphs("Testville", text, counts) == [
      "Testville is a town in the county of Examplia, by the river.",
      "The town was founded in 1850 by settlers."]
  assert counts["headings_or_list_lines"] == 3
  assert tfds_text.wikipedia_paragraphs(
      "Mercury", "Mercury may refer to:\nA planet\nAn element", counts) is None
  assert tfds_text.wikipedia_paragraphs(
      "Mercury (disambiguation)", "Mercury is many things.", counts) is None


def _mock_tfds(examples_by_name):
  """tfds.testing.mock_data serving these examples, honouring even splits."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  def as_dataset(self, split, *args, **kwargs):
    del args, kwargs
    examples = examples_by_name[self.name]
    n = len(examples)
    part = examples[split.index * n // split.count:
                    (split.index + 1) * n // split.count]
    keys = examples[0].keys()
    return tf.data.Dataset.from_tensor_slices(
        {k: [e[k] for e in part] for k in keys})

  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


def test_tfds_sources_offline():
  prose = " ".join(["The river ran past the old mill and the town grew."] * 3)
  wiki = [{"title": f"Town {i}", "text": f"Town {i} is a town.\n\n{prose}\n\n"
           "See also\n\nOther town"} for i in range(10)]
  wiki[4] = {"title": "Town (disambiguation)", "text": "Town may refer to:"}
  pg19 = [{"book_text": f"CHAPTER I.\n\n{prose}\n{prose}", "short_book_title":
           "A Tale", "publication_date": 1900, "url": "u"}] * 3
  with _mock_tfds({"wikipedia": wiki, "pg19": pg19}):
    report = collections.Counter()
    shards = sources.list_shards("tfds", tfds_name="wikipedia/20230601.en")
    docs = [d for s in shards for d, _ in sources.iter_documents(s, 20, report)]
    assert len(docs) == 9 and report["read"] == 10
    assert report["dropped.disambiguation"] == 1
    assert docs[0] == ["Town 0 is a town."] + [
        "The river ran past the old mill and the town grew."] * 3
    assert sources.unit("tfds", "pg19") == "books"
    shards = sources.list_shards("tfds", tfds_name="pg19")
    docs = [d for s in shards for d, _ in sources.iter_documents(s, 20, report)]
    assert len(docs) == 3 and len(docs[0]) == 6
  with pytest.raises(ValueError, match="--tfds_name=lm1b"):
    sources.list_shards("tfds", tfds_name="lm1b")
  with pytest.raises(ValueError, match="--input_file"):
    sources.list_shards("tfds", "x.txt", tfds_name="pg19")
