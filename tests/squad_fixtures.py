"""Small SQuAD data and a WordPiece vocab for the SQuAD tests."""

import json
import os

import numpy as np

from bertjax.records import schema
from bertjax.tasks import squad_postprocess
from bertjax.text import tokenization

# Spaces, a tab, a newline and U+202F (all word breaks for the original),
# punctuation, accents (composed and not), case, possessives, a zero-width
# space and CJK characters.
CONTEXT_LONG = (
    "The leader was John Smith (1895-1943). He was born in Grünwald, a "
    "Japanese town near  Munich,\tand studied physics at the University of "
    "Munich.\nLater he taught mathematics in Berlin\u202ffor twelve years "
    "before Steve Smith's company hired him as chief engineer. The company "
    "built bridges, towers and railway stations across Bavaria until 1939.")
CONTEXT_SHORT = ("Paris is the capital of France. It lies on the Seine river, "
                 "like the caf\u00e9s of Zo\u00eb\u200bKim and the "
                 "e\u0301cole of \u6771\u4eac\u5927\u5b66.")
# Words left out of the vocab (they become [UNK]) and split into pieces.
UNKNOWN = ("bavaria",)
MIN_SPLIT = 8  # Longer words are in the vocab as 4 characters + "##rest".


def _answer(context, text, nth=0):
  start = -1
  for _ in range(nth + 1):
    start = context.index(text, start + 1)
  return {"text": text, "answer_start": start}


def squad_v1() -> dict:
  """Training-shaped v1.1 data: one answer a question; q_bad's answer_start
  points at the wrong place."""
  long_qas = [
      ("q_year", "What year was John Smith born?", "1895"),
      ("q_town", "Which Japanese town was he born in?", "Grünwald"),
      ("q_japan", "Which country?", "Japan"),
      ("q_hire", "Whose company hired him as chief engineer?", "Steve Smith"),
      ("q_long", "What did the company build across the region in the years "
                 "until the war began, according to the text?",
       "bridges, towers and railway stations"),
      ("q_until", "Until when?", "1939"),
  ]
  qas = [{"id": i, "question": q, "answers": [_answer(CONTEXT_LONG, a)]}
         for i, q, a in long_qas]
  qas.append({"id": "q_bad", "question": "Where did he teach?",
              "answers": [{"text": "Berlin", "answer_start": 5}]})
  short = [{"id": "q_capital", "question": "What is the capital of France?",
            "answers": [_answer(CONTEXT_SHORT, "Paris")]},
           {"id": "q_river", "question": "Which river?",
            "answers": [_answer(CONTEXT_SHORT, "Seine river")]}]
  return {"version": "1.1", "data": [
      {"title": "Smith", "paragraphs": [{"context": CONTEXT_LONG, "qas": qas}]},
      {"title": "Paris", "paragraphs": [{"context": CONTEXT_SHORT,
                                         "qas": short}]}]}


def squad_v2() -> dict:
  """v1's data plus unanswerable questions (is_impossible, no answers)."""
  data = squad_v1()
  for article in data["data"]:
    for qa in article["paragraphs"][0]["qas"]:
      qa["is_impossible"] = False
  long_qas = data["data"][0]["paragraphs"][0]["qas"]
  long_qas.insert(2, {"id": "q_none", "question": "Who built the towers in "
                      "Munich?", "answers": [], "is_impossible": True,
                      "plausible_answers": [_answer(CONTEXT_LONG, "Steve")]})
  data["data"][1]["paragraphs"][0]["qas"].append(
      {"id": "q_none2", "question": "What is the capital of Spain?",
       "answers": [], "is_impossible": True})
  data["version"] = "v2.0"
  return data


def tfds_records(data: dict):
  """Records as tfds.as_numpy gives squad/v1.1's or squad/v2.0's: bytes and
  numpy arrays (v2.0's is_impossible and plausible_answers where the data
  has is_impossible)."""
  def answers(items):
    return {"text": np.array([a["text"].encode() for a in items], object),
            "answer_start": np.array([a["answer_start"] for a in items],
                                     np.int32)}
  for article in data["data"]:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        record = {"id": qa["id"].encode(), "title": article["title"].encode(),
                  "context": paragraph["context"].encode(),
                  "question": qa["question"].encode(),
                  "answers": answers(qa["answers"])}
        if "is_impossible" in qa:
          record["is_impossible"] = np.bool_(qa["is_impossible"])
          record["plausible_answers"] = answers(
              qa.get("plausible_answers", []))
        yield record


def write_json(path, data) -> str:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f)
  return str(path)


def vocab_tokens(data: dict, lower: bool = True) -> list[str]:
  """Special tokens, then the basic tokens of every context and question:
  long ones as pieces, UNKNOWN ones left out."""
  words = set()
  for article in data["data"]:
    for paragraph in article["paragraphs"]:
      texts = [paragraph["context"]] + [q["question"] for q in paragraph["qas"]]
      for text in texts:
        words.update(squad_postprocess.basic_tokens(text, lower))
  tokens = set()
  for word in words:
    if word.lower() in UNKNOWN:
      continue
    if len(word) >= MIN_SPLIT:
      tokens.update((word[:4], "##" + word[4:]))
    else:
      tokens.add(word)
  return list(schema.SPECIAL_TOKENS) + sorted(tokens - set(
      schema.SPECIAL_TOKENS))


def write_vocab(directory, data: dict, lower: bool = True) -> str:
  path = os.path.join(directory, "vocab.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(vocab_tokens(data, lower)) + "\n")
  return path


def tokenizer(directory, data: dict, lower: bool = True):
  return tokenization.WordPieceTokenizer(write_vocab(directory, data, lower),
                                         lower)
