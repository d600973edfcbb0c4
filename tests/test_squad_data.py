"""SQuAD reading and features on crafted cases (the original release itself
is compared in test_squad_original.py)."""

import json

import numpy as np
import pytest

import squad_fixtures
from bertjax.records import schema
from bertjax.tasks import squad_data
from bertjax.text import tokenization


def _data(context, qas, title="t"):
  return {"data": [{"title": title, "paragraphs": [{"context": context,
                                                      "qas": qas}]}]}


def _qa(qid, question, context=None, answer=None, start=None, **extra):
  answers = []
  if answer is not None:
    answers = [{"text": answer, "answer_start":
                context.index(answer) if start is None else start}]
  return {"id": qid, "question": question, "answers": answers, **extra}


def test_words_split_on_the_originals_whitespace_only():
  text = " a  b\tc\u202fd\u00a0e\nf"
  words, char_to_word = squad_data.split_words(text)
  assert words == ["a", "b", "c", "d\u00a0e", "f"]  # NBSP is no break.
  assert char_to_word.tolist() == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 3, 4]


def test_training_examples_map_answers_to_words_and_skip_mismatches():
  examples, skipped = squad_data.read_squad_examples(
      squad_fixtures.squad_v1(), is_training=True)
  assert skipped == 1  # q_bad: its answer_start points at "leader".
  by_id = {e.qas_id: e for e in examples}
  assert "q_bad" not in by_id and len(examples) == 8
  year = by_id["q_year"]
  assert year.doc_tokens[year.start_position] == "(1895-1943)."
  assert year.start_position == year.end_position
  hire = by_id["q_hire"]
  assert hire.doc_tokens[hire.start_position:hire.end_position + 1] == [
      "Steve", "Smith's"]
  # The questions of one paragraph share its words.
  assert by_id["q_year"].doc_tokens is by_id["q_town"].doc_tokens


def test_evaluation_examples_keep_every_question_without_answers():
  examples, skipped = squad_data.read_squad_examples(
      squad_fixtures.squad_v2(), is_training=False, version_2=True)
  assert skipped == 0 and len(examples) == 11
  assert all(e.start_position is None for e in examples)


def test_v2_unanswerable_questions():
  examples, _ = squad_data.read_squad_examples(
      squad_fixtures.squad_v2(), is_training=True, version_2=True)
  none = {e.qas_id: e for e in examples}["q_none"]
  assert none.is_impossible and none.orig_answer_text == ""
  assert (none.start_position, none.end_position) == (-1, -1)
  # Without is_impossible, no answers means unanswerable.
  context = "Paris is in France."
  data = _data(context, [_qa("a", "Where?", context, "France"),
                         _qa("b", "Who?")])
  examples, _ = squad_data.read_squad_examples(data, True, version_2=True)
  assert [e.is_impossible for e in examples] == [False, True]


@pytest.mark.parametrize("is_training", [True, False])
def test_tfds_records_read_like_the_json(is_training):
  data = squad_fixtures.squad_v2()
  from_json = squad_data.read_squad_examples(data, is_training, True)
  from_records = squad_data.read_squad_examples(
      squad_fixtures.tfds_records(data), is_training, True)
  assert from_records == from_json


def test_tfds_load_under_mock_data_reads_like_the_json():
  tfds = pytest.importorskip("tensorflow_datasets")
  tf = pytest.importorskip("tensorflow")
  data = squad_fixtures.squad_v2()
  text = tf.TensorSpec((), tf.string)
  answers = {"text": tf.TensorSpec((None,), tf.string),
             "answer_start": tf.TensorSpec((None,), tf.int32)}
  signature = {"id": text, "title": text, "context": text, "question": text,
               "is_impossible": tf.TensorSpec((), tf.bool),
               "answers": answers, "plausible_answers": answers}

  def as_dataset(*args, **kwargs):
    del args, kwargs
    return tf.data.Dataset.from_generator(
        lambda: squad_fixtures.tfds_records(data), output_signature=signature)
  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    dataset = tfds.load("squad/v2.0", split="train")
  assert squad_data.read_squad_examples(dataset, True, True) == (
      squad_data.read_squad_examples(data, True, True))


@pytest.mark.parametrize("content,message", [
    ("{\"data\": [", "not valid JSON"),
    ("{\"version\": \"1.1\"}", "missing field 'data'"),
    (json.dumps(_data("c", [{"id": "x", "answers": []}])),
     r"data\[0\].paragraphs\[0\].qas\[0\]: missing field 'question'"),
    (json.dumps({"data": [{"title": "t", "paragraphs": [{"qas": []}]}]}),
     r"data\[0\].paragraphs\[0\]: missing field 'context'"),
    (json.dumps(_data("c", [{"id": "x", "question": "q",
                             "answers": [{"text": "c"}]}])),
     r"qas\[0\].answers\[0\]: missing field 'answer_start'"),
    (json.dumps(_data("c", [{"id": 3, "question": "q", "answers": []}])),
     r"qas\[0\].id: expected str, got int"),
])
def test_bad_files_name_the_file_and_field(tmp_path, content, message):
  path = tmp_path / "bad.json"
  path.write_text(content, encoding="utf-8")
  with pytest.raises(ValueError, match=message) as error:
    squad_data.read_squad_examples(str(path), is_training=True)
  assert str(path) in str(error.value)


def test_training_needs_exactly_one_answer():
  context = "red green"
  qa = _qa("two", "Which?", context, "red")
  qa["answers"].append({"text": "green", "answer_start": 4})
  with pytest.raises(ValueError, match=r"qas\[0\].*exactly 1 answer; it has 2"):
    squad_data.read_squad_examples(_data(context, [qa]), is_training=True)
  with pytest.raises(ValueError, match=r"it has 0 \(for SQuAD v2.0 data, read "
                     "with version_2=True"):
    squad_data.read_squad_examples(squad_fixtures.squad_v2(), True)


def test_bad_records_name_the_record():
  with pytest.raises(ValueError,
                     match=r"records\[1\]: missing field 'context'"):
    squad_data.read_squad_examples(
        [{"id": "a", "context": "c", "question": "q",
          "answers": {"text": [], "answer_start": []}},
         {"id": "b", "question": "q", "answers": {}}], is_training=False)


# --- Features on a document of one-piece words -----------------------------

WORDS = [f"w{i}" for i in range(20)]


@pytest.fixture(name="tok")
def _tok(tmp_path):
  path = tmp_path / "vocab.txt"
  tokens = list(schema.SPECIAL_TOKENS) + WORDS + ["q", "1895", "(", ")", "-",
                                                  ".", "1943", "japa", "##nese"]
  path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
  return tokenization.WordPieceTokenizer(str(path), True)


def _features(tok, qas, context=" ".join(WORDS), question_len=1, **kw):
  examples, _ = squad_data.read_squad_examples(
      _data(context, qas), kw.pop("is_training", True), kw.pop("v2", False))
  # Windows of 8 document pieces, 3 apart: starts 0, 3, 6, 9, 12.
  lengths = dict(max_seq_length=question_len + 3 + 8, doc_stride=3,
                 max_query_length=question_len)
  lengths.update(kw)
  return squad_data.convert_examples_to_features(examples, tok, **lengths,
                                                 is_training=True)


def test_windows_and_max_context(tok):
  features = _features(tok, [_qa("a", "q", " ".join(WORDS), "w0")])
  starts = [f.token_to_orig_map[3] for f in features]  # After [CLS] q [SEP].
  assert starts == [0, 3, 6, 9, 12]
  assert [f.doc_span_index for f in features] == [0, 1, 2, 3, 4]

  def max_context_window(word):
    owners = [f.doc_span_index for f in features
              for pos in np.flatnonzero(f.token_to_orig_map == word)
              if f.token_is_max_context[pos]]
    assert len(owners) == 1
    return owners[0]
  # w7: min(left, right) is 0 in window 0, 3 in window 1, 1 in window 2.
  assert max_context_window(7) == 1
  # w5: 2 in windows 0 and 1 (same length): the first wins.
  assert max_context_window(5) == 0
  assert max_context_window(0) == 0 and max_context_window(19) == 4
  assert features[0].tokens[:3] == ["[CLS]", "q", "[SEP]"]
  assert features[-1].tokens[-1] == "[SEP]"
  f = features[1]
  assert f.input_mask.sum() == len(f.tokens) == 12  # 3 + 8 + [SEP].
  assert f.segment_ids.tolist() == [0] * 3 + [1] * 9


def test_an_answer_across_windows_belongs_to_the_window_holding_it(tok):
  context = " ".join(WORDS)
  features = _features(tok, [_qa("a", "q", context, "w8 w9 w10 w11")])
  positions = [(f.start_position, f.end_position) for f in features]
  # Only window 2 (w6..w13) holds all of w8..w11; the others point at [CLS].
  assert positions == [(0, 0), (0, 0), (3 + 2, 3 + 5), (0, 0), (0, 0)]
  assert features[2].tokens[5:9] == ["w8", "w9", "w10", "w11"]


def test_long_questions_are_cut_to_max_query_length(tok):
  question = " ".join(["q"] * 9)
  features = _features(tok, [_qa("a", question, " ".join(WORDS), "w1")],
                       question_len=4)
  assert features[0].tokens[:6] == ["[CLS]", "q", "q", "q", "q", "[SEP]"]
  assert len(features[0].tokens) == 4 + 3 + 8
  assert (features[0].start_position, features[0].end_position) == (7, 7)


def test_unanswerable_v2_questions_point_at_cls(tok):
  features = _features(tok, [_qa("a", "q", is_impossible=True)], v2=True)
  assert len(features) == 5
  assert all((f.start_position, f.end_position, f.is_impossible) == (0, 0, True)
             for f in features)


def test_answer_span_narrows_to_the_answer_pieces(tok):
  context = "w1 (1895-1943). w2 Japanese w3"
  features = _features(tok, [_qa("year", "q", context, "1895"),
                             _qa("japan", "q", context, "Japan")],
                       context=context, max_seq_length=30)
  year, japan = features
  assert year.tokens[year.start_position:year.end_position + 1] == ["1895"]
  # "Japan" is part of one word: the span is all of its pieces.
  assert japan.tokens[japan.start_position:japan.end_position + 1] == [
      "japa", "##nese"]


def test_arrays(tok):
  features = _features(tok, [_qa("a", "q", " ".join(WORDS), "w8 w9")])
  arrays = squad_data.features_to_arrays(features)
  assert {k: v.shape for k, v in arrays.items()} == {
      "input_ids": (5, 12), "input_mask": (5, 12), "segment_ids": (5, 12),
      "start_positions": (5,), "end_positions": (5,), "unique_ids": (5,)}
  assert arrays["unique_ids"].tolist() == list(range(10**9, 10**9 + 5))
  assert arrays["start_positions"].tolist() == [0, 8, 5, 0, 0]
  assert all(a.dtype == np.int32 for a in arrays.values())


def test_bad_lengths_are_refused(tok):
  with pytest.raises(ValueError, match="max_seq_length=10 must be greater"):
    squad_data.convert_examples_to_features([], tok, 10, 3, 7, True)
  with pytest.raises(ValueError, match="pass is_training"):
    squad_data.convert_examples_to_features([], tok)
