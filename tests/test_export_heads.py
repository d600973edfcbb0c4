"""Fine-tuned task models export with the names other tools load.

Task checkpoints are built here in the fine-tuning param layout
({"bert": BertModel params, "classifier" | "qa_outputs": {kernel [D, out],
bias}}), saved as a fine-tuning run leaves them (a workdir whose record names
the pretraining checkpoint it started from, so the vocab is that run's).
Exports must load in transformers' Flax task models and compute what the
bertjax encoder plus the head computes; TF1 exports must carry the names and
shapes of the release's run_classifier.py / run_squad.py graphs, which load
them and compute the same logits.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

import test_tf1  # pylint: disable=g-import-not-at-top
from test_export_hf import load_flax, make_run  # pylint: disable=g-import-not-at-top
from bertjax.convert import export  # pylint: disable=g-import-not-at-top
from bertjax.convert import heads  # pylint: disable=g-import-not-at-top
from bertjax.model.bert import BertModel  # pylint: disable=g-import-not-at-top

B, C, L = 2, 4, 12
# head type -> (params key, outputs, transformers' Flax class).
HEADS = {
    "sequence_classification": ("classifier", 3, "FlaxAutoModelForSequenceClassification"),
    "token_classification": ("classifier", 5, "FlaxAutoModelForTokenClassification"),
    "multiple_choice": ("classifier", 1, "FlaxAutoModelForMultipleChoice"),
    "question_answering": ("qa_outputs", 2, "FlaxAutoModelForQuestionAnswering"),
}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  return make_run(tmp_path_factory.mktemp("pretrained"), True)


def save_task_checkpoint(root, pretrained, head_type, meta_head=None):
  """A fine-tuning workdir: its record (init_from) and a checkpoint of the task model."""
  from bertjax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train.state import TrainState  # pylint: disable=g-import-not-at-top
  key, size, _ = HEADS[head_type]
  config = pretrained["config"]
  rng = np.random.default_rng(len(head_type))
  params = {"bert": jax.tree.map(np.asarray, pretrained["params"]["bert"]),
            key: {"kernel": rng.normal(0, 0.2, (config.hidden_size, size)).astype(np.float32),
                  "bias": rng.normal(0, 0.2, (size,)).astype(np.float32)}}
  workdir = root / head_type
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"init_from": pretrained["checkpoints"]}))
  ckpt = ckpt_lib.Checkpointer(str(workdir / "checkpoints"), keep=1, async_save=False)
  state = TrainState(step=jnp.array(9), params=params, opt_state={"count": jnp.zeros(())},
                     apply_fn=None, tx=None)
  meta = {"model": dataclasses.asdict(config)}
  if meta_head:
    meta["head"] = meta_head
  ckpt.save(state, meta)
  ckpt.close()
  return str(workdir / "checkpoints"), params


def inputs(vocab_size, head_type, seed=0):
  rng = np.random.default_rng(seed)
  shape = (B, C, L) if head_type == "multiple_choice" else (B, L)
  mask = np.ones(shape, np.int32)
  mask[1, ..., 8:] = 0
  ids = (rng.integers(5, vocab_size, shape) * mask).astype(np.int32)
  segments = (np.arange(L) >= 5).astype(np.int32) * mask
  return ids, mask, segments


def reference(params, config, head_type, ids, mask, segments):
  """The bertjax encoder and the head as interfaces define them."""
  key, _, _ = HEADS[head_type]
  flat = lambda x: x.reshape(-1, L)
  with jax.default_matmul_precision("highest"):
    seq, pooled = BertModel(config).apply({"params": params["bert"]}, flat(ids), flat(mask),
                                          flat(segments), deterministic=True)
  head = params[key]
  if head_type == "sequence_classification":
    return {"logits": pooled @ head["kernel"] + head["bias"]}
  if head_type == "multiple_choice":
    return {"logits": (pooled @ head["kernel"] + head["bias"]).reshape(B, C)}
  out = seq @ head["kernel"] + head["bias"]
  if head_type == "token_classification":
    return {"logits": out}
  return {"start_logits": out[..., 0], "end_logits": out[..., 1]}


@pytest.mark.slow
@pytest.mark.parametrize("head_type", sorted(HEADS))
def test_hugging_face_task_models_load_the_export(pretrained, tmp_path, head_type):
  labels = ({"sequence_classification": ["neg", "neutral", "pos"],
             "token_classification": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]}
            .get(head_type))
  checkpoints, params = save_task_checkpoint(
      tmp_path, pretrained, head_type, {"type": head_type, "labels": labels})
  out = str(tmp_path / "hf")
  summary = export.export(checkpoints, out,
                          "safetensors" if head_type == "question_answering" else "flax")
  assert f"{head_type} head" in summary
  with open(os.path.join(out, "config.json")) as f:
    hf_config = json.load(f)
  if labels:
    assert hf_config["id2label"] == {str(i): n for i, n in enumerate(labels)}
  model, loaded = load_flax(getattr(transformers, HEADS[head_type][2]), out)
  assert type(model).__name__ == "Flax" + heads.HEADS[head_type].architecture
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok.vocab == pretrained["tokenizer"].vocab  # The pretraining run's vocab.
  ids, mask, segments = inputs(pretrained["config"].vocab_size, head_type)
  got = model(ids, attention_mask=mask, token_type_ids=segments, params=loaded)
  for name, value in reference(params, pretrained["config"], head_type, ids, mask,
                               segments).items():
    np.testing.assert_allclose(getattr(got, name), value, atol=1e-5, err_msg=name)


def test_head_type_must_be_named_when_the_tree_is_ambiguous(pretrained, tmp_path):
  checkpoints, _ = save_task_checkpoint(tmp_path, pretrained, "token_classification")
  with pytest.raises(ValueError, match=r"--head: the checkpoint's classifier fits"):
    export.export(checkpoints, str(tmp_path / "out"))
  with pytest.raises(ValueError, match=r"--head=question_answering: the checkpoint's head is "
                                       r"\['classifier'\]"):
    export.export(checkpoints, str(tmp_path / "out"), head="question_answering")
  with pytest.raises(ValueError, match=r"--labels: 2 names for a head of 5 outputs"):
    export.export(checkpoints, str(tmp_path / "out"), head="token_classification",
                  labels=["a", "b"])
  export.export(checkpoints, str(tmp_path / "out"), head="token_classification")
  with open(tmp_path / "out" / "config.json") as f:
    assert json.load(f)["architectures"] == ["BertForTokenClassification"]


def test_parameters_without_a_counterpart_are_refused_not_dropped(pretrained, tmp_path):
  """A feature-based tagger's LSTMs have no Hugging Face or TF1 class: the export
  stops naming them instead of writing the encoder alone."""
  from bertjax.train import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bertjax.train.state import TrainState  # pylint: disable=g-import-not-at-top
  config = pretrained["config"]
  params = {"bert": jax.tree.map(np.asarray, pretrained["params"]["bert"]),
            "lstm_0": {"kernel": np.zeros((config.hidden_size, 8), np.float32)},
            "tagger": {"kernel": np.zeros((16, 9), np.float32)}}
  workdir = tmp_path / "features"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps({"init_from": pretrained["checkpoints"]}))
  ckpt = ckpt_lib.Checkpointer(str(workdir / "checkpoints"), keep=1, async_save=False)
  ckpt.save(TrainState(step=jnp.array(3), params=params, opt_state={"count": jnp.zeros(())},
                       apply_fn=None, tx=None),
            {"model": dataclasses.asdict(config),
             "head": {"type": "token_classification", "labels": []}})
  ckpt.close()
  with pytest.raises(ValueError, match=r"its parameters \['lstm_0', 'tagger'\] have no "
                                       r"Hugging Face or TF1 BERT counterpart"):
    export.export(str(workdir / "checkpoints"), str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("head_type,kind", [("sequence_classification", "classifier"),
                                            ("question_answering", "squad")])
def test_tf1_task_export_is_what_run_classifier_and_run_squad_build_and_load(
    pretrained, tmp_path, tmp_path_factory, head_type, kind):
  from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
  checkpoints, params = save_task_checkpoint(tmp_path, pretrained, head_type,
                                             {"type": head_type})
  out = str(tmp_path / "tf1")
  export.export(checkpoints, out, "tf1")
  prefix = os.path.join(out, "bert_model.ckpt")
  ours = {k: list(v.shape) for k, v in tf1.read_checkpoint(prefix).items()}
  config = pretrained["config"]
  ids, mask, segments = inputs(config.vocab_size, head_type)
  result = test_tf1.original(
      tmp_path_factory, kind=kind, config=test_tf1.release_config(config), num_labels=3,
      init_checkpoint=prefix, exact_gelu=True,
      inputs=dict(input_ids=ids.tolist(), input_mask=mask.tolist(),
                  segment_ids=segments.tolist()))
  assert ours == result["variables"]
  assert result["loaded"] == sorted(ours)
  ref = reference(params, config, head_type, ids, mask, segments)
  for name, value in result["outputs"].items():
    np.testing.assert_allclose(np.asarray(value), ref[name], atol=2e-5, err_msg=name)


def test_a_causal_encoder_exports_only_the_heads_that_compute_the_same(pretrained, tmp_path):
  # A left-to-right (objective ltr) encoder: the same weights under a causal mask.
  causal = dict(pretrained, config=pretrained["config"].replace(causal=True))
  # Its pooled output is each row's last real token; transformers' and the release's
  # classification and multiple-choice models pool [CLS]: refused, nothing written.
  for head_type in ("sequence_classification", "multiple_choice"):
    checkpoints, _ = save_task_checkpoint(tmp_path, causal, head_type, {"type": head_type})
    for fmt in ("safetensors", "tf1"):
      out = tmp_path / f"{head_type}_{fmt}"
      with pytest.raises(ValueError, match=rf"{heads.HEADS[head_type].architecture}: the "
                                           r"checkpoint's encoder is causal.*pool \[CLS\]"):
        export.export(str(checkpoints), str(out), fmt)
      assert not out.exists()
  # A token classifier reads every token: transformers' decoder (is_decoder) computes it.
  checkpoints, params = save_task_checkpoint(tmp_path, causal, "token_classification",
                                             {"type": "token_classification"})
  export.export(checkpoints, str(tmp_path / "hf"), "flax")
  model, loaded = load_flax(transformers.FlaxAutoModelForTokenClassification,
                            str(tmp_path / "hf"))
  assert model.config.is_decoder
  ids, mask, segments = inputs(causal["config"].vocab_size, "token_classification")
  got = model(ids, attention_mask=mask, token_type_ids=segments, params=loaded).logits
  want = reference(params, causal["config"], "token_classification", ids, mask,
                   segments)["logits"]
  np.testing.assert_allclose(np.asarray(got)[mask > 0], np.asarray(want)[mask > 0], atol=1e-5)
  # The release's modeling.py has no causal mask: no TF1 export of a causal model.
  with pytest.raises(ValueError, match=r"--format=tf1: the model is causal"):
    export.export(checkpoints, str(tmp_path / "tf1"), "tf1")
  assert not (tmp_path / "tf1").exists()
