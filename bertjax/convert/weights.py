"""Starting weights for config.init_from, and the parameters an export writes.

Three sources are read: a bertjax checkpoint (any phase, saved on any mesh
or topology), a Hugging Face BERT directory (config.json), and the original
release's TF1 checkpoint (bert_model.ckpt.* with bert_config.json; tf1.py).
Weights
land in whatever tree the target asks for: BertForPreTraining's or
BertModel's, scanned or unrolled layers, on one device or any mesh, with as
many vocab rows as the target has (model.padded_vocab_size: the rows past
the real vocab are zeros). Fine-tuning reads them through finetuning_loader,
which also sets segment B's token-type row of a checkpoint pretrained on one
segment (objective mlm or ltr), a row that pretraining never trained.
"""

import dataclasses
import functools
import json
import os
from typing import Any, Optional

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from bertjax.convert import hf
from bertjax.convert import run_vocab
from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.train import checkpoint as ckpt_lib

# Fields that must agree between the weights and the model they start.
ARCHITECTURE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                       "intermediate_size", "max_position_embeddings", "type_vocab_size",
                       "causal")
# Leaves with one row per vocab entry (padded to model.padded_vocab_size).
_VOCAB_ROWS = (("word_embeddings", "embedding"), ("mlm", "output_bias"))


def is_bertjax_checkpoint(path: str) -> bool:
  """A checkpoints directory (step subdirectories with params/) or one step of it."""
  if not fileio.isdir(path):
    return False
  if fileio.isdir(os.path.join(path, "params")):
    return True
  return any(name.isdigit() and fileio.isdir(os.path.join(path, name, "params"))
             for name in fileio.listdir(path))


def checkpoint_config(meta: dict[str, Any], path: str) -> BertConfig:
  """The model config a bertjax checkpoint was saved with (its meta's `model`)."""
  if "model" not in meta:
    raise ValueError(f"{path}: the checkpoint's meta has no `model` entry; it was not "
                     "written by bertjax's training loop")
  return BertConfig.from_mapping(meta["model"])


# The original release's checkpoints by directory name and whether their text is
# lower-cased (its tokenization.validate_case_matches_checkpoint).
RELEASE_CASING = {
    "uncased_L-24_H-1024_A-16": True, "uncased_L-12_H-768_A-12": True,
    "multilingual_L-12_H-768_A-12": True, "chinese_L-12_H-768_A-12": True,
    "cased_L-12_H-768_A-12": False, "cased_L-24_H-1024_A-16": False,
    "multi_cased_L-12_H-768_A-12": False}


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
  """What a checkpoint says of the model it holds."""
  model: dict[str, int]  # ARCHITECTURE_FIELDS, as the checkpoint's config has them.
  do_lower_case: Optional[bool]  # None: the checkpoint does not say.
  casing_source: str  # Where do_lower_case was read (for messages).


def _tokenizer_casing(directory: str) -> tuple[Optional[bool], str]:
  path = os.path.join(directory, run_vocab.TOKENIZER_CONFIG_NAME)
  if fileio.exists(path):
    value = json.loads(fileio.read_text(path)).get("do_lower_case")
    if value is not None:
      return bool(value), path
  return None, ""


def checkpoint_settings(path: str) -> CheckpointSettings:
  """The architecture and casing of the weights at `path` (a bertjax checkpoint,
  a Hugging Face directory or a TF1 directory, as load_weights reads them).

  The architecture comes from the bertjax checkpoint's meta, config.json or
  bert_config.json. The casing from a bertjax run's data metadata or
  fine-tuning record, tokenizer_config.json's do_lower_case, or a TF1
  directory named as one of the original release's checkpoints (RELEASE_CASING).
  """
  if is_bertjax_checkpoint(path):
    config = checkpoint_config(ckpt_lib.read_meta(path), path)
    lower = run_vocab.recorded_casing(path)
    source = f"the data or run record of the run that wrote {path}"
  else:
    from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
    if tf1.is_tf1_checkpoint(path):
      directory = os.path.dirname(tf1._prefix(path))  # pylint: disable=protected-access
      config_path = os.path.join(directory, tf1.CONFIG_NAME)
    else:
      directory, config_path = path, os.path.join(path, hf.CONFIG_NAME)
    if not fileio.exists(config_path):
      raise ValueError(f"--config.init_from={path}: no {os.path.basename(config_path)} "
                       "with the model's architecture there")
    try:
      config = hf.hf_config_to_bertjax(json.loads(fileio.read_text(config_path)))
    except (ValueError, TypeError) as e:
      raise ValueError(f"{config_path}: {e}") from None
    lower, source = _tokenizer_casing(directory)
    name = os.path.basename(os.path.normpath(directory))
    if lower is None and name in RELEASE_CASING:
      lower, source = RELEASE_CASING[name], f"the original release's {name}"
  return CheckpointSettings({f: getattr(config, f) for f in ARCHITECTURE_FIELDS}, lower,
                            source)


def read_checkpoint_params(path: str, sharding=None) -> Any:
  """A bertjax checkpoint's parameters, as saved, placed whole by `sharding`.

  The default is the first local device: a checkpoint written on a pod's
  mesh reads on one workstation device. Any other sharding (e.g. replicated
  on a mesh) works the same way; orbax reads each array's saved chunks into
  it whatever the mesh that wrote them.
  """
  sharding = sharding or SingleDeviceSharding(jax.local_devices()[0])
  shapes = ckpt_lib.saved_params_shapes(path)
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), shapes)
  return ckpt_lib.restore_params(path, abstract)


def check_architecture(source: BertConfig, target: BertConfig, path: str) -> None:
  for field in ARCHITECTURE_FIELDS:
    if getattr(source, field) != getattr(target, field):
      raise ValueError(f"init_from: {path} has {field}={getattr(source, field)} but "
                       f"--config.model.{field} is {getattr(target, field)}")


def _shapes(tree) -> dict:
  return {jax.tree_util.keystr(p): tuple(x.shape)
          for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _is_vocab_rows(path: hf.Path) -> bool:
  return any(path[-len(tail):] == tail for tail in _VOCAB_ROWS)


def pad_vocab_rows(params, abstract_params) -> Any:
  """Zero rows appended to the vocab-sized leaves up to the target's row count.

  Only word_embeddings and the MLM output_bias may differ from the target, and
  only by having fewer rows; anything else is an error naming the leaf.
  """
  flat = hf.flatten(hf.unwrap(params))
  targets = hf.flatten(hf.unwrap(abstract_params))
  out = {}
  for path, x in flat.items():
    want = tuple(targets[path].shape) if path in targets else tuple(x.shape)
    if tuple(x.shape) != want:
      if not (_is_vocab_rows(path) and x.shape[1:] == want[1:] and x.shape[0] <= want[0]):
        raise ValueError(f"init_from: {'/'.join(path)} has shape {tuple(x.shape)} but the "
                         f"model needs {want}")
      x = np.concatenate([np.asarray(x), np.zeros((want[0] - x.shape[0],) + want[1:],
                                                  np.asarray(x).dtype)])
    out[path] = x
  return hf.unflatten(out)


def _target_config(model_config: BertConfig, abstract_params) -> BertConfig:
  """model_config with scan_layers as the target tree has it."""
  scanned = any("layers" in p for p in hf.flatten(hf.unwrap(abstract_params)))
  return model_config.replace(scan_layers=scanned)


def fit(params, source_config: BertConfig, abstract_params, model_config: BertConfig):
  """bertjax params of `source_config` -> the target's tree, rows and placement."""
  target_is_encoder = "embeddings" in hf.unwrap(abstract_params)
  as_hf = hf.bertjax_to_hf(params, source_config, encoder_only=target_is_encoder)
  converted = hf.hf_to_bertjax(as_hf, _target_config(model_config, abstract_params),
                               source="init_from")["params"]
  converted = pad_vocab_rows(converted, abstract_params)
  return place(converted, abstract_params)


def place(params, abstract_params) -> Any:
  """numpy params -> arrays of the target's dtypes on the target's shardings."""
  flat_target = hf.flatten(hf.unwrap(abstract_params))
  flat = hf.flatten(params)
  if set(flat) != set(flat_target):
    raise ValueError("init_from: the converted weights do not fit the model: missing "
                     f"{hf.show_paths(set(flat_target) - set(flat))}, unexpected "
                     f"{hf.show_paths(set(flat) - set(flat_target))}")
  placed = {p: jax.device_put(np.asarray(x).astype(flat_target[p].dtype),
                              flat_target[p].sharding) for p, x in flat.items()}
  tree = hf.unflatten(placed)
  return {"params": tree} if set(abstract_params) == {"params"} else tree


def _replicated_like(abstract_params):
  """A replicated sharding on the mesh of the target (or its one device)."""
  sharding = jax.tree.leaves(abstract_params)[0].sharding
  if isinstance(sharding, NamedSharding):
    return NamedSharding(sharding.mesh, PartitionSpec())
  return sharding


def load_bertjax_checkpoint(path: str, abstract_params, model_config: BertConfig):
  """A bertjax checkpoint's parameters in the target's tree and placement.

  When the saved tree is the target's (same layer stacking and vocab rows),
  orbax reads each shard straight into its place on the target's mesh.
  Otherwise the parameters are read whole (replicated on the target's mesh)
  and converted.
  """
  meta = ckpt_lib.read_meta(path)
  source_config = checkpoint_config(meta, path)
  check_architecture(source_config, model_config, path)
  if _shapes(ckpt_lib.saved_params_shapes(path)) == _shapes(abstract_params):
    return ckpt_lib.restore_params(path, abstract_params)
  params = read_checkpoint_params(path, _replicated_like(abstract_params))
  # Replicated: every process holds the whole value, also on several hosts.
  host = jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), params)
  return fit(host, source_config, abstract_params, model_config)


def load_weights(path: str, abstract_params, model_config: BertConfig):
  """Parameters from `path`, shaped and placed like `abstract_params`.

  `abstract_params` is BertForPreTraining's or BertModel's tree of
  jax.ShapeDtypeStructs with shardings, as the training loop builds it.
  """
  if is_bertjax_checkpoint(path):
    return load_bertjax_checkpoint(path, abstract_params, model_config)
  from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
  encoder_only = "embeddings" in hf.unwrap(abstract_params)
  if tf1.is_tf1_checkpoint(path):
    params, source_config = tf1.load_tf1_checkpoint(path, encoder_only=encoder_only)
  elif fileio.exists(os.path.join(path, hf.CONFIG_NAME)):
    from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
    params, source_config = hf_files.load_hf_checkpoint(path, encoder_only=encoder_only)
  else:
    raise ValueError(f"--config.init_from={path}: neither a bertjax checkpoint (a params/ "
                     "item), a Hugging Face model directory (config.json) nor an original "
                     "BERT TF1 checkpoint (bert_model.ckpt.index with bert_config.json)")
  check_architecture(source_config, model_config, path)
  return fit(params, source_config, abstract_params, model_config)


# Objectives whose records hold one segment (FULL-SENTENCES rows, every segment id 0:
# records/schema.py), so that pretraining trains segment A's token-type row only.
ONE_SEGMENT_OBJECTIVES = ("mlm", "ltr")
# What a fine-tuning run starts segment B's token-type row from when init_from was
# pretrained on one segment (config.segment_b_init): segment A's row, zeros, or the
# row as saved (its random initial values).
SEGMENT_B_INITS = ("copy_a", "zeros", "keep")
_TOKEN_TYPE_TABLE = ("embeddings", "token_type_embeddings", "embedding")
# How many runs back a chain of init_from is followed.
_MAX_INIT_CHAIN = 4


def one_segment_objective(path: str, depth: int = 0) -> Optional[str]:
  """The objective (mlm or ltr) of the pretraining run that wrote the bertjax
  checkpoint at `path` when it trained one segment only: its run record
  (WORKDIR/config.json beside the checkpoints) names a one-segment objective,
  and so does every run its init_from chain started from. None for any other
  weights (an mlm+nsp run, a fine-tuning run, a Hugging Face or TF1 directory,
  a checkpoint without its run record)."""
  if depth > _MAX_INIT_CHAIN or not is_bertjax_checkpoint(path):
    return None
  _, record = run_vocab._run_record(path)  # pylint: disable=protected-access
  objective = record.get("objective")
  if objective not in ONE_SEGMENT_OBJECTIVES:
    return None
  init_from = record.get("init_from")
  if init_from and one_segment_objective(init_from, depth + 1) is None:
    return None  # Started from weights whose segment rows were trained.
  return objective


def fill_segment_rows(params, segment_b_init: str) -> Any:
  """`params` (an encoder's or BertForPreTraining's) with every token-type row past
  segment A's set to segment A's row (copy_a) or to zeros (zeros), each table placed
  as it was; keep returns them as they are."""
  if segment_b_init == "keep":
    return params
  fill = jax.jit(functools.partial(_filled_table, segment_b_init=segment_b_init))
  return jax.tree_util.tree_map_with_path(
      lambda path, x: fill(x) if _is_token_type_table(path) else x, params)


def _is_token_type_table(path) -> bool:
  keys = tuple(str(getattr(k, "key", k)) for k in path)
  return keys[-len(_TOKEN_TYPE_TABLE):] == _TOKEN_TYPE_TABLE


def _filled_table(table_TxD, segment_b_init: str):
  """The table with rows 1.. set to row 0 (copy_a) or to zeros (zeros)."""
  row_D = table_TxD[0] if segment_b_init == "copy_a" else jnp.zeros_like(table_TxD[0])
  return table_TxD.at[1:].set(row_D)


def load_for_finetuning(path: str, abstract_params, model_config: BertConfig, *,
                        segment_b_init: str):
  """load_weights, then segment B's token-type row by `segment_b_init` when the
  weights were pretrained on one segment (one_segment_objective); other weights are
  left as they are. Logs what it did."""
  params = load_weights(path, abstract_params, model_config)
  objective = one_segment_objective(path)
  if objective is None or model_config.type_vocab_size < 2:
    return params
  if segment_b_init == "keep":
    logging.warning("%s was pretrained with objective %s on one segment: segment B's "
                    "token-type row, never trained, keeps its random initial values "
                    "(--config.segment_b_init=keep).", path, objective)
  else:
    logging.info("%s was pretrained with objective %s on one segment: segment B's "
                 "token-type row, never trained, starts %s (--config.segment_b_init=%s).",
                 path, objective,
                 "as a copy of segment A's" if segment_b_init == "copy_a" else "at zeros",
                 segment_b_init)
  return fill_segment_rows(params, segment_b_init)


def finetuning_loader(segment_b_init: str):
  """The weights loader of fine-tuning runs (tasks.loop.WeightsLoader):
  load_for_finetuning with `segment_b_init` (config.segment_b_init)."""
  if segment_b_init not in SEGMENT_B_INITS:
    raise ValueError(f"--config.segment_b_init={segment_b_init!r}: must be one of "
                     f"{SEGMENT_B_INITS}")
  return functools.partial(load_for_finetuning, segment_b_init=segment_b_init)
