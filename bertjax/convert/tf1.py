"""The original BERT release's TF1 checkpoints: export and import.

A TF1 model directory, as Google published BERT-Base/Large and as the
original run_pretraining.py / run_classifier.py / run_squad.py write them:

  bert_model.ckpt.index, bert_model.ckpt.data-00000-of-00001
      a name-based TensorFlow checkpoint (what tf.compat.v1.train.Saver
      writes and tf.train.init_from_checkpoint and Hugging Face's
      load_tf_weights_in_bert read)
  bert_config.json   the release's BertConfig fields
  vocab.txt          the WordPiece vocab

Variable names are the release's (modeling.py, run_pretraining.py):
bert/embeddings/{word,position,token_type}_embeddings [V|P|T, H],
bert/embeddings/LayerNorm/{gamma,beta}, bert/encoder/layer_N/attention/
self/{query,key,value}/{kernel,bias}, .../attention/output/dense,
.../attention/output/LayerNorm, .../intermediate/dense, .../output/dense,
.../output/LayerNorm, bert/pooler/dense, cls/predictions/transform/dense,
cls/predictions/transform/LayerNorm, cls/predictions/output_bias [V],
cls/seq_relationship/output_weights [2, H] and output_bias [2]. Dense
kernels are [in, out]. Fine-tuned heads: run_classifier's output_weights
[num_labels, H] and output_bias, run_squad's cls/squad/output_weights
[2, H] and cls/squad/output_bias.

The release computes GELU with its tanh approximation; bertjax and Hugging
Face compute the exact (erf) GELU, so the same weights give slightly
different activations in the original code (as Google's own checkpoints do
in transformers). Optimizer slots (adam_m, adam_v) and global_step in a
checkpoint are skipped on import.
"""

import json
import os
from typing import Any, Optional

import numpy as np
from absl import logging

from bertjax.convert import hf
from bertjax.model.config import BertConfig
from bertjax.records import fileio

CKPT_NAME = "bert_model.ckpt"
CONFIG_NAME = "bert_config.json"
_SKIPPED = ("adam_m", "adam_v", "AdamWeightDecayOptimizer", "AdamWeightDecayOptimizer_1",
            "global_step")

# HF Flax path -> (TF1 name, transposed). Everything else maps by rule
# (_hf_to_tf1_name).
_SPECIAL = {
    ("cls", "predictions", "bias"): ("cls/predictions/output_bias", False),
    ("cls", "seq_relationship", "kernel"): ("cls/seq_relationship/output_weights", True),
    ("cls", "seq_relationship", "bias"): ("cls/seq_relationship/output_bias", False),
    ("classifier", "kernel"): ("output_weights", True),
    ("classifier", "bias"): ("output_bias", False),
    ("qa_outputs", "kernel"): ("cls/squad/output_weights", True),
    ("qa_outputs", "bias"): ("cls/squad/output_bias", False),
}
_SPECIAL_BACK = {name: (path, t) for path, (name, t) in _SPECIAL.items()}
_LAYER_NORM = {"scale": "gamma", "bias": "beta"}


def _hf_to_tf1_name(path: hf.Path) -> tuple[str, bool]:
  if path in _SPECIAL:
    return _SPECIAL[path]
  parts = list(path)
  if len(parts) >= 2 and parts[-2] == "LayerNorm":
    parts[-1] = _LAYER_NORM[parts[-1]]
  if parts[-1] == "embedding":
    parts.pop()
  out = []
  for p in parts:
    if p.isdigit() and out and out[-1] == "layer":
      out[-1] = f"layer_{p}"
    else:
      out.append(p)
  return "/".join(out), False


def _tf1_to_hf_path(name: str) -> tuple[hf.Path, bool]:
  if name in _SPECIAL_BACK:
    return _SPECIAL_BACK[name]
  parts = []
  for p in name.split("/"):
    if p.startswith("layer_") and p[len("layer_"):].isdigit():
      parts += ["layer", p[len("layer_"):]]
    else:
      parts.append(p)
  if len(parts) >= 2 and parts[-2] == "LayerNorm":
    parts[-1] = {v: k for k, v in _LAYER_NORM.items()}.get(parts[-1], parts[-1])
  if parts[-1].endswith("_embeddings"):
    parts.append("embedding")
  return tuple(parts), False


def hf_to_tf1(hf_params) -> dict[str, np.ndarray]:
  """HF Flax-layout params (FlaxBertForPreTraining's, or a task model's) ->
  {TF1 variable name: float32 array}. Encoder-only trees get the bert/ prefix."""
  flat = hf.flatten(hf.unwrap(hf_params))
  if "embeddings" in {p[0] for p in flat}:
    flat = {("bert",) + p: x for p, x in flat.items()}
  out = {}
  for path, x in flat.items():
    name, transpose = _hf_to_tf1_name(path)
    x = np.asarray(x, np.float32)
    out[name] = np.ascontiguousarray(x.T if transpose else x)
  return out


def tf1_to_hf(variables: dict[str, np.ndarray]) -> dict[hf.Path, np.ndarray]:
  """The inverse of hf_to_tf1 (flat HF Flax paths); optimizer slots are skipped."""
  out, skipped = {}, []
  for name, x in variables.items():
    if any(part in _SKIPPED for part in name.split("/")):
      skipped.append(name)
      continue
    path, transpose = _tf1_to_hf_path(name)
    out[path] = np.asarray(x).T if transpose else np.asarray(x)
  if skipped:
    logging.info("Skipped %d optimizer variables of the TF1 checkpoint", len(skipped))
  return out


# The fields of the release's modeling.BertConfig.
_RELEASE_CONFIG_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
    "max_position_embeddings", "type_vocab_size", "initializer_range")


def config_dict(config: BertConfig) -> dict[str, Any]:
  """bert_config.json as the release's modeling.BertConfig reads it."""
  fields = hf.hf_config_dict(config, "BertModel")
  return {k: fields[k] for k in _RELEASE_CONFIG_FIELDS}


def write_checkpoint(variables: dict[str, np.ndarray], prefix: str) -> None:
  """A name-based TF checkpoint (prefix.index, prefix.data-*), as Saver writes it."""
  tf = fileio.tensorflow()
  names = sorted(variables)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tf.constant(variables[n]) for n in names])


def read_checkpoint(prefix: str) -> dict[str, np.ndarray]:
  """{name: array} of every variable of the checkpoint at `prefix` (local or gs://)."""
  reader = fileio.tensorflow().compat.v1.train.NewCheckpointReader(prefix)
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def save_tf1_checkpoint(params, config: BertConfig, out_dir: str,
                        hf_params: Optional[Any] = None) -> str:
  """Writes bert_model.ckpt.* and bert_config.json of bertjax `params`; returns the prefix.

  `hf_params` (HF Flax layout, e.g. a task model's with its head) replaces
  the conversion of `params`. Vocab rows past config.vocab_size (padding) are
  not written; weights are stored as float32, as the release's are. A causal
  model is refused: the release's modeling.py has no causal mask.
  """
  if config.causal:
    raise ValueError("--format=tf1: the model is causal (objective ltr), and the original "
                     "release's modeling.py has no causal mask, so its graphs would compute "
                     "another model; export as safetensors or flax (transformers' "
                     "is_decoder=True)")
  if hf_params is None:
    hf_params = hf.bertjax_to_hf(params, config)
  fileio.makedirs(out_dir)
  prefix = os.path.join(out_dir, CKPT_NAME)
  write_checkpoint(hf_to_tf1(hf_params), prefix)
  fileio.write_text(os.path.join(out_dir, CONFIG_NAME),
                    json.dumps(config_dict(config), indent=2, sort_keys=True) + "\n")
  return prefix


def _prefix(path: str) -> Optional[str]:
  """The checkpoint prefix for a TF1 model directory or a prefix itself."""
  if fileio.exists(path + ".index"):
    return path
  if fileio.isdir(path):
    indexes = [n for n in fileio.listdir(path) if n.endswith(".ckpt.index")]
    if CKPT_NAME + ".index" in indexes:
      return os.path.join(path, CKPT_NAME)
    if len(indexes) == 1:
      return os.path.join(path, indexes[0][:-len(".index")])
  return None


def is_tf1_checkpoint(path: str) -> bool:
  """A directory with *.ckpt.index, or a checkpoint prefix (with .index)."""
  return _prefix(path) is not None


def load_tf1_checkpoint(path: str, *, encoder_only: bool = False,
                        **overrides) -> tuple[dict, BertConfig]:
  """A TF1 BERT checkpoint -> ({'params': bertjax tree} of numpy arrays, BertConfig).

  `path` is the model directory or the checkpoint prefix; bert_config.json
  is read beside it. Head weights are needed unless `encoder_only` (then the
  tree is BertModel's and anything outside bert/ is skipped); `overrides` go
  to the BertConfig (e.g. scan_layers=False).
  """
  prefix = _prefix(path)
  if prefix is None:
    raise ValueError(f"{path}: no TF1 checkpoint (*.ckpt.index) there")
  config_path = os.path.join(os.path.dirname(prefix), CONFIG_NAME)
  if not fileio.exists(config_path):
    raise ValueError(f"{config_path}: missing; a TF1 BERT checkpoint needs its "
                     "bert_config.json beside it")
  try:
    config = hf.hf_config_to_bertjax(json.loads(fileio.read_text(config_path)), **overrides)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{config_path}: {e}") from None
  flat = tf1_to_hf(read_checkpoint(prefix))
  if encoder_only:
    flat = {p[1:]: x for p, x in flat.items() if p[0] == "bert"}
  elif not any(p[0] == "cls" for p in flat):
    raise ValueError(f"{prefix}: the checkpoint has no pretraining heads (cls/...); "
                     "load it with encoder_only=True (BertModel's tree)")
  else:
    heads = sorted("/".join(p) for p in flat if p[0] not in ("bert", "cls"))
    if heads:
      logging.info("%s: skipped %d fine-tuning head weights: %s", prefix, len(heads), heads)
    flat = {p: x for p, x in flat.items() if p[0] in ("bert", "cls")}
  return hf.hf_to_bertjax(hf.unflatten(flat), config, source=prefix), config
