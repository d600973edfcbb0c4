"""CoNLL-2003 with document context: each sentence once, its neighbours as
unlabelled context, every gold entity scored once; without it, each row is
the sentence alone."""

import os
import sys

import ml_collections
import numpy as np
import pytest

from bertjax.tasks import conll
from bertjax.text import tokenization

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conll_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position

MAX_SEQ = 24


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return tokenization.load_tokenizer(
      "wordpiece", finetune_data.write_vocab(str(tmp_path_factory.mktemp("v") / "vocab.txt")))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("conll")
  # Long documents (up to 8 sentences) so that context is cut on both sides.
  docs = conll_data.documents(12, seed=4, max_sentences=8)
  docs.append([["word1", "word2"] * 15])  # Longer than a row: truncated, no context.
  (directory / "valid.txt").write_text(conll_data.conll_text(docs))
  return directory, docs


def _config(data_dir, document_context):
  return ml_collections.ConfigDict({"data_dir": str(data_dir), "tfds_data_dir": "",
                                    "max_seq_length": MAX_SEQ,
                                    "document_context": document_context})


def _rows(split):
  a = split.arrays
  return [a["input_ids"][i, :a["input_mask"][i].sum()].tolist() for i in range(len(split))]


def test_documents_are_read_from_docstart_lines(data_dir):
  directory, docs = data_dir
  words, _, _, documents = conll.read_sentences(str(directory / "valid.txt"))
  assert words == [s for doc in docs for s in doc]
  assert documents == [d for d, doc in enumerate(docs) for _ in doc]


def test_without_context_each_row_is_the_sentence_alone(data_dir, tokenizer):
  directory, docs = data_dir
  split = conll.load("dev", tokenizer, _config(directory, False))
  sentences = [s for doc in docs for s in doc]
  assert len(split) == len(sentences)
  tag_ids = [np.array([conll.LABELS.index(t) for t in conll_data.tags(s)]) for s in sentences]
  for i, sentence in enumerate(sentences):
    alone, positions = conll.encode(tokenizer, [sentence], [tag_ids[i]], MAX_SEQ)
    for k, v in alone.items():
      np.testing.assert_array_equal(split.arrays[k][i], v[0], err_msg=f"{k} row {i}")
  # A model config without the field (GLUE's) reads CoNLL without context too.
  plain = ml_collections.ConfigDict({"data_dir": str(directory), "tfds_data_dir": "",
                                     "max_seq_length": MAX_SEQ})
  for k, v in conll.load("dev", tokenizer, plain).arrays.items():
    np.testing.assert_array_equal(v, split.arrays[k])


def test_context_fills_the_row_from_the_sentences_document(data_dir, tokenizer):
  directory, docs = data_dir
  alone = conll.load("dev", tokenizer, _config(directory, False))
  split = conll.load("dev", tokenizer, _config(directory, True))
  assert len(split) == len(alone)
  cls, sep = tokenizer.special_ids["cls"], tokenizer.special_ids["sep"]
  rows, budget = _rows(split), MAX_SEQ - 2
  i, both_sides_cut = 0, 0
  for doc in docs:
    own = [tokenizer.encode(" ".join(s)) for s in doc]
    doc_tokens = [t for s in own for t in s]
    for k in range(len(doc)):
      row, w = rows[i], split.arrays["label_weights"][i]
      assert row[0] == cls and row[-1] == sep
      body = row[1:-1]
      assert len(body) == min(budget, len(doc_tokens))
      left = int(np.flatnonzero(w)[0]) - 1  # The sentence's first word follows the left context.
      start = sum(len(s) for s in own[:k])
      if len(own[k]) > budget:
        assert left == 0 and body == own[k][:budget]
      else:
        # A window of the document's sub-tokens with the sentence inside it.
        assert body == doc_tokens[start - left:start - left + len(body)]
        right = len(body) - left - len(own[k])
        assert right >= 0
        if left < start and right < len(doc_tokens) - start - len(own[k]):
          assert abs(left - right) <= 1  # Cut on both sides: balanced.
          both_sides_cut += 1
      # Labels and weights are the sentence's alone, shifted past the left context.
      w_alone = alone.arrays["label_weights"][i]
      np.testing.assert_array_equal(w[1 + left:], w_alone[1:MAX_SEQ - left])
      assert w.sum() == w_alone.sum()
      np.testing.assert_array_equal(split.arrays["labels"][i][w > 0],
                                    alone.arrays["labels"][i][w_alone > 0])
      i += 1
  assert both_sides_cut > 3


def test_every_gold_entity_is_scored_once(data_dir, tokenizer):
  from seqeval.metrics.sequence_labeling import get_entities  # pylint: disable=g-import-not-at-top
  directory, docs = data_dir
  gold = [conll_data.tags(s) for doc in docs for s in doc]
  entities = sum(len(get_entities(g)) for g in gold)
  lost = len(get_entities(gold[-1][MAX_SEQ - 2:]))  # Past the long sentence's row.
  assert lost == 4 and entities > 30
  eye = np.eye(len(conll.LABELS))
  for document_context in (False, True):
    split = conll.load("dev", tokenizer, _config(directory, document_context))
    a = split.arrays
    logits = eye[a["labels"]] * a["label_weights"][..., None]
    logits[..., 0] += 1 - a["label_weights"]  # Context and later sub-tokens: "O", never read.
    scores = split.score(logits)
    assert scores["precision"] == 1.0
    assert scores["recall"] == pytest.approx((entities - lost) / entities)
    # Missing one single-word entity costs exactly one gold entity.
    row = next(i for i, g in enumerate(gold[:-1]) if g[0].startswith("B-")
               and (len(g) == 1 or not g[1].startswith("I-")))
    logits[row, np.flatnonzero(a["label_weights"][row])[0]] = eye[0]
    scores = split.score(logits)
    assert scores["recall"] == pytest.approx((entities - lost - 1) / entities)


def test_context_needs_the_files(tokenizer):
  with pytest.raises(ValueError, match="--config.document_context needs the CoNLL-2003 files"):
    conll.load("dev", tokenizer, _config("", True))
