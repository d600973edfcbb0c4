"""Exports a bertjax checkpoint as a Hugging Face BERT model directory for fine-tuning.

  python -m bertjax.convert.export --checkpoint=WORKDIR/checkpoints --output=DIR

writes config.json and the weights (safetensors by default, or Flax msgpack),
which transformers' BertForPreTraining / BertModel and friends load.
"""

import json
import os

from absl import app
from absl import flags
import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax.model.config import BertConfig

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A bertjax checkpoints directory (its latest step is used) or one "
    "step directory of it.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Output model directory.", required=True)
_FORMAT = flags.DEFINE_enum("format", "safetensors", ["safetensors", "flax"],
                            "Weights format of the exported model.")


def step_dir(path: str) -> str:
  """`path` itself if it is one step of a checkpoint, else its latest step."""
  if os.path.isdir(os.path.join(path, "params")):
    return path
  steps = sorted(int(d) for d in os.listdir(path)
                 if d.isdigit() and os.path.isdir(os.path.join(path, d, "params")))
  if not steps:
    raise ValueError(f"--checkpoint={path}: no bertjax checkpoint (params/) found there")
  return os.path.join(path, str(steps[-1]))


def read_checkpoint(path: str) -> tuple[dict, BertConfig, dict]:
  """(params as numpy, the model config, the checkpoint's meta) of a checkpoint."""
  d = step_dir(path)
  meta_path = os.path.join(d, "meta", "metadata")
  if not os.path.exists(meta_path):
    candidates = [os.path.join(d, "meta", f) for f in os.listdir(os.path.join(d, "meta"))]
    meta_path = next(p for p in candidates if os.path.isfile(p))
  with open(meta_path, encoding="utf-8") as f:
    meta = json.load(f)
  if "model" not in meta:
    raise ValueError(f"{meta_path}: no model config in the checkpoint's meta")
  config = BertConfig(**meta["model"])
  with ocp.StandardCheckpointer() as ckptr:
    params = ckptr.restore(os.path.join(d, "params"))
  return jax.tree.map(np.asarray, params), config, meta


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
  params, config, meta = read_checkpoint(_CHECKPOINT.value)
  hf_files.save_hf_checkpoint(params, config, _OUTPUT.value, format=_FORMAT.value)
  print(f"Exported step {meta.get('step')} ({sum(x.size for x in jax.tree.leaves(params)):,} "
        f"parameters) to {_OUTPUT.value} as {_FORMAT.value}.")


if __name__ == "__main__":
  app.run(main)
