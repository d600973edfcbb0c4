"""SQuAD v1.1 / v2.0 examples and features, as the original run_squad.py
builds them.

Reading (`read_squad_examples`): each paragraph is split into words on
whitespace (space, tab, CR, LF and U+202F, the original's set), keeping each
character's word index. For training, an answer is mapped to its first and
last word; when the answer text (whitespace-normalised) is not found in those
words, because answer_start does not point at it, the question is skipped
and counted, as the original skips it. SQuAD v2.0 questions marked
`is_impossible` (or, in records without that field, with no answers) become
examples whose answer is [CLS].

Features (`convert_examples_to_features`): every word is tokenized on its
own, as the original does with FullTokenizer; questions are cut to
`max_query_length` pieces; the document is cut into windows of at most
max_seq_length - len(question) - 3 pieces, `doc_stride` apart, each giving
[CLS] question [SEP] window [SEP]. A token in several windows is "max
context" in the one where min(left context, right context) + 0.01 * window
length is largest (the first such window on ties). For training, the answer
span is narrowed to the pieces that spell the tokenized answer when it can be
(_improve_answer_span), and a window that does not contain the whole answer,
like an unanswerable question, points at [CLS] (position 0).

Sources: a SQuAD JSON path (local, gs://, or .gz), its parsed dict or its
"data" list, or records shaped like TFDS `squad/v1.1` and `squad/v2.0`
(id, title, context, question, answers{text, answer_start}, and for v2.0
is_impossible; str or bytes values, as `tfds.as_numpy` gives them). Missing
or mistyped fields raise a ValueError naming the source and the field.
"""

import dataclasses
import json
import logging
import os
import re
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

from bertjax.records import fileio

FIRST_UNIQUE_ID = 1000000000  # The original's first feature id.
_WORD = re.compile(r"[^ \t\r\n\u202f]+")  # The original's whitespace set.


@dataclasses.dataclass
class SquadExample:
  """One question on its paragraph, split into whitespace words."""
  qas_id: str
  question_text: str
  doc_tokens: list[str]  # Shared by the questions of one paragraph.
  orig_answer_text: Optional[str] = None  # Training only ("" if impossible).
  start_position: Optional[int] = None  # Answer's first word (-1: impossible).
  end_position: Optional[int] = None  # Answer's last word (-1: impossible).
  is_impossible: bool = False


@dataclasses.dataclass
class InputFeatures:
  """One window of one example: [CLS] question [SEP] window [SEP], padded."""
  unique_id: int
  example_index: int
  doc_span_index: int
  tokens: list[str]  # The pieces, unpadded.
  # Per token (len(tokens)): the example's word index, -1 outside the window.
  token_to_orig_map: np.ndarray
  # Per token: True where this window is the token's max-context window.
  token_is_max_context: np.ndarray
  input_ids: np.ndarray  # [max_seq_length] int32, 0-padded.
  input_mask: np.ndarray  # [max_seq_length] int32.
  segment_ids: np.ndarray  # [max_seq_length] int32.
  start_position: Optional[int] = None  # Training only; 0 = [CLS].
  end_position: Optional[int] = None
  is_impossible: bool = False


# --- Sources ---------------------------------------------------------------

def _text(value: Any) -> Any:
  """str for str / bytes / numpy scalars (TFDS gives bytes); else as is."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  if isinstance(value, bytes):
    return value.decode("utf-8")
  return value


def _from_record(record: Any, where: str) -> dict:
  """A TFDS squad record as an official-format question (plus context)."""
  if not isinstance(record, dict):
    raise ValueError(f"{where}: expected a dict with id, context, question, "
                     f"answers; got {type(record).__name__}.")
  for key in ("id", "context", "question", "answers"):
    if key not in record:
      raise ValueError(f"{where}: missing field {key!r}.")
  answers = record["answers"]
  if not isinstance(answers, dict) or not {"text", "answer_start"} <= set(
      answers):
    raise ValueError(f"{where}.answers: expected {{text, answer_start}}.")
  texts, starts = list(answers["text"]), list(answers["answer_start"])
  if len(texts) != len(starts):
    raise ValueError(f"{where}.answers: {len(texts)} texts but {len(starts)} "
                     "answer_start values.")
  qa = {"id": _text(record["id"]), "question": _text(record["question"]),
        "answers": [{"text": _text(t), "answer_start": int(s)}
                    for t, s in zip(texts, starts)]}
  if "is_impossible" in record:
    qa["is_impossible"] = bool(record["is_impossible"])
  return {"title": _text(record.get("title", "")),
          "context": _text(record["context"]), "qa": qa}


def _articles_from_records(records: Iterable[Any], name: str) -> list[dict]:
  """Records, consecutive ones with the same context in one paragraph."""
  articles = []
  for i, record in enumerate(records):
    r = _from_record(record, f"{name}[{i}]")
    if not articles or articles[-1]["title"] != r["title"]:
      articles.append({"title": r["title"], "paragraphs": []})
    paragraphs = articles[-1]["paragraphs"]
    if not paragraphs or paragraphs[-1]["context"] != r["context"]:
      paragraphs.append({"context": r["context"], "qas": []})
    paragraphs[-1]["qas"].append(r["qa"])
  return articles


def _json_articles(data: Any, name: str) -> list[dict]:
  if not isinstance(data, dict) or "data" not in data:
    raise ValueError(f"{name}: missing field 'data' (a SQuAD JSON is "
                     '{"version": ..., "data": [articles]}).')
  if not isinstance(data["data"], list):
    raise ValueError(f"{name}: field 'data' must be a list of articles.")
  return data["data"]


def load_articles(source: Any) -> tuple[list[dict], str]:
  """(articles in the official JSON layout, a name for messages).

  `source`: a SQuAD JSON path, its parsed dict, its "data" list, a
  tf.data.Dataset or any iterable of TFDS-shaped records.
  """
  if isinstance(source, (str, os.PathLike)):
    name = os.fspath(source)
    try:
      text = fileio.read_text(name)
    except (OSError, UnicodeDecodeError) as e:
      raise ValueError(f"{name}: cannot read the SQuAD file ({e}).") from e
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{name}: not valid JSON ({e}).") from e
    return _json_articles(data, name), name
  if isinstance(source, dict):
    return _json_articles(source, "SQuAD dict"), "SQuAD dict"
  if hasattr(source, "as_numpy_iterator"):  # A tf.data.Dataset.
    source = source.as_numpy_iterator()
  records = list(source)
  if records and isinstance(records[0], dict) and "paragraphs" in records[0]:
    return records, "SQuAD data"
  return _articles_from_records(records, "records"), "records"


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
  if not isinstance(obj, dict) or key not in obj:
    raise ValueError(f"{where}: missing field {key!r}.")
  value = obj[key]
  if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
    raise ValueError(f"{where}.{key}: expected {kind.__name__}, got "
                     f"{type(value).__name__}.")
  return value


def answers_of(qa: dict, where: str) -> list[dict]:
  """The question's answers, each checked for text and answer_start."""
  answers = _field(qa, "answers", list, where)
  for j, answer in enumerate(answers):
    _field(answer, "text", str, f"{where}.answers[{j}]")
    _field(answer, "answer_start", int, f"{where}.answers[{j}]")
  return answers


def iter_paragraphs(articles: Sequence[dict], name: str
                    ) -> Iterator[tuple[str, list[tuple[dict, str]]]]:
  """(context, [(question dict, its location for messages)]) per paragraph;
  id and question are checked, answers by `answers_of` when needed."""
  for a, article in enumerate(articles):
    where = f"{name}: data[{a}]"
    for p, paragraph in enumerate(_field(article, "paragraphs", list, where)):
      here = f"{where}.paragraphs[{p}]"
      context = _field(paragraph, "context", str, here)
      qas = []
      for q, qa in enumerate(_field(paragraph, "qas", list, here)):
        qa_where = f"{here}.qas[{q}]"
        _field(qa, "id", str, qa_where)
        _field(qa, "question", str, qa_where)
        qas.append((qa, qa_where))
      yield context, qas


def iter_questions(articles: Sequence[dict], name: str
                   ) -> Iterator[tuple[dict, str]]:
  """Every question with checked answers: (question dict, its context)."""
  for context, qas in iter_paragraphs(articles, name):
    for qa, where in qas:
      answers_of(qa, where)
      yield qa, context


# --- Examples --------------------------------------------------------------

def split_words(text: str) -> tuple[list[str], np.ndarray]:
  """(whitespace words, each character's word index; -1 before the first)."""
  matches = list(_WORD.finditer(text))
  starts = np.array([m.start() for m in matches], np.int64)
  char_to_word = np.searchsorted(starts, np.arange(len(text)), "right") - 1
  return [m.group() for m in matches], char_to_word


def _is_impossible(qa: dict, where: str) -> bool:
  if "is_impossible" in qa:
    return _field(qa, "is_impossible", bool, where)
  return not answers_of(qa, where)


def _training_example(qa, where, words, char_to_word, version_2
                      ) -> Optional[SquadExample]:
  """The example, or None when the answer does not match the context."""
  base = SquadExample(qa["id"], qa["question"], words)
  if version_2 and _is_impossible(qa, where):
    return dataclasses.replace(base, orig_answer_text="", start_position=-1,
                               end_position=-1, is_impossible=True)
  answers = answers_of(qa, where)
  if len(answers) != 1:
    hint = "" if answers or version_2 else (
        " (for SQuAD v2.0 data, read with version_2=True)")
    raise ValueError(f"{where}: for training, each answerable question needs "
                     f"exactly 1 answer; it has {len(answers)}{hint}.")
  text, start = answers[0]["text"], answers[0]["answer_start"]
  end = start + len(text) - 1
  if not text or start < 0 or end >= len(char_to_word):
    return None
  first, last = int(char_to_word[start]), int(char_to_word[end])
  if first < 0 or " ".join(words[first:last + 1]).find(
      " ".join(text.split())) == -1:
    return None
  return dataclasses.replace(base, orig_answer_text=text,
                             start_position=first, end_position=last)


def read_squad_examples(source: Any, is_training: bool, version_2: bool = False
                        ) -> tuple[list[SquadExample], int]:
  """(examples, number of questions skipped because their answer text does
  not match the context at answer_start).

  Only training reads answers; evaluation examples carry none (and
  is_impossible False), as in the original: scoring reads the gold answers
  from the data (squad_eval).
  """
  articles, name = load_articles(source)
  examples, skipped = [], 0
  for context, qas in iter_paragraphs(articles, name):
    words, char_to_word = split_words(context)
    for qa, where in qas:
      if not is_training:
        examples.append(SquadExample(qa["id"], qa["question"], words))
        continue
      example = _training_example(qa, where, words, char_to_word, version_2)
      if example is None:
        skipped += 1
        logging.warning("%s: skipped: answer %r not found at answer_start in "
                        "the context.", where, qa["answers"][0]["text"])
      else:
        examples.append(example)
  if skipped:
    logging.warning("%s: skipped %d of %d questions whose answer text does "
                    "not match the context.", name, skipped,
                    skipped + len(examples))
  return examples, skipped


# --- Features --------------------------------------------------------------

def doc_spans(num_tokens: int, max_tokens: int, stride: int
              ) -> list[tuple[int, int]]:
  """(start, length) windows of at most `max_tokens`, `stride` apart, the
  last one ending at the document's end."""
  spans, start = [], 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens)
    spans.append((start, length))
    if start + length == num_tokens:
      break
    start += min(length, stride)
  return spans


def max_context_spans(spans: Sequence[tuple[int, int]], num_tokens: int
                      ) -> np.ndarray:
  """Per document token, the window where it has the most context: the
  largest min(left, right) + 0.01 * window length, the first on ties."""
  best = np.full(num_tokens, -1, np.int64)
  best_score = np.full(num_tokens, -np.inf)
  for index, (start, length) in enumerate(spans):
    position = np.arange(start, start + length)
    score = np.minimum(position - start, start + length - 1 - position)
    score = score + 0.01 * length
    better = score > best_score[position]
    best[position[better]] = index
    best_score[position[better]] = score[better]
  return best


def improve_answer_span(doc_ids: Sequence[int], start: int, end: int,
                        answer_ids: Sequence[int]) -> tuple[int, int]:
  """The first, longest sub-span of [start, end] whose pieces are exactly the
  tokenized answer (e.g. "1895" in "(1895-1943)."), else [start, end]."""
  answer = list(answer_ids)
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if list(doc_ids[new_start:new_end + 1]) == answer:
        return new_start, new_end
  return start, end


class _Pieces:
  """Every distinct word, question and answer tokenized once, in batches."""

  def __init__(self, tokenizer, examples: Sequence[SquadExample],
               is_training: bool):
    words = list(dict.fromkeys(w for e in examples for w in e.doc_tokens))
    self.word = dict(zip(words, tokenizer.encode_batch(words)))
    self.question = tokenizer.encode_batch([e.question_text for e in examples])
    self.answer = tokenizer.encode_batch(
        [e.orig_answer_text or "" for e in examples] if is_training else [])


def _doc_pieces(example: SquadExample, word_pieces: dict[str, list[int]]
                ) -> tuple[list[int], list[int], list[int]]:
  """(piece ids, word index of each piece, first piece of each word)."""
  ids, tok_to_orig, orig_to_tok = [], [], []
  for i, word in enumerate(example.doc_tokens):
    orig_to_tok.append(len(ids))
    pieces = word_pieces[word]
    ids.extend(pieces)
    tok_to_orig.extend([i] * len(pieces))
  return ids, tok_to_orig, orig_to_tok


def _answer_pieces(example, doc_ids, orig_to_tok, answer_ids
                   ) -> tuple[int, int]:
  """The answer's first and last document piece (-1, -1: impossible)."""
  if example.is_impossible:
    return -1, -1
  start = orig_to_tok[example.start_position]
  if example.end_position < len(example.doc_tokens) - 1:
    end = orig_to_tok[example.end_position + 1] - 1
  else:
    end = len(doc_ids) - 1
  return improve_answer_span(doc_ids, start, end, answer_ids)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """What every window needs besides the example's own pieces."""
  tokens: Sequence[str]  # The tokenizer's pieces, in id order.
  cls_id: int
  sep_id: int
  pad_id: int
  max_seq_length: int


def _window_feature(layout, query_ids, doc_ids, tok_to_orig, best_span,
                    span, span_index) -> InputFeatures:
  """The unpadded-to-padded feature of one window (positions left unset)."""
  start, length = span
  ids = ([layout.cls_id] + list(query_ids) + [layout.sep_id]
         + doc_ids[start:start + length] + [layout.sep_id])
  offset = len(query_ids) + 2
  n = len(ids)
  to_orig = np.full(n, -1, np.int32)
  to_orig[offset:offset + length] = tok_to_orig[start:start + length]
  is_max = np.zeros(n, bool)
  is_max[offset:offset + length] = best_span[start:start + length] == span_index
  input_ids = np.full(layout.max_seq_length, layout.pad_id, np.int32)
  input_ids[:n] = ids
  input_mask = np.zeros(layout.max_seq_length, np.int32)
  input_mask[:n] = 1
  segment_ids = np.zeros(layout.max_seq_length, np.int32)
  segment_ids[offset:n] = 1
  return InputFeatures(
      unique_id=0, example_index=0, doc_span_index=span_index,
      tokens=[layout.tokens[i] for i in ids], token_to_orig_map=to_orig,
      token_is_max_context=is_max, input_ids=input_ids,
      input_mask=input_mask, segment_ids=segment_ids)


def _training_positions(span, answer, offset) -> tuple[int, int]:
  """The answer's positions in the window, or (0, 0) ([CLS]) when the window
  does not hold all of it or the question has no answer."""
  start, length = span
  if answer[0] < 0 or not (answer[0] >= start and
                           answer[1] <= start + length - 1):
    return 0, 0
  return answer[0] - start + offset, answer[1] - start + offset


def _check_lengths(max_seq_length, doc_stride, max_query_length):
  if max_seq_length <= max_query_length + 3:
    raise ValueError(
        f"max_seq_length={max_seq_length} must be greater than "
        f"max_query_length + 3 = {max_query_length + 3}.")
  if doc_stride < 1:
    raise ValueError(f"doc_stride={doc_stride} must be at least 1.")


def convert_examples_to_features(
    examples: Sequence[SquadExample], tokenizer, max_seq_length: int = 384,
    doc_stride: int = 128, max_query_length: int = 64,
    is_training: Optional[bool] = None) -> list[InputFeatures]:
  """One feature per document window of each example (see the module
  docstring); `tokenizer` is a bertjax.text.tokenization.Tokenizer."""
  if is_training is None:
    raise ValueError("convert_examples_to_features: pass is_training.")
  _check_lengths(max_seq_length, doc_stride, max_query_length)
  special = tokenizer.special_ids
  layout = _Layout(tokenizer.tokens, special["cls"], special["sep"],
                   special["pad"], max_seq_length)
  pieces = _Pieces(tokenizer, examples, is_training)
  features = []
  for index, example in enumerate(examples):
    query_ids = pieces.question[index][:max_query_length]
    doc_ids, tok_to_orig, orig_to_tok = _doc_pieces(example, pieces.word)
    spans = doc_spans(len(doc_ids), max_seq_length - len(query_ids) - 3,
                      doc_stride)
    best_span = max_context_spans(spans, len(doc_ids))
    if is_training:
      answer = _answer_pieces(example, doc_ids, orig_to_tok,
                              pieces.answer[index])
    for span_index, span in enumerate(spans):
      feature = _window_feature(layout, query_ids, doc_ids, tok_to_orig,
                                best_span, span, span_index)
      feature.unique_id = FIRST_UNIQUE_ID + len(features)
      feature.example_index = index
      if is_training:
        feature.is_impossible = example.is_impossible
        feature.start_position, feature.end_position = _training_positions(
            span, answer, len(query_ids) + 2)
      features.append(feature)
  return features


def features_to_arrays(features: Sequence[InputFeatures]
                       ) -> dict[str, np.ndarray]:
  """Stacked int32 arrays: input_ids, input_mask, segment_ids [N, L];
  start_positions, end_positions (0 where unset), unique_ids [N]."""
  if not features:
    raise ValueError("features_to_arrays: no features (no examples, or only "
                     "empty paragraphs).")
  def positions(name):
    return np.array([getattr(f, name) or 0 for f in features], np.int32)
  return {
      "input_ids": np.stack([f.input_ids for f in features]),
      "input_mask": np.stack([f.input_mask for f in features]),
      "segment_ids": np.stack([f.segment_ids for f in features]),
      "start_positions": positions("start_position"),
      "end_positions": positions("end_position"),
      "unique_ids": np.array([f.unique_id for f in features], np.int32),
  }
