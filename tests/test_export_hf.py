"""The Hugging Face export is a complete model directory.

A small run is laid out as pretraining leaves it (WORKDIR/config.json naming
the train files, the data's metadata.json, the vocab one directory up, a
checkpoint); `python -m bertjax.convert.export` must write a directory that
transformers' AutoTokenizer (fast and slow) and FlaxAutoModel /
FlaxAutoModelForPreTraining load as is, offline, tokenizing like bertjax's
own tokenizer and computing what bertjax computes.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

from bertjax.convert import export  # pylint: disable=g-import-not-at-top
from bertjax.model.bert import BertForPreTraining  # pylint: disable=g-import-not-at-top
from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
from bertjax.records import schema  # pylint: disable=g-import-not-at-top
from bertjax.text import tokenization  # pylint: disable=g-import-not-at-top
from bertjax.text import vocab as vocab_lib  # pylint: disable=g-import-not-at-top

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["The Quick brown fox jumps over the lazy dog.",
         "Résumé of a naïve café owner, who said: \"don't panic!\"",
         "Unseenwordsbecomepieces, and digits 12345 too."]
CORPUS = ("The quick brown fox jumps over the lazy dog. A dog barks at the fox.\n"
          "Cafe owners serve coffee; the resume says they panic rarely.\n") * 20


def make_run(root, do_lower_case: bool, vocab_size: int = 160, corpus: str = CORPUS) -> dict:
  """A workdir with a checkpoint, its run record, data metadata and a vocab
  trained on `corpus`."""
  import optax  # pylint: disable=g-import-not-at-top
  from bertjax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  text = root / "corpus.txt"
  text.write_text(corpus, encoding="utf-8")
  data = root / "data"
  (data / "train_128").mkdir(parents=True)
  tokens = vocab_lib.build_wordpiece_vocab([str(text)], str(data / "vocab.txt"),
                                           vocab_size=vocab_size, do_lower_case=do_lower_case)
  tok = tokenization.WordPieceTokenizer(str(data / "vocab.txt"), do_lower_case)
  schema.write_metadata(str(data / "train_128"), schema.DatasetMetadata(
      max_seq_length=128, max_predictions_per_seq=20, vocab_size=len(tokens),
      vocab_hash=tok.vocab_hash(), special_ids=dict(tok.special_ids),
      tokenizer=tok.describe(), masking={}, num_instances=0, num_tokens=0, random_seed=1,
      source="test", files=[]))
  workdir = root / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(
      {"phases": {"seq128": {"train_files": str(data / "train_128" / "part-*")}}}))
  config = BertConfig(vocab_size=len(tokens), hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=64)
  mesh_config = type("M", (), dict(data=-1, fsdp=1, tensor=1))
  mesh = sharding_lib.make_mesh(mesh_config, jax.devices()[:1])
  state, _ = state_lib.create_train_state(BertForPreTraining(config), optax.sgd(0.1), mesh,
                                          (), jax.random.key(3))
  ckpt = ckpt_lib.Checkpointer(str(workdir / "checkpoints"), keep=1, async_save=False)
  ckpt.save(state, {"model": dataclasses.asdict(config)})
  ckpt.close()
  return dict(root=str(root), checkpoints=str(workdir / "checkpoints"),
              vocab=str(data / "vocab.txt"), tokenizer=tok, config=config,
              params=jax.device_get(state.params))


def clone_run(run, root) -> dict:
  """A copy of make_run's files under `root`, its run record pointing at the copy."""
  shutil.copytree(run["root"], root / "clone")
  moved = {k: v.replace(run["root"], str(root / "clone")) if k in ("root", "checkpoints", "vocab")
           else v for k, v in run.items()}
  record = os.path.join(os.path.dirname(moved["checkpoints"]), "config.json")
  with open(record) as f:
    text = f.read()
  with open(record, "w") as f:
    f.write(text.replace(run["root"], moved["root"]))
  return moved


@pytest.fixture(scope="module")
def uncased_run(tmp_path_factory):
  return make_run(tmp_path_factory.mktemp("uncased"), True)


def load_flax(auto_class, directory):
  """(model, params) of a transformers Flax class from an exported directory.

  Flax weights load without a random initialisation first (_do_init=False,
  faster); transformers converts PyTorch-named safetensors only into an
  initialised model.
  """
  if os.path.exists(os.path.join(directory, "flax_model.msgpack")):
    return auto_class.from_pretrained(directory, _do_init=False)
  model = auto_class.from_pretrained(directory)
  return model, model.params


def export_cli(*flags):
  return subprocess.run([sys.executable, "-m", "bertjax.convert.export", *flags],
                        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO))


@pytest.mark.slow
@pytest.mark.parametrize("do_lower_case,weights", [(True, "safetensors"), (False, "flax")],
                         ids=["uncased_safetensors", "cased_flax"])
def test_export_loads_in_transformers_as_is(uncased_run, tmp_path, do_lower_case, weights):
  run = uncased_run if do_lower_case else make_run(tmp_path, do_lower_case)
  out = str(tmp_path / "hf")
  if weights == "safetensors":  # The command line once; the function it calls otherwise.
    done = export_cli(f"--checkpoint={run['checkpoints']}", f"--output={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Exported step 0 ({_size(run['params']):,} parameters)" in done.stdout
  else:
    export.export(run["checkpoints"], out, weights)
  assert sorted(os.listdir(out)) == sorted([
      "config.json", "special_tokens_map.json", "tokenizer_config.json", "vocab.txt",
      "model.safetensors" if weights == "safetensors" else "flax_model.msgpack"])
  with open(os.path.join(out, "tokenizer_config.json")) as f:
    assert json.load(f)["do_lower_case"] is do_lower_case

  ours = run["tokenizer"]
  cls, sep = ours.special_ids["cls"], ours.special_ids["sep"]
  for use_fast in (True, False):
    hf_tok = transformers.AutoTokenizer.from_pretrained(out, use_fast=use_fast)
    for text in TEXTS:
      assert hf_tok(text)["input_ids"] == [cls] + ours.encode(text) + [sep], (use_fast, text)
    assert hf_tok.mask_token_id == ours.special_ids["mask"]
    assert hf_tok.pad_token_id == ours.special_ids["pad"]
  assert ("quick" in hf_tok.tokenize("Quick")) is do_lower_case

  enc = transformers.AutoTokenizer.from_pretrained(out)(
      TEXTS[:2], padding=True, return_tensors="np")
  ids, mask, segments = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
  positions = np.tile(np.arange(ids.shape[1], dtype=np.int32), (ids.shape[0], 1))
  ref = BertForPreTraining(run["config"]).apply(
      {"params": run["params"]}, ids, mask, segments, positions, deterministic=True)
  pretraining, weights = load_flax(transformers.FlaxAutoModelForPreTraining, out)
  got = pretraining(ids, attention_mask=mask, token_type_ids=segments, params=weights)
  np.testing.assert_allclose(got.prediction_logits, ref["mlm_logits"], atol=1e-4)
  np.testing.assert_allclose(got.seq_relationship_logits, ref["nsp_logits"], atol=1e-4)
  encoder, encoder_weights = load_flax(transformers.FlaxAutoModel, out)
  assert isinstance(encoder, transformers.FlaxBertModel)
  hidden = pretraining(ids, attention_mask=mask, token_type_ids=segments, params=weights,
                       output_hidden_states=True).hidden_states[-1]
  np.testing.assert_allclose(
      encoder(ids, attention_mask=mask, token_type_ids=segments,
              params=encoder_weights).last_hidden_state, hidden,
      atol=1e-5)


def _size(params):
  return sum(x.size for x in jax.tree.leaves(params))


def test_vocab_flag_replaces_the_search_and_must_be_the_datas(uncased_run, tmp_path):
  run = clone_run(uncased_run, tmp_path)
  os.rename(run["vocab"], str(tmp_path / "moved_vocab.txt"))
  out = tmp_path / "hf"
  with pytest.raises(ValueError, match=r"--vocab_file: .* no file of that name"):
    export.export(run["checkpoints"], str(out))
  assert not out.exists()  # Nothing half-written.

  other = tmp_path / "other_vocab.txt"
  tokens = (tmp_path / "moved_vocab.txt").read_text().splitlines()
  other.write_text("\n".join(tokens[:-2] + tokens[-1:] + tokens[-2:-1]) + "\n")
  with pytest.raises(ValueError, match=r"--vocab_file=.*other_vocab.txt: its tokens hash to "
                                       r".* was created with vocab"):
    export.export(run["checkpoints"], str(out), vocab_file=str(other))
  assert not out.exists()

  export.export(run["checkpoints"], str(out), vocab_file=str(tmp_path / "moved_vocab.txt"))
  assert (out / "vocab.txt").read_text() == (tmp_path / "moved_vocab.txt").read_text()


def test_without_the_runs_data_the_flags_are_required(uncased_run, tmp_path):
  run = clone_run(uncased_run, tmp_path)
  os.remove(os.path.join(os.path.dirname(run["checkpoints"]), "config.json"))
  out = tmp_path / "hf"
  with pytest.raises(ValueError, match=r"--do_lower_case: the data's casing is unknown"):
    export.export(run["checkpoints"], str(out), vocab_file=run["vocab"])
  with pytest.raises(ValueError, match=r"--vocab_file: the checkpoint's vocab cannot be found"):
    export.export(run["checkpoints"], str(out), do_lower_case=True)
  short = tmp_path / "short_vocab.txt"
  short.write_text("\n".join(open(run["vocab"]).read().splitlines()[:-1]) + "\n")
  with pytest.raises(ValueError, match=rf"{run['config'].vocab_size - 1} tokens but the model "
                                       r"has model.vocab_size"):
    export.export(run["checkpoints"], str(out), vocab_file=str(short), do_lower_case=True)
  assert not out.exists()
  export.export(run["checkpoints"], str(out), vocab_file=run["vocab"], do_lower_case=True)
  assert (out / "tokenizer_config.json").exists()


def test_exports_and_imports_go_through_the_file_layer(uncased_run):
  """Remote paths (gs://) take tf.io.gfile in the file layer; TensorFlow's
  in-memory ram:// file system stands in for a bucket."""
  from bertjax.convert import weights  # pylint: disable=g-import-not-at-top
  from bertjax.records import fileio  # pylint: disable=g-import-not-at-top
  run = uncased_run
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          run["params"])
  for fmt in ("safetensors", "flax", "tf1"):
    out = f"ram://bertjax_export_test/{fmt}"
    export.export(run["checkpoints"], out, fmt)
    assert fileio.read_text(f"{out}/vocab.txt") == open(run["vocab"]).read()
    loaded = jax.device_get(weights.load_weights(out, abstract, run["config"]))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(loaded),
                                                     jax.tree.leaves(run["params"]))), fmt
