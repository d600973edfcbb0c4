"""transformers 5 with PyTorch loads bertjax exports as they are.

transformers 5 has no Flax models, so its users load exports with PyTorch.
That needs a second environment (transformers<5 stays here for the Flax
parity tests): tests/torch_env/make.sh creates ./.venv-torch, which .ci/run
makes before the tests; BERTJAX_TORCH_PYTHON names another interpreter. The
exports and bertjax's outputs are made here; tests/torch_env/hf_outputs.py
loads each export in that environment with AutoTokenizer, AutoModel,
AutoModelForPreTraining or the task's AutoModelFor... class, and its outputs
come back to be compared with bertjax's. Without that environment the tests
skip, except under CI, where they fail.
"""

import json
import os
import subprocess

import jax
import numpy as np
import pytest

from test_export_hf import make_run  # pylint: disable=g-import-not-at-top
import test_export_heads  # pylint: disable=g-import-not-at-top
from bertjax.convert import export  # pylint: disable=g-import-not-at-top
from bertjax.model.bert import BertForPreTraining, BertModel  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_PYTHON = os.environ.get("BERTJAX_TORCH_PYTHON",
                              os.path.join(REPO, ".venv-torch", "bin", "python"))
# Real text: accents, curly quotes and dashes, digits and punctuation, CJK.
TEXTS = [
    "Zoë Saldaña's café in Zürich—naïve, but “très chic”! (Est. 1998; 4.5/5 stars.)",
    "北京大学的学生说：“你好，世界！” Then they left for Tōkyō at 9:30 a.m.",
    "Ελληνικά, русский текст и العربية: mixed scripts, e-mail@example.com & 100%…",
    "The Quick brown fox can't jump over the lazy dog's 12,345 hurdles?!",
]
CORPUS = "\n".join(TEXTS + ["the quick brown fox jumps over the lazy dog and the cafe owner",
                            "students said hello world then left at nine in the morning"]) * 10
# AutoModel... class -> bertjax's outputs it is compared on.
PRETRAINING = {"AutoModel": ("last_hidden_state", "pooler_output"),
               "AutoModelForPreTraining": ("prediction_logits", "seq_relationship_logits")}
TASKS = {  # head type -> transformers 5's Auto class.
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "multiple_choice": "AutoModelForMultipleChoice",
    "question_answering": "AutoModelForQuestionAnswering",
}


def torch_python() -> str:
  if os.path.exists(TORCH_PYTHON):
    return TORCH_PYTHON
  message = (f"{TORCH_PYTHON}: no PyTorch + transformers 5 environment; create it with "
             "`bash tests/torch_env/make.sh`")
  if os.environ.get("CI"):
    pytest.fail(message)
  pytest.skip(message)


def pretraining_outputs(run, ids, mask, segments) -> dict[str, np.ndarray]:
  """bertjax's BertForPreTraining and BertModel on one padded batch."""
  positions = np.tile(np.arange(ids.shape[1], dtype=np.int32), (ids.shape[0], 1))
  with jax.default_matmul_precision("highest"):
    heads = BertForPreTraining(run["config"]).apply(
        {"params": run["params"]}, ids, mask, segments, positions, deterministic=True)
    seq, pooled = BertModel(run["config"]).apply(
        {"params": run["params"]["bert"]}, ids, mask, segments, deterministic=True)
  return {"prediction_logits": heads["mlm_logits"], "seq_relationship_logits": heads["nsp_logits"],
          "last_hidden_state": seq, "pooler_output": pooled}


def padded(token_lists) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  length = max(map(len, token_lists))
  ids = np.zeros((len(token_lists), length), np.int32)
  for i, tokens in enumerate(token_lists):
    ids[i, :len(tokens)] = tokens
  mask = (np.arange(length) < np.array([[len(t)] for t in token_lists])).astype(np.int32)
  segments = ((np.arange(length) >= length // 2) * mask).astype(np.int32)
  return ids, mask, segments


def compare(root) -> dict:
  """Exports, bertjax's outputs, and what the PyTorch environment made of them."""
  python = torch_python()
  spec = {"tokenizers": {}, "models": {}}
  inputs, expected, tokens = {}, {}, {}
  runs = {}
  for cased in (False, True):
    name = "cased" if cased else "uncased"
    (root / name).mkdir()
    run = runs[name] = make_run(root / name, not cased, vocab_size=400, corpus=CORPUS)
    out = str(root / name / "hf")
    export.export(run["checkpoints"], out)
    tok = run["tokenizer"]
    tokens[name] = [[tok.special_ids["cls"]] + tok.encode(t) + [tok.special_ids["sep"]]
                    for t in TEXTS]
    spec["tokenizers"][name] = {"dir": out, "texts": TEXTS}
    ids, mask, segments = padded(tokens[name])
    ours = pretraining_outputs(run, ids, mask, segments)
    for auto, outputs in PRETRAINING.items():
      key = f"{name}_{auto}"
      spec["models"][key] = {"dir": out, "auto": auto, "outputs": list(outputs)}
      inputs.update({f"{key}/input_ids": ids, f"{key}/attention_mask": mask,
                     f"{key}/token_type_ids": segments})
      expected.update({f"{key}/{o}": ours[o] for o in outputs})
  for head_type, auto in TASKS.items():
    pretrained = runs["uncased"]
    checkpoints, params = test_export_heads.save_task_checkpoint(
        root, pretrained, head_type, {"type": head_type})
    out = str(root / head_type / "hf")
    export.export(checkpoints, out)
    ids, mask, segments = test_export_heads.inputs(pretrained["config"].vocab_size, head_type)
    ours = test_export_heads.reference(params, pretrained["config"], head_type, ids, mask,
                                       segments)
    spec["models"][head_type] = {"dir": out, "auto": auto, "outputs": sorted(ours)}
    inputs.update({f"{head_type}/input_ids": ids, f"{head_type}/attention_mask": mask,
                   f"{head_type}/token_type_ids": segments})
    expected.update({f"{head_type}/{k}": v for k, v in ours.items()})
  (root / "spec.json").write_text(json.dumps(spec))
  np.savez(root / "inputs.npz", **inputs)
  done = subprocess.run(
      [python, os.path.join(REPO, "tests", "torch_env", "hf_outputs.py"),
       str(root / "spec.json"), str(root / "inputs.npz"), str(root / "out")],
      capture_output=True, text=True, timeout=600, check=False,
      env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               CUDA_VISIBLE_DEVICES=""))
  assert done.returncode == 0, done.stderr[-4000:]
  results = json.loads((root / "out" / "results.json").read_text())
  got = dict(np.load(root / "out" / "outputs.npz"))
  return dict(results=results, got=got, expected=expected, tokens=tokens, runs=runs)


def check_tokenizer(compared, name):
  result = compared["results"]["tokenizers"][name]
  tok = compared["runs"][name]["tokenizer"]
  unk = tok.special_ids["unk"]
  for text, ours, theirs in zip(TEXTS, compared["tokens"][name], result["ids"]):
    assert theirs == ours, (name, text, tok.convert_ids_to_tokens(ours))
    assert ours.count(unk) < len(ours) // 4, text  # The vocab covers the text.
  assert result["mask_token_id"] == tok.special_ids["mask"]
  assert result["pad_token_id"] == tok.special_ids["pad"]


def check_model(compared, name):
  result = compared["results"]["models"][name]
  architecture = {"AutoModel": "BertModel", "AutoModelForPreTraining": "BertForPreTraining"}
  head = name.split("_", 1)[1] if name.startswith(("cased_", "uncased_")) else None
  assert result["class"] == (architecture[head] if head else
                             test_export_heads.heads.HEADS[name].architecture)
  loading = result["loading"]
  if head == "AutoModel":  # The encoder alone: the pretraining heads stay unread.
    assert loading["unexpected_keys"] and all(k.startswith("cls.")
                                              for k in loading["unexpected_keys"]), loading
    loading = dict(loading, unexpected_keys=[])
  assert loading == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}, name
  outputs = [k for k in compared["expected"] if k.startswith(name + "/")]
  assert outputs
  for key in outputs:
    np.testing.assert_allclose(compared["got"][key], compared["expected"][key], atol=1e-4,
                               err_msg=key)


def test_transformers_5_with_pytorch_loads_the_exports_and_computes_what_bertjax_does(
    tmp_path):
  """One test, so that the exports are made once (xdist deals tests out one by one)."""
  compared = compare(tmp_path)
  assert int(compared["results"]["transformers"].split(".")[0]) == 5
  for name in ("uncased", "cased"):
    check_tokenizer(compared, name)
  models = compared["results"]["models"]
  assert sorted(models) == sorted([f"{c}_{a}" for c in ("cased", "uncased")
                                   for a in PRETRAINING] + list(TASKS))
  for name in models:
    check_model(compared, name)
