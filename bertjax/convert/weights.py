"""Loads starting weights for config.init_from: a bertjax checkpoint or a Hugging Face model."""

import os

import jax

from bertjax.model.config import BertConfig
from bertjax.train import checkpoint as ckpt_lib


def load_weights(path: str, abstract_params, model_config: BertConfig):
  """Parameters from `path`, shaped like `abstract_params` (placement included)."""
  if ckpt_lib.is_bertjax_checkpoint(path):
    return ckpt_lib.load_params(path, abstract_params)
  if os.path.exists(os.path.join(path, "config.json")):
    from bertjax.convert import hf  # pylint: disable=g-import-not-at-top
    from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
    params, hf_model_config = hf_files.load_hf_checkpoint(path)
    params = params.get("params", params)
    for field in ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                  "vocab_size", "max_position_embeddings", "type_vocab_size"):
      if getattr(hf_model_config, field) != getattr(model_config, field):
        raise ValueError(
            f"init_from: {path} has {field}={getattr(hf_model_config, field)} but "
            f"--config.model.{field} is {getattr(model_config, field)}")
    if hf_model_config.scan_layers != model_config.scan_layers:
      params = hf.hf_to_bertjax(hf.bertjax_to_hf(params, hf_model_config), model_config)
      params = params.get("params", params)
    return jax.tree.map(lambda x, a: jax.device_put(x.astype(a.dtype), a.sharding),
                        params, abstract_params)
  raise ValueError(f"--config.init_from={path}: neither a bertjax checkpoint (a params/ "
                   "item) nor a Hugging Face model directory (config.json)")
