"""bertjax.fill_mask: fill-mask and next-sentence scores, against transformers on
the same weights, from an exported directory and from a training run."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from transformers import AutoTokenizer, FlaxBertForPreTraining

from bertjax.convert import hf_files
from bertjax.convert import pretrained_model
from bertjax.convert import run_vocab
from bertjax.convert.pretrained_model import Predictor, _join, _runs
from bertjax.model.config import BertConfig
from bertjax.text.tokenization import WordPieceTokenizer

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the capital of france is paris . it lies on the seine river and is a large city "
         "with many museums , parks and old bridges").split()
PIECES = ["##s", "##ing", "##ed", "##er"]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
  """A random pretraining model exported as a complete Hugging Face directory."""
  directory = str(tmp_path_factory.mktemp("hf"))
  tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS)) + PIECES
  vocab_path = os.path.join(directory, "vocab.txt")
  with open(vocab_path, "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  config = BertConfig(vocab_size=len(tokens), hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position_embeddings=64,
                      dtype="float32", scan_layers=True)
  tokenizer = WordPieceTokenizer(vocab_path, True)
  params = Predictor.from_random_init(config, tokenizer, seed=3).params
  hf_files.save_hf_checkpoint(jax.tree.map(np.asarray, params), config, directory)
  run_vocab.write_hf_tokenizer(run_vocab.Vocab(tuple(tokens), True, vocab_path), directory,
                               config.max_position_embeddings)
  return directory


def test_fill_mask_agrees_with_transformers_on_the_same_weights(export_dir):
  params, config, tokenizer = pretrained_model.load(export_dir)
  predictor = Predictor(params, config, tokenizer)
  hf_tokenizer = AutoTokenizer.from_pretrained(export_dir)
  hf_model = FlaxBertForPreTraining.from_pretrained(export_dir)
  for text in ("The capital of France is [MASK].", "[MASK] lies on the seine river .",
               "it is a large [MASK] with many parks"):
    (top,) = predictor.fill_mask(text, top_k=4)
    enc = hf_tokenizer(text, return_tensors="np")
    assert enc["input_ids"][0].tolist() == predictor.encode(text)[0]
    logits = np.asarray(hf_model(**enc).prediction_logits[0], np.float64)
    position = int(np.argmax(enc["input_ids"][0] == hf_tokenizer.mask_token_id))
    probs = np.exp(logits[position] - logits[position].max())
    probs /= probs.sum()
    best = np.argsort(-probs)[:4]
    assert [p.text for p in top] == hf_tokenizer.convert_ids_to_tokens(best.tolist())
    np.testing.assert_allclose([p.probability for p in top], probs[best], rtol=1e-4)


def test_next_sentence_probability_agrees_with_transformers(export_dir):
  params, config, tokenizer = pretrained_model.load(export_dir)
  predictor = Predictor(params, config, tokenizer)
  hf_tokenizer = AutoTokenizer.from_pretrained(export_dir)
  hf_model = FlaxBertForPreTraining.from_pretrained(export_dir)
  a, b = "the capital of france is paris .", "it lies on the seine river ."
  enc = hf_tokenizer(a, b, return_tensors="np")
  logits = np.asarray(hf_model(**enc).seq_relationship_logits[0], np.float64)
  expected = np.exp(logits[0]) / np.exp(logits).sum()
  assert predictor.next_sentence_probability(a, b) == pytest.approx(expected, rel=1e-4)


def test_adjacent_masks_are_filled_as_words(export_dir):
  params, config, tokenizer = pretrained_model.load(export_dir)
  predictor = Predictor(params, config, tokenizer)
  text = "the [MASK] [MASK] of france"
  (run,) = predictor.fill_mask(text, top_k=3)
  assert len(run) == 3
  ids, segments, masks = predictor.encode(text)
  best = run[0]
  # The best filling's probability is the product of its pieces' probabilities,
  # each predicted with the pieces before it filled in; it starts a word.
  first, _ = predictor._run(ids, segments, [masks[0]])  # pylint: disable=protected-access
  filled = list(ids)
  filled[masks[0]] = best.ids[0]
  second, _ = predictor._run(filled, segments, [masks[1]])  # pylint: disable=protected-access
  assert best.probability == pytest.approx(
      np.exp(first[0][best.ids[0]] + second[0][best.ids[1]]), rel=1e-6)
  assert tokenizer.is_word_start[best.ids[0]]
  assert best.text == _join(tokenizer.convert_ids_to_tokens(best.ids))
  assert [p.probability for p in run] == sorted((p.probability for p in run), reverse=True)


def test_helpers():
  assert _runs([3, 4, 7, 9, 10, 11]) == [[3, 4], [7], [9, 10, 11]]
  assert _join(["park", "##s", "and", "river"]) == "parks and river"


def test_bad_input_is_named(export_dir, tmp_path):
  params, config, tokenizer = pretrained_model.load(export_dir)
  predictor = Predictor(params, config, tokenizer)
  with pytest.raises(ValueError, match="has no \\[MASK\\]"):
    predictor.fill_mask("the capital of france is paris")
  with pytest.raises(ValueError, match="max_position_embeddings=64"):
    predictor.fill_mask("paris " * 70 + "[MASK]")
  with pytest.raises(ValueError, match="no masked-LM and next-sentence heads"):
    Predictor({"bert": params["bert"]}, config, tokenizer)
  encoder_dir = str(tmp_path / "encoder")
  hf_files.save_hf_checkpoint(params, config, encoder_dir, encoder_only=True)
  with pytest.raises(ValueError, match="no masked-LM and next-sentence heads"):
    pretrained_model.load(encoder_dir)
  with pytest.raises(ValueError, match="neither a bertjax checkpoint"):
    pretrained_model.load(str(tmp_path))


def test_cli_prints_predictions(export_dir):
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.fill_mask", f"--checkpoint={export_dir}",
       "--text=The capital of France is [MASK].", "--text_b=It lies on the Seine.",
       "--top_k=2"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0] == "The capital of France is [MASK]."
  assert lines[1].startswith("  [MASK] #1: ") and lines[1].count("(") == 2
  assert lines[2].startswith("  next sentence 'It lies on the Seine.': 0.")
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.fill_mask", f"--checkpoint={export_dir}",
       "--text=no mask here"], cwd=REPO, capture_output=True, text=True, timeout=300,
      check=False)
  assert result.returncode != 0 and "has no [MASK] to fill" in result.stderr
