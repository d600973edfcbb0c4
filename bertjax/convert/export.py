"""Exports a bertjax checkpoint for other tools' fine-tuning jobs.

  python -m bertjax.convert.export --checkpoint=WORKDIR/checkpoints --output=DIR

reads the checkpoint's latest step (or the step directory given) on this
machine's first device, whatever mesh or topology saved it, local or gs://,
and writes a Hugging Face model directory: config.json and the weights
(--format=safetensors, the default, or flax).
"""

from typing import Any

from absl import app
from absl import flags
import jax
import numpy as np

from bertjax.convert import weights
from bertjax.model.config import BertConfig
from bertjax.train import checkpoint as ckpt_lib

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A bertjax checkpoints directory (its latest step is used) or one "
    "step directory of it; local or gs://.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Output model directory.", required=True)
_FORMAT = flags.DEFINE_enum("format", "safetensors", ["safetensors", "flax"],
                            "Weights format of the exported model.")


def read_checkpoint(path: str, sharding=None) -> tuple[dict[str, Any], BertConfig, dict]:
  """(params as numpy, the model config, the checkpoint's meta) of a checkpoint.

  The parameters are read whole onto `sharding` (default: the first local
  device) from whatever mesh wrote them.
  """
  meta = ckpt_lib.read_meta(path)
  config = weights.checkpoint_config(meta, path)
  params = weights.read_checkpoint_params(path, sharding)
  return jax.tree.map(np.asarray, params), config, meta


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
  params, config, meta = read_checkpoint(_CHECKPOINT.value)
  hf_files.save_hf_checkpoint(params, config, _OUTPUT.value, format=_FORMAT.value)
  print(f"Exported step {meta['step']} ({sum(x.size for x in jax.tree.leaves(params)):,} "
        f"parameters) to {_OUTPUT.value} as {_FORMAT.value}.")


if __name__ == "__main__":
  app.run(main)
