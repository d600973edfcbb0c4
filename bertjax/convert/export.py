"""Exports a bertjax checkpoint for other tools' fine-tuning jobs.

  python -m bertjax.convert.export --checkpoint=WORKDIR/checkpoints --output=DIR \
      [--format=safetensors|flax|tf1] [--vocab_file=vocab.txt] [--do_lower_case=...]

reads the checkpoint's latest step (or the step directory given) on this
machine's first device, whatever mesh or topology saved it, local or gs://,
and writes (local or gs://) either
  * a Hugging Face model directory that `AutoTokenizer` and `AutoModel` /
    `FlaxAutoModel` load as is: config.json, the weights (model.safetensors,
    the default, or flax_model.msgpack with --format=flax), vocab.txt,
    tokenizer_config.json and special_tokens_map.json; or
  * with --format=tf1, the original release's layout (tf1.py):
    bert_model.ckpt.{index,data-*} with the release's variable names,
    bert_config.json and vocab.txt, which its run_classifier.py /
    run_squad.py and Hugging Face's TF-checkpoint converter read.
A fine-tuned checkpoint (BertModel's params under "bert" and a task head)
exports as the matching task model (heads.py): HF's BertForSequence-
Classification, ...ForTokenClassification, ...ForMultipleChoice or
...ForQuestionAnswering with num_labels and id2label, or the release's
run_classifier.py (output_weights) / run_squad.py (cls/squad/...) names;
--head and --labels say what the checkpoint's meta does not. Vocab rows
past model.vocab_size (padding) are not exported. The vocab and
its casing come from the run's data, or a fine-tuning run's record
(run_vocab.py); --vocab_file and --do_lower_case replace them. Nothing is written when the vocab cannot be
found or does not fit the model. A causal (objective ltr) model exports to
Hugging Face only (is_decoder=True), and never as a sequence-classification or
multiple-choice model, which pools its last real token where those classes
pool [CLS] (heads.py).
"""

from typing import Any, Optional

from absl import app
from absl import flags
import jax
import numpy as np

from bertjax.convert import heads
from bertjax.convert import hf
from bertjax.convert import run_vocab
from bertjax.convert import weights
from bertjax.model.config import BertConfig
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import cli

FORMATS = ("safetensors", "flax", "tf1")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A bertjax checkpoints directory (its latest step is used) or one "
    "step directory of it; local or gs://.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Output model directory.", required=True)
_FORMAT = flags.DEFINE_enum(
    "format", "safetensors", FORMATS,
    "safetensors or flax: a Hugging Face model directory with those weights; tf1: the "
    "original release's TF1 checkpoint directory (not for a causal model: the release "
    "has no causal mask).")
_HEAD = flags.DEFINE_enum(
    "head", None, list(heads.HEADS), "A fine-tuned checkpoint's task head; default: as "
    "its meta says (`head.type`), or the one its head's name fits (qa_outputs).")
_LABELS = flags.DEFINE_list(
    "labels", None, "Label names of a classification head, in output order (HF id2label); "
    "default: as the checkpoint's meta says (`head.labels`), else LABEL_0, LABEL_1, ...")
_VOCAB_FILE = flags.DEFINE_string(
    "vocab_file", None, "The WordPiece vocab.txt to export; default: the one the run's data "
    "was created with (found from WORKDIR/config.json and the data's metadata.json), or "
    "the one a fine-tuning run's WORKDIR/config.json names.")
_DO_LOWER_CASE = flags.DEFINE_bool(
    "do_lower_case", None, "Whether the tokenizer lower-cases text; default: as the data's "
    "metadata.json or a fine-tuning run's WORKDIR/config.json says.")


def read_checkpoint(path: str, sharding=None) -> tuple[dict[str, Any], BertConfig, dict]:
  """(params as numpy, the model config, the checkpoint's meta) of a checkpoint.

  The parameters are read whole onto `sharding` (default: the first local
  device) from whatever mesh wrote them.
  """
  meta = ckpt_lib.read_meta(path)
  config = weights.checkpoint_config(meta, path)
  params = weights.read_checkpoint_params(path, sharding)
  return jax.tree.map(np.asarray, params), config, meta


# Top-level parameters of the encoder and the pretraining heads, which every
# export writes (task heads: heads.HEADS).
EXPORTED_KEYS = frozenset({"bert", "mlm", "nsp"})


def export(checkpoint: str, output: str, format: str = "safetensors",  # pylint: disable=redefined-builtin
           vocab_file: Optional[str] = None, do_lower_case: Optional[bool] = None,
           head: Optional[str] = None, labels: Optional[list[str]] = None) -> str:
  """Writes the model directory (module docstring); returns a summary line."""
  if format not in FORMATS:
    raise ValueError(f"--format={format}: not one of {FORMATS}")
  vocab = run_vocab.find_vocab(checkpoint, vocab_file, do_lower_case)
  params, config, meta = read_checkpoint(checkpoint)
  run_vocab.check_fits(vocab, config.vocab_size)
  unexported = sorted(set(hf.unwrap(params)) - EXPORTED_KEYS - {
      h.param for h in heads.HEADS.values()})
  if unexported:
    raise ValueError(
        f"--checkpoint={checkpoint}: its parameters {unexported} have no Hugging Face or "
        "TF1 BERT counterpart (a feature-based tagger's LSTMs and tagger, for one); "
        "export the checkpoint its encoder came from (its run's init_from), or read "
        "the encoder's layers with python -m bertjax.extract_features")
  saved_head = meta.get("head", {})
  head_type = (heads.infer_head(params, head or saved_head.get("type"))
               if heads.is_task_model(params) else None)
  labels = labels or saved_head.get("labels")
  if format == "tf1":
    from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
    hf_params = (heads.task_to_hf(params, config, head_type, keep_pooler=True)
                 if head_type else None)
    tf1.save_tf1_checkpoint(params, config, output, hf_params=hf_params)
    run_vocab.write_vocab(vocab, output)
  else:
    from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
    extra = {"pad_token_id": run_vocab.pad_token_id(vocab)}
    if head_type:
      hf_files.write_hf_model(heads.task_to_hf(params, config, head_type),
                              heads.hf_task_config(config, params, head_type, labels),
                              output, format, extra)
    else:
      hf_files.save_hf_checkpoint(params, config, output, format=format, config_extra=extra)
    run_vocab.write_hf_tokenizer(vocab, output, config.max_position_embeddings)
  return (f"Exported step {meta['step']} ({sum(x.size for x in jax.tree.leaves(params)):,} "
          f"parameters{', ' + head_type + ' head' if head_type else ''}) to {output} as "
          f"{format}, with {vocab.source}.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  print(export(_CHECKPOINT.value, _OUTPUT.value, _FORMAT.value, _VOCAB_FILE.value,
               _DO_LOWER_CASE.value, _HEAD.value, _LABELS.value))


if __name__ == "__main__":
  cli.run(main)
