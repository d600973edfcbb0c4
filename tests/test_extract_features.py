"""python -m bertjax.extract_features against transformers' FlaxBertModel
(output_hidden_states) and the original release's extract_features.py on the
same weights: per-layer outputs to 1e-5 in fp32 (the JSON rounds to 6 decimals)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import transformers

from bertjax.tasks import extract
from bertjax.convert import hf
from bertjax.convert import hf_files
from bertjax.convert import tf1
from bertjax.model.bert import BertModel
from bertjax.text import tokenization
import finetune_data
import test_hf_parity as parity
from test_hf_parity import highest_precision  # pylint: disable=unused-import  # Autouse.

ATOL = 1e-5
ORIGINAL_SCRIPT = os.path.join(os.path.dirname(__file__), "original_release.py")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
              intermediate_size=48, max_position_embeddings=64)
LINES = ["the cat sits .", "word1 word2 runs ||| the dog sits , a cat runs",
         "", " ".join(finetune_data.WORDS), "a ||| \u200b", "the cats dogs ||| word3",
         "word7 " * 30 + "||| word9 " * 1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  """A random model saved as a Hugging Face directory and a TF1 checkpoint, with its
  vocab; transformers' FlaxBertModel and its params."""
  root = tmp_path_factory.mktemp("extract")
  vocab = finetune_data.write_vocab(str(root / "vocab.txt"))
  hf_config = parity.hf_bert_config(vocab_size=len(open(vocab).read().split()), **FIELDS)
  hf_params = parity.random_hf_params(hf_config, seed=3)
  config = hf.hf_config_to_bertjax(hf_config)
  params = hf.hf_to_bertjax(hf_params, config)
  dirs = {"hf": str(root / "hf"), "tf1": str(root / "tf1")}
  hf_files.save_hf_checkpoint(params, config, dirs["hf"], format="safetensors",
                              encoder_only=True)
  tf1.save_tf1_checkpoint(params, config, dirs["tf1"])
  for d in dirs.values():
    with open(vocab) as src, open(os.path.join(d, "vocab.txt"), "w") as dst:
      dst.write(src.read())
  input_file = root / "input.txt"
  input_file.write_text("\n".join(LINES) + "\n")
  return dict(root=root, dirs=dirs, hf_config=hf_config, hf_params=hf_params,
              config=config, params=params, input=str(input_file), vocab=vocab)


def hf_hidden_states(hf_config, hf_params, ids, mask, segments):
  module = transformers.FlaxBertModel(hf_config, _do_init=False).module
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  out = module.apply({"params": hf_params["bert"]}, ids, mask, segments, positions, None,
                     deterministic=True, output_hidden_states=True)
  return np.stack([np.asarray(h) for h in out.hidden_states])


@pytest.mark.parametrize("scan_layers", [True, False])
def test_hidden_states_match_transformers(model, scan_layers):
  batch = parity.make_batch(dict(vocab_size=model["config"].vocab_size), "ragged", 0)
  config = model["config"].replace(scan_layers=scan_layers)
  params = hf.hf_to_bertjax(model["hf_params"], config)["params"]["bert"]
  ids, mask, seg = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
  ours = jax.jit(lambda p: BertModel(config).apply(
      {"params": p}, ids, mask, seg, method=BertModel.hidden_states))(params)
  ref = hf_hidden_states(model["hf_config"], model["hf_params"], ids, mask, seg)
  assert ours.shape == ref.shape == (FIELDS["num_hidden_layers"] + 1, *ids.shape,
                                     FIELDS["hidden_size"])
  np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)
  sequence_output, _ = BertModel(config).apply({"params": params}, ids, mask, seg)
  np.testing.assert_allclose(ours[-1], sequence_output, atol=ATOL, rtol=0)


def test_layer_indexes_are_the_releases():
  assert extract.layer_positions([-1, -2, 0, 2], 3) == [3, 2, 1, 3]
  with pytest.raises(ValueError, match="--layers: 3 is not a layer of a 3-layer model"):
    extract.layer_positions([3], 3)
  with pytest.raises(ValueError, match="--layers: -4"):
    extract.layer_positions([-4], 3)


def run_cli(*args):
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
             JAX_DEFAULT_MATMUL_PRECISION="highest")
  return subprocess.run([sys.executable, "-m", "bertjax.extract_features", *args],
                        text=True, capture_output=True, timeout=300, env=env, check=False)


def read_json_lines(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_cli_json_and_npy_match_transformers(model, tmp_path):
  layers, max_seq = [-1, -3, 0], 24
  json_out, npy_out = tmp_path / "out.jsonl", tmp_path / "out.npy"
  common = [f"--checkpoint={model['dirs']['hf']}", f"--input_file={model['input']}",
            f"--layers={','.join(map(str, layers))}", f"--max_seq_length={max_seq}",
            "--batch_size=3"]
  for out, fmt in ((json_out, "json"), (npy_out, "npy")):
    result = run_cli(*common, f"--output_file={out}", f"--output_format={fmt}")
    assert result.returncode == 0, result.stderr[-3000:]
  lines = read_json_lines(json_out)
  assert [x["linex_index"] for x in lines] == list(range(len(LINES)))
  tokenizer = tokenization.WordPieceTokenizer(model["vocab"], True)
  examples = extract.read_examples(model["input"])
  encoded = extract.encode(tokenizer, examples, max_seq)
  # The release's layout: a B without tokens (a zero-width space) is left out,
  # long inputs are truncated to max_seq_length.
  assert encoded.tokens[0] == ["[CLS]", "the", "cat", "sits", ".", "[SEP]"]
  assert encoded.tokens[2] == ["[CLS]", "[SEP]"]
  assert encoded.tokens[4] == ["[CLS]", "a", "[SEP]"]
  assert encoded.tokens[5] == ["[CLS]", "the", "cat", "##s", "dog", "##s", "[SEP]", "word3",
                               "[SEP]"]
  assert len(encoded.tokens[3]) == max_seq and encoded.tokens[3][-1] == "[SEP]"
  assert encoded.tokens[6][-2:] == ["word9", "[SEP]"] and len(encoded.tokens[6]) == max_seq
  a = encoded.arrays
  ref_NxBxLxD = hf_hidden_states(model["hf_config"], model["hf_params"], a["input_ids"],
                                 a["input_mask"], a["segment_ids"])
  positions = extract.layer_positions(layers, FIELDS["num_hidden_layers"])
  features = np.load(npy_out)
  assert features.shape == (len(LINES), max_seq, len(layers), FIELDS["hidden_size"])
  tokens_file = read_json_lines(str(tmp_path / "out.tokens.jsonl"))
  for i, line in enumerate(lines):
    n = len(encoded.tokens[i])
    assert [f["token"] for f in line["features"]] == encoded.tokens[i]
    assert tokens_file[i] == {"linex_index": i, "tokens": encoded.tokens[i]}
    for t, feature in enumerate(line["features"]):
      assert [layer["index"] for layer in feature["layers"]] == layers
      for k, layer in enumerate(feature["layers"]):
        np.testing.assert_allclose(layer["values"], ref_NxBxLxD[positions[k], i, t],
                                   atol=ATOL, rtol=0)
    np.testing.assert_allclose(features[i, :n], ref_NxBxLxD[positions][:, i, :n].transpose(
        1, 0, 2), atol=ATOL, rtol=0)
    assert not features[i, n:].any()


@pytest.mark.slow
def test_cli_matches_the_original_release_on_its_checkpoint(model, tmp_path):
  layers, max_seq = "-1,-2,-3", 24
  original, ours = tmp_path / "original.jsonl", tmp_path / "ours.jsonl"
  result = subprocess.run(
      [sys.executable, ORIGINAL_SCRIPT, "extract-features", model["dirs"]["tf1"],
       model["input"], str(original), layers, str(max_seq), "3"],
      text=True, capture_output=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  result = run_cli(f"--checkpoint={model['dirs']['tf1']}", f"--input_file={model['input']}",
                   f"--output_file={ours}", f"--layers={layers}",
                   f"--max_seq_length={max_seq}", "--batch_size=2")
  assert result.returncode == 0, result.stderr[-3000:]
  want, got = read_json_lines(original), read_json_lines(ours)
  assert len(want) == len(got) == len(LINES)
  for w, g in zip(want, got):
    assert list(g) == list(w) == ["linex_index", "features"]
    assert g["linex_index"] == w["linex_index"]
    assert [f["token"] for f in g["features"]] == [f["token"] for f in w["features"]]
    for fw, fg in zip(w["features"], g["features"]):
      assert [x["index"] for x in fg["layers"]] == [x["index"] for x in fw["layers"]]
      np.testing.assert_allclose([x["values"] for x in fg["layers"]],
                                 [x["values"] for x in fw["layers"]], atol=ATOL, rtol=0)


def test_cli_refuses_a_layer_the_model_lacks(model, tmp_path):
  result = run_cli(f"--checkpoint={model['dirs']['hf']}", f"--input_file={model['input']}",
                   f"--output_file={tmp_path / 'x.jsonl'}", "--layers=-1,3",
                   "--max_seq_length=24")
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "Error: --layers: 3 is not a layer of a 3-layer model (give -3..2; -1 is the last)")
