"""Hugging Face <-> bertjax: weights, configs and model directories.

Three layouts meet here:
  bertjax  {'params': {'bert': ..., 'mlm': ..., 'nsp': ...}} as BertForPreTraining.init
           makes it (plain arrays), layers stacked on a leading axis under
           encoder/layers when scan_layers, else encoder/layer_{i}; attention
           kernels split per head: query/key/value [D, N, H], output [N, H, D].
  HF Flax  FlaxBertForPreTraining.params: {'bert': ..., 'cls': ...} with Dense
           kernels [in, out] and bert/encoder/layer/{i}/...; FlaxBertModel
           has the 'bert' subtree alone at the top.
  PyTorch  BertForPreTraining.state_dict() names, e.g.
           bert.encoder.layer.0.attention.self.query.weight, Linear weights
           [out, in]; what model.safetensors on the Hub holds.

The masked-LM decoder is tied to the word embeddings in all three; its bias is
HF's cls/predictions/bias (cls.predictions.decoder.bias, the same tensor, in
PyTorch state dicts). Shapes: D hidden, F feed-forward, V vocab, P positions,
T segment types, N heads, H head size.

transformers is imported only to build a `transformers.BertConfig`; model
directories are read and written by hf_files.py.
"""

from typing import Any, Mapping

import numpy as np

from bertjax.model.config import BertConfig

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX_NAME = "model.safetensors.index.json"
FLAX_NAME = "flax_model.msgpack"
FLAX_INDEX_NAME = "flax_model.msgpack.index.json"
TORCH_NAME = "pytorch_model.bin"
TORCH_INDEX_NAME = "pytorch_model.bin.index.json"
TF_NAME = "tf_model.h5"
WEIGHT_FILES = (SAFETENSORS_NAME, SAFETENSORS_INDEX_NAME, FLAX_NAME, FLAX_INDEX_NAME,
                TORCH_NAME, TORCH_INDEX_NAME)

Path = tuple[str, ...]

# (bertjax path, HF Flax path, HF shape, head reshape). Paths are relative to
# the encoder model ('bert' in both pretraining layouts) or, for the heads, to
# the top. The reshape is "out" (the last axis D splits into [N, H]) or "in"
# (the first axis D splits into [N, H]).
_EMBEDDINGS_AND_POOLER = (
    (("embeddings", "word_embeddings", "embedding"),
     ("embeddings", "word_embeddings", "embedding"), "VD", None),
    (("embeddings", "position_embeddings", "embedding"),
     ("embeddings", "position_embeddings", "embedding"), "PD", None),
    (("embeddings", "token_type_embeddings", "embedding"),
     ("embeddings", "token_type_embeddings", "embedding"), "TD", None),
    (("embeddings", "layer_norm", "scale"), ("embeddings", "LayerNorm", "scale"), "D", None),
    (("embeddings", "layer_norm", "bias"), ("embeddings", "LayerNorm", "bias"), "D", None),
    (("pooler", "kernel"), ("pooler", "dense", "kernel"), "DD", None),
    (("pooler", "bias"), ("pooler", "dense", "bias"), "D", None),
)
_LAYER = (
    (("attention", "query", "kernel"), ("attention", "self", "query", "kernel"), "DD", "out"),
    (("attention", "query", "bias"), ("attention", "self", "query", "bias"), "D", "out"),
    (("attention", "key", "kernel"), ("attention", "self", "key", "kernel"), "DD", "out"),
    (("attention", "key", "bias"), ("attention", "self", "key", "bias"), "D", "out"),
    (("attention", "value", "kernel"), ("attention", "self", "value", "kernel"), "DD", "out"),
    (("attention", "value", "bias"), ("attention", "self", "value", "bias"), "D", "out"),
    (("attention", "output", "kernel"), ("attention", "output", "dense", "kernel"), "DD", "in"),
    (("attention", "output", "bias"), ("attention", "output", "dense", "bias"), "D", None),
    (("attention_layer_norm", "scale"), ("attention", "output", "LayerNorm", "scale"), "D", None),
    (("attention_layer_norm", "bias"), ("attention", "output", "LayerNorm", "bias"), "D", None),
    (("mlp", "intermediate", "kernel"), ("intermediate", "dense", "kernel"), "DF", None),
    (("mlp", "intermediate", "bias"), ("intermediate", "dense", "bias"), "F", None),
    (("mlp", "output", "kernel"), ("output", "dense", "kernel"), "FD", None),
    (("mlp", "output", "bias"), ("output", "dense", "bias"), "D", None),
    (("output_layer_norm", "scale"), ("output", "LayerNorm", "scale"), "D", None),
    (("output_layer_norm", "bias"), ("output", "LayerNorm", "bias"), "D", None),
)
_HEADS = (
    (("mlm", "output_bias"), ("cls", "predictions", "bias"), "V", None),
    (("mlm", "transform", "kernel"), ("cls", "predictions", "transform", "dense", "kernel"),
     "DD", None),
    (("mlm", "transform", "bias"), ("cls", "predictions", "transform", "dense", "bias"),
     "D", None),
    (("mlm", "transform_layer_norm", "scale"),
     ("cls", "predictions", "transform", "LayerNorm", "scale"), "D", None),
    (("mlm", "transform_layer_norm", "bias"),
     ("cls", "predictions", "transform", "LayerNorm", "bias"), "D", None),
    (("nsp", "kernel"), ("cls", "seq_relationship", "kernel"), "DC", None),
    (("nsp", "bias"), ("cls", "seq_relationship", "bias"), "C", None),
)


def _mapping(config: BertConfig, heads: bool, hf_prefix: Path, bj_prefix: Path):
  """(bertjax path, HF path, HF shape, reshape) for every weight, layers unrolled."""
  for bj, hf, shape, reshape in _EMBEDDINGS_AND_POOLER:
    yield bj_prefix + bj, hf_prefix + hf, shape, reshape
  for i in range(config.num_layers):
    for bj, hf, shape, reshape in _LAYER:
      yield (bj_prefix + ("encoder", f"layer_{i}") + bj,
             hf_prefix + ("encoder", "layer", str(i)) + hf, shape, reshape)
  if heads:  # A model without the next-sentence head (objectives mlm, ltr) has no nsp.
    yield from (h for h in _HEADS if config.next_sentence_head or h[0][0] != "nsp")


def _dims(config: BertConfig) -> dict[str, int]:
  return dict(D=config.hidden_size, F=config.intermediate_size, V=config.vocab_size,
              P=config.max_position_embeddings, T=config.type_vocab_size, C=2)


def _split_heads(x: np.ndarray, reshape, config: BertConfig) -> np.ndarray:
  heads = (config.num_heads, config.head_dim)
  if reshape == "out":
    return x.reshape(x.shape[:-1] + heads)
  if reshape == "in":
    return x.reshape(heads + x.shape[1:])
  return x


def _merge_heads(x: np.ndarray, reshape) -> np.ndarray:
  if reshape == "out":
    return x.reshape(x.shape[:-2] + (-1,))
  if reshape == "in":
    return x.reshape((-1,) + x.shape[2:])
  return x


def flatten(tree, prefix: Path = ()) -> dict[Path, Any]:
  """Nested mappings -> {path tuple: leaf}; Partitioned boxes are opened."""
  if hasattr(tree, "unbox") and not isinstance(tree, Mapping):
    tree = tree.unbox()
  if not isinstance(tree, Mapping):
    return {prefix: tree}
  flat = {}
  for k, v in tree.items():
    flat.update(flatten(v, prefix + (str(k),)))
  return flat


def to_numpy(x, path: Path) -> np.ndarray:
  if getattr(x, "is_fully_addressable", True) is False:
    raise ValueError(f"{'/'.join(path)}: the array spans several hosts; gather the params "
                     "first (jax.experimental.multihost_utils.process_allgather)")
  return np.asarray(x)


def unflatten(flat: Mapping[Path, Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = value
  return tree


def unwrap(tree) -> Mapping:
  if isinstance(tree, Mapping) and set(tree) == {"params"}:
    return tree["params"]
  return tree


def show_paths(paths, limit: int = 8) -> str:
  names = sorted("/".join(p) for p in paths)
  more = f" ... ({len(names) - limit} more)" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def normalise_layer_norm(path: Path) -> Path:
  """LayerNorm gamma/beta (original TF names) or weight -> Flax scale/bias."""
  if len(path) >= 2 and path[-2] == "LayerNorm":
    return path[:-1] + ({"gamma": "scale", "weight": "scale", "beta": "bias"}.get(
        path[-1], path[-1]),)
  return path


def hf_to_bertjax(hf_params, config: BertConfig, *, source: str = "hf_params") -> dict:
  """FlaxBertForPreTraining params -> bertjax {'params': ...} (plain numpy arrays).

  `hf_params` may also be FlaxBertModel's params (the encoder alone, no 'bert'
  prefix); the result is then BertModel's tree. Layers are stacked on a leading
  axis when `config.scan_layers`. Every HF weight must be used and every
  bertjax weight found, else ValueError naming `source` and the weights.
  """
  flat = {normalise_layer_norm(k): to_numpy(v, k)
          for k, v in flatten(unwrap(hf_params)).items()}
  tops = {k[0] for k in flat}
  if "bert" in tops:
    heads, hf_prefix, bj_prefix = True, ("bert",), ("bert",)
  elif "embeddings" in tops:
    heads, hf_prefix, bj_prefix = False, (), ()
  else:
    raise ValueError(f"{source}: neither FlaxBertForPreTraining params (top keys 'bert', "
                     f"'cls') nor FlaxBertModel params ('embeddings', ...); got {sorted(tops)}")
  dims = _dims(config)
  out, missing = {}, []
  for bj, hf, shape, reshape in _mapping(config, heads, hf_prefix, bj_prefix):
    if hf not in flat:
      missing.append(hf)
      continue
    x = flat.pop(hf)
    want = tuple(dims[d] for d in shape)
    if x.shape != want:
      raise ValueError(f"{source}: {'/'.join(hf)} has shape {x.shape} but the model config "
                       f"implies {want} ({describe(config)})")
    out[bj] = _split_heads(x, reshape, config)
  if missing or flat:
    raise ValueError(_key_error(source, config, missing, list(flat)))
  if config.scan_layers:
    out = _stack_layers(out, config.num_layers)
  return {"params": unflatten(out)}


def describe(config: BertConfig) -> str:
  return (f"vocab_size={config.vocab_size}, hidden_size={config.hidden_size}, "
          f"num_layers={config.num_layers}, num_heads={config.num_heads}, "
          f"intermediate_size={config.intermediate_size}, max_position_embeddings="
          f"{config.max_position_embeddings}, type_vocab_size={config.type_vocab_size}")


def _key_error(source, config, missing, unexpected) -> str:
  parts = [f"{source}: the weights do not match a BERT of {describe(config)}."]
  if missing:
    parts.append(f"Missing {len(missing)}: {show_paths(missing)}.")
    if any(p[0] == "cls" for p in missing):
      parts.append("bertjax needs both pretraining heads (cls/predictions and "
                   "cls/seq_relationship); a checkpoint of the encoder alone converts as "
                   "FlaxBertModel params (no 'bert' prefix).")
  if unexpected:
    parts.append(f"Unexpected {len(unexpected)}: {show_paths(unexpected)}.")
    if any(p[-2:] == ("decoder", "kernel") for p in unexpected):
      parts.append("An untied MLM decoder (tie_word_embeddings=False) has no bertjax "
                   "equivalent: bertjax ties it to the word embeddings.")
  return " ".join(parts)


def _stack_layers(flat: dict[Path, np.ndarray], num_layers: int) -> dict[Path, np.ndarray]:
  """encoder/layer_{i}/... -> encoder/layers/... stacked on a new leading axis."""
  out, per_layer = {}, {}
  for path, x in flat.items():
    at = path.index("encoder") + 1 if "encoder" in path else -1
    if at > 0 and path[at].startswith("layer_"):
      per_layer.setdefault(path[:at] + ("layers",) + path[at + 1:], {})[
          int(path[at][len("layer_"):])] = x
    else:
      out[path] = x
  for path, by_index in per_layer.items():
    out[path] = np.stack([by_index[i] for i in range(num_layers)])
  return out


def _unstack_layers(flat: dict[Path, np.ndarray]) -> tuple[dict[Path, np.ndarray], int | None]:
  """The inverse of _stack_layers; also returns the stacked depth (None if unrolled)."""
  out, depth = {}, None
  for path, x in flat.items():
    at = path.index("encoder") + 1 if "encoder" in path else -1
    if at > 0 and path[at] == "layers":
      depth = x.shape[0]
      for i in range(depth):
        out[path[:at] + (f"layer_{i}",) + path[at + 1:]] = x[i]
    else:
      out[path] = x
  return out, depth


def bertjax_to_hf(params, config: BertConfig, *, encoder_only: bool = False) -> dict:
  """bertjax params -> FlaxBertForPreTraining params (numpy); exact inverse of hf_to_bertjax.

  `params` is BertForPreTraining's or BertModel's tree, with or without the
  'params' level and partitioning boxes, scanned or unrolled (read from the
  tree). With `encoder_only`, or from a BertModel tree, returns FlaxBertModel's
  params: the encoder and pooler, for fine-tuning.
  """
  flat = {k: to_numpy(v, k) for k, v in flatten(unwrap(params)).items()}
  flat, depth = _unstack_layers(flat)
  if depth is not None and depth != config.num_layers:
    raise ValueError(f"bertjax_to_hf: the params stack {depth} layers but model.num_layers="
                     f"{config.num_layers}")
  tops = {k[0] for k in flat}
  heads = "bert" in tops
  bj_prefix = ("bert",) if heads else ()
  if not heads and "embeddings" not in tops:
    raise ValueError("bertjax_to_hf: params are neither BertForPreTraining's (top 'bert', "
                     f"'mlm', 'nsp') nor BertModel's ('embeddings', ...); got {sorted(tops)}")
  hf_prefix = () if encoder_only or not heads else ("bert",)
  dims = _dims(config)
  out, missing = {}, []
  for bj, hf, shape, reshape in _mapping(config, heads, hf_prefix, bj_prefix):
    if bj not in flat:
      missing.append(bj)
      continue
    x = _merge_heads(flat.pop(bj), reshape)
    if shape[0] == "V":
      x = x[:dims["V"]]  # Rows past the real vocab are padding (model.padded_vocab_size).
    want = tuple(dims[d] for d in shape)
    if x.shape != want:
      raise ValueError(f"bertjax_to_hf: {'/'.join(bj)} gives HF shape {x.shape} but the model "
                       f"config implies {want} ({describe(config)})")
    if not (encoder_only and hf[0] == "cls"):
      out[hf] = x
  if missing or flat:
    raise ValueError(_key_error("bertjax_to_hf", config, missing, list(flat)))
  return unflatten(out)


# ---------------------------------------------------------------------------
# Configs.

# transformers.BertConfig's defaults, for config.json files that leave fields out.
_HF_DEFAULTS = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
    initializer_range=0.02, layer_norm_eps=1e-12, position_embedding_type="absolute",
    is_decoder=False, add_cross_attention=False, tie_word_embeddings=True, model_type="bert")


def hf_config_to_bertjax(hf_config, **overrides) -> BertConfig:
  """transformers.BertConfig (or a config.json mapping) -> BertConfig.

  `overrides` set bertjax-only fields (dtype, scan_layers, remat_policy, ...)
  or replace converted ones. Refuses architectures bertjax does not compute
  the same way (tanh GELU, relative positions, decoders, untied decoder).
  """
  d = dict(hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config)
  get = lambda k: d.get(k, _HF_DEFAULTS[k])
  checks = (
      ("model_type", "bert", "only BERT converts (not RoBERTa, ELECTRA, ...)"),
      ("hidden_act", "gelu", "bertjax computes the exact (erf) GELU of the original BERT; "
       "another activation would change the model's outputs"),
      ("position_embedding_type", "absolute", "bertjax has learned absolute positions only"),
      ("add_cross_attention", False, "bertjax has no cross-attention"),
      ("tie_word_embeddings", True, "bertjax ties the MLM decoder to the word embeddings"),
  )
  for field, want, why in checks:
    if get(field) != want:
      raise ValueError(f"Hugging Face config: {field}={get(field)!r} is not supported "
                       f"({why}); it must be {want!r}")
  fields = dict(
      vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
      num_layers=get("num_hidden_layers"), num_heads=get("num_attention_heads"),
      intermediate_size=get("intermediate_size"),
      hidden_dropout_rate=float(get("hidden_dropout_prob")),
      attention_dropout_rate=float(get("attention_probs_dropout_prob")),
      max_position_embeddings=get("max_position_embeddings"),
      type_vocab_size=get("type_vocab_size"),
      initializer_range=float(get("initializer_range")),
      layer_norm_eps=float(get("layer_norm_eps")),
      # A decoder's self-attention is causal (BertModel's extended attention mask).
      causal=bool(get("is_decoder")))
  return BertConfig.from_mapping(fields, **overrides)


def hf_config_dict(config: BertConfig, architecture: str) -> dict:
  return dict(
      architectures=[architecture], model_type="bert",
      vocab_size=config.vocab_size, hidden_size=config.hidden_size,
      num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
      intermediate_size=config.intermediate_size, hidden_act="gelu",
      hidden_dropout_prob=config.hidden_dropout_rate,
      attention_probs_dropout_prob=config.attention_dropout_rate,
      max_position_embeddings=config.max_position_embeddings,
      type_vocab_size=config.type_vocab_size, initializer_range=config.initializer_range,
      layer_norm_eps=config.layer_norm_eps, position_embedding_type="absolute",
      tie_word_embeddings=True,
      # A left-to-right model (objective ltr): transformers' BertModel then
      # applies the same causal mask.
      is_decoder=config.causal)


def bertjax_config_to_hf(config: BertConfig, architecture: str = "BertForPreTraining"):
  """BertConfig -> transformers.BertConfig (hidden_act='gelu', the exact GELU)."""
  import transformers  # pylint: disable=g-import-not-at-top
  d = hf_config_dict(config, architecture)
  d.pop("model_type")
  return transformers.BertConfig(**d)
