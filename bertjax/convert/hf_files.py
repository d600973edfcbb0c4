"""Hugging Face model directories: read and write BERT weights as transformers does.

A model directory holds config.json and one of model.safetensors (PyTorch
or Flax names; sharded with an index too), flax_model.msgpack, or
pytorch_model.bin (read with torch when it is installed). Reading needs
neither TensorFlow nor transformers. The layouts and their mapping onto
bertjax's tree are in hf.py.
"""

import json
import os
from typing import Mapping, Optional

import numpy as np
from absl import logging

from bertjax.convert import hf
from bertjax.model.config import BertConfig
from bertjax.records import fileio

# ---------------------------------------------------------------------------
# PyTorch state-dict names.

# PyTorch buffers, not weights; skipped with a count in the log.
_TORCH_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def _hf_path_to_torch(path: hf.Path) -> tuple[str, bool]:
  """HF Flax path -> (PyTorch name, whether the array is transposed)."""
  last = path[-1]
  if last == "kernel":
    return ".".join(path[:-1] + ("weight",)), True
  if last in ("embedding", "scale"):
    return ".".join(path[:-1] + ("weight",)), False
  return ".".join(path), False


def _torch_to_hf_flat(state: Mapping[str, np.ndarray], source: str) -> dict[hf.Path, np.ndarray]:
  """A PyTorch BERT state dict (numpy values) -> flat HF Flax layout.

  Drops the tied decoder after checking it equals the word embeddings (and its
  bias the prediction bias); an untied decoder is an error.
  """
  flat, skipped = {}, []
  decoder = {}
  for name, x in state.items():
    if name.endswith(_TORCH_BUFFERS):
      skipped.append(name)
      continue
    if name.startswith("cls.predictions.decoder."):
      decoder[name.rsplit(".", 1)[1]] = x
      continue
    path = tuple(name.split("."))
    if len(path) < 2:
      flat[path] = np.asarray(x)  # not a BERT weight: reported by hf_to_bertjax
      continue
    if path[-2] == "LayerNorm":
      path = hf.normalise_layer_norm(path)
    elif path[-2].endswith("_embeddings") and path[-1] == "weight":
      path = path[:-1] + ("embedding",)
    elif path[-1] == "weight":
      path, x = path[:-1] + ("kernel",), np.asarray(x).T
    flat[path] = np.asarray(x)
  if "bias" in decoder:
    bias = flat.setdefault(("cls", "predictions", "bias"), decoder["bias"])
    if not np.array_equal(bias, decoder["bias"]):
      raise ValueError(f"{source}: cls.predictions.decoder.bias differs from "
                       "cls.predictions.bias; bertjax has one MLM output bias")
  if "weight" in decoder:
    for prefix in (("bert",), ()):
      table = flat.get(prefix + ("embeddings", "word_embeddings", "embedding"))
      if table is not None:
        break
    if table is None or not np.array_equal(table, decoder["weight"]):
      raise ValueError(f"{source}: cls.predictions.decoder.weight is not tied to the word "
                       "embeddings; bertjax ties the MLM decoder to them "
                       "(tie_word_embeddings=True)")
  if skipped:
    logging.info("%s: skipped %d PyTorch buffers: %s", source, len(skipped), skipped)
  return flat


def hf_flat_to_torch(hf_params) -> dict[str, np.ndarray]:
  out = {}
  for path, x in hf.flatten(hf_params).items():
    name, transpose = _hf_path_to_torch(path)
    out[name] = np.ascontiguousarray(np.asarray(x).T if transpose else x)
  return out


# ---------------------------------------------------------------------------
# Model directories.

def _safetensors_format(data: bytes) -> str | None:
  """The `format` entry of a safetensors file's header metadata ("pt", "flax", ...)."""
  size = int.from_bytes(data[:8], "little")
  return (json.loads(data[8:8 + size]).get("__metadata__") or {}).get("format")


def _read_safetensors(files: list[str]) -> dict[hf.Path, np.ndarray]:
  from safetensors.numpy import load  # pylint: disable=g-import-not-at-top
  state, formats = {}, set()
  for f in files:
    data = fileio.read_bytes(f)
    formats.add(_safetensors_format(data))
    state.update(load(data))
  source = files[0] if len(files) == 1 else os.path.dirname(files[0])
  flax_names = any(k.endswith((".kernel", ".embedding", ".scale")) for k in state)
  if formats == {"flax"} or (formats <= {None} and flax_names):
    return {tuple(k.split(".")): v for k, v in state.items()}
  if formats - {"pt", None}:
    raise ValueError(f"{source}: safetensors format {sorted(map(str, formats))} is not read; "
                     "save the model from PyTorch or Flax transformers instead")
  return _torch_to_hf_flat(state, source)


def _read_torch(files: list[str]) -> dict[hf.Path, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(
        f"{files[0]}: PyTorch pickle weights need torch to read. Either `pip install torch`, "
        "or convert the model to safetensors where torch is available "
        "(transformers.BertForPreTraining.from_pretrained(dir).save_pretrained(out_dir) "
        "writes model.safetensors), then load that directory.") from None
  state = {}
  for f in files:
    with fileio.open_binary(f) as fh:
      loaded = torch.load(fh, map_location="cpu", weights_only=True)
    for k, v in loaded.items():
      state[k] = v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
  return _torch_to_hf_flat(state, files[0])


def _read_flax(files: list[str]) -> dict[hf.Path, np.ndarray]:
  from flax import serialization  # pylint: disable=g-import-not-at-top
  flat = {}
  for f in files:
    flat.update(hf.flatten(serialization.msgpack_restore(fileio.read_bytes(f))))
  return flat


def _shards(directory: str, index_name: str) -> list[str]:
  weight_map = json.loads(fileio.read_text(os.path.join(directory, index_name)))["weight_map"]
  return [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]


def _find_weights(directory: str):
  """(reader, files) for the first weight format found, safetensors first."""
  candidates = (
      (hf.SAFETENSORS_NAME, hf.SAFETENSORS_INDEX_NAME, _read_safetensors),
      (hf.FLAX_NAME, hf.FLAX_INDEX_NAME, _read_flax),
      (hf.TORCH_NAME, hf.TORCH_INDEX_NAME, _read_torch),
  )
  for single, index, reader in candidates:
    if fileio.exists(os.path.join(directory, single)):
      return reader, [os.path.join(directory, single)]
    if fileio.exists(os.path.join(directory, index)):
      return reader, _shards(directory, index)
  tf_only = fileio.exists(os.path.join(directory, hf.TF_NAME))
  raise ValueError(
      f"{directory}: no model weights ({', '.join(hf.WEIGHT_FILES)})"
      + ("; TensorFlow weights (tf_model.h5) are not read: convert them to safetensors with "
         "transformers first" if tf_only else ""))


def load_hf_checkpoint(path_or_dir: str, *, encoder_only: bool = False,
                       **overrides) -> tuple[dict, BertConfig]:
  """Reads a Hugging Face BERT directory (local or gs://) -> (bertjax params, BertConfig).

  The directory holds config.json and one of model.safetensors (PyTorch or
  Flax names; sharded with an index too), flax_model.msgpack, or
  pytorch_model.bin (needs torch). `path_or_dir` may also name the weights
  file itself. `overrides` go to hf_config_to_bertjax (e.g. scan_layers=False).
  The params are {'params': BertForPreTraining tree} of numpy arrays in the
  stored dtype; a checkpoint without the pretraining heads is an error. With
  `encoder_only`, the params are BertModel's tree and any head weights are
  skipped (counted in the log): for BertModel checkpoints and fine-tuning.
  """
  if fileio.isdir(path_or_dir):
    directory = path_or_dir
    reader, files = _find_weights(directory)
  else:
    directory = os.path.dirname(path_or_dir) or "."
    name = os.path.basename(path_or_dir)
    if name.endswith(".safetensors"):
      reader = _read_safetensors
    elif name.endswith(".msgpack"):
      reader = _read_flax
    elif name.endswith(".bin"):
      reader = _read_torch
    else:
      raise ValueError(f"{path_or_dir}: not a model directory nor a .safetensors, .msgpack "
                       "or .bin weights file")
    files = [path_or_dir]
  config_path = os.path.join(directory, hf.CONFIG_NAME)
  if not fileio.exists(config_path):
    raise ValueError(f"{directory}: no {hf.CONFIG_NAME}; a Hugging Face model directory needs it")
  try:
    hf_config = json.loads(fileio.read_text(config_path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{config_path}: not valid JSON ({e})") from None
  try:
    config = hf.hf_config_to_bertjax(hf_config, **overrides)
  except ValueError as e:
    raise ValueError(f"{config_path}: {e}") from None
  flat = reader(files)
  tops = {p[0] for p in flat}
  if not encoder_only and "cls" not in tops:
    raise ValueError(f"{path_or_dir}: the checkpoint has no pretraining heads (cls.*); "
                     "pass encoder_only=True to load the encoder alone (BertModel's tree)")
  if encoder_only and "bert" in tops:
    skipped = sorted("/".join(p) for p in flat if p[0] != "bert")
    if skipped:
      logging.warning("%s: encoder_only: skipped %d weights outside the encoder: %s",
                      path_or_dir, len(skipped), skipped)
    flat = {p[1:]: x for p, x in flat.items() if p[0] == "bert"}
  params = hf.hf_to_bertjax(hf.unflatten(flat), config, source=str(path_or_dir))
  logging.info("Loaded %s (%s) from %s", hf.describe(config),
               "encoder only" if encoder_only else "with pretraining heads", path_or_dir)
  return params, config


def save_hf_checkpoint(params, config: BertConfig, out_dir: str, format: str = "safetensors",
                       *, encoder_only: bool = False,
                       config_extra: Optional[Mapping] = None) -> str:  # pylint: disable=redefined-builtin
  """Writes config.json and the weights as transformers saves them; returns the weights file.

  format "safetensors": model.safetensors with PyTorch names (what
  BertForPreTraining.from_pretrained reads; FlaxBertForPreTraining reads it too).
  format "flax": flax_model.msgpack for FlaxBertForPreTraining.from_pretrained.
  `encoder_only` writes BertModel's weights (no heads, no 'bert' prefix) for
  fine-tuning. Weights keep their dtype; vocab rows past config.vocab_size
  (padding) are not written. `config_extra` adds or replaces config.json
  fields (e.g. pad_token_id). Refuses to mix with other weights already in
  `out_dir`, which may be local or gs://.
  """
  hf_params = hf.bertjax_to_hf(params, config, encoder_only=encoder_only)
  architecture = "BertModel"
  if "cls" in hf_params:  # Without NSP: transformers' classes with the MLM head alone.
    architecture = ("BertForPreTraining" if "seq_relationship" in hf_params["cls"] else
                    "BertLMHeadModel" if config.causal else "BertForMaskedLM")
  return write_hf_model(hf_params, hf.hf_config_dict(config, architecture), out_dir,
                        format, config_extra)


def write_hf_model(hf_params, config_dict: Mapping, out_dir: str, format: str,  # pylint: disable=redefined-builtin
                   config_extra: Optional[Mapping] = None) -> str:
  """config.json and the weights of HF Flax-layout params; returns the weights file."""
  formats = {"safetensors": hf.SAFETENSORS_NAME, "flax": hf.FLAX_NAME}
  if format not in formats:
    raise ValueError(f"save_hf_checkpoint: format={format!r} is not one of {sorted(formats)}")
  fileio.makedirs(out_dir)
  others = [n for n in hf.WEIGHT_FILES if n != formats[format]
            and fileio.exists(os.path.join(out_dir, n))]
  if others:
    raise ValueError(f"{out_dir}: already holds {others}; save into an empty directory so "
                     "that loaders do not pick up stale weights")
  fileio.write_text(os.path.join(out_dir, hf.CONFIG_NAME), json.dumps(
      dict(config_dict, **(config_extra or {})), indent=2, sort_keys=True) + "\n")
  weights_path = os.path.join(out_dir, formats[format])
  if format == "flax":
    from flax import serialization  # pylint: disable=g-import-not-at-top
    fileio.write_bytes(weights_path, serialization.msgpack_serialize(hf_params))
  else:
    from safetensors.numpy import save  # pylint: disable=g-import-not-at-top
    fileio.write_bytes(weights_path, save(hf_flat_to_torch(hf_params), metadata={"format": "pt"}))
  return weights_path
