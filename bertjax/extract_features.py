"""Per-token features (hidden layers) of a pretrained BERT, as the original release's
extract_features.py writes them:

  python -m bertjax.extract_features --checkpoint=CKPT --input_file=input.txt \\
      --output_file=features.jsonl --layers=-1,-2,-3,-4 --max_seq_length=128 \\
      --batch_size=8

--checkpoint is a bertjax checkpoint (pretraining or fine-tuning), a Hugging
Face BERT directory or the original release's TF1 checkpoint directory
(bert_model.ckpt.* with bert_config.json and vocab.txt). Each input line is
"text_a" or "text_a ||| text_b". --output_format=json writes the release's
JSON lines; npy writes OUTPUT.npy (float32 [N, max_seq_length, K, D]) and
OUTPUT.tokens.jsonl (bertjax/tasks/extract.py has the layouts).
"""

from absl import app
from absl import flags
from absl import logging

from bertjax.convert import pretrained_model
from bertjax.tasks import extract
from bertjax.train import cli

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A bertjax checkpoints directory (latest step) or one step of it, "
    "a Hugging Face BERT directory, or a TF1 checkpoint directory or prefix.", required=True)
_INPUT = flags.DEFINE_string("input_file", None, "One example a line: text_a, or "
                             "text_a ||| text_b.", required=True)
_OUTPUT = flags.DEFINE_string("output_file", None, "JSON lines (json), or the .npy path "
                              "(npy; OUTPUT.tokens.jsonl goes beside it).", required=True)
_LAYERS = flags.DEFINE_string("layers", "-1,-2,-3,-4", "Comma-separated layer indexes: "
                              "0 is the first layer's output, -1 the last's.")
_MAX_SEQ = flags.DEFINE_integer("max_seq_length", 128, "Tokens per example with [CLS] and "
                                "[SEP]; longer examples are truncated.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Examples per forward pass.")
_FORMAT = flags.DEFINE_enum("output_format", "json", ["json", "npy"], "json: the original "
                            "release's JSON lines; npy: a padded float32 array and tokens.")
_VOCAB = flags.DEFINE_string("vocab_file", None, "vocab.txt to use instead of the "
                             "checkpoint's.")
_LOWER = flags.DEFINE_bool("do_lower_case", None, "Lower-case the text; default: what the "
                           "checkpoint records, else (Hugging Face, TF1) True as in the "
                           "original release.")


def _layers(text: str) -> list[int]:
  try:
    layers = [int(x) for x in text.split(",")]
  except ValueError:
    raise app.UsageError(f"--layers={text!r}: give comma-separated integers, e.g. "
                         "-1,-2,-3,-4") from None
  return layers


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  layers = _layers(_LAYERS.value)
  params, config, tokenizer = pretrained_model.load_encoder(
      _CHECKPOINT.value, vocab_file=_VOCAB.value, do_lower_case=_LOWER.value)
  if _MAX_SEQ.value > config.max_position_embeddings:
    raise app.UsageError(f"--max_seq_length={_MAX_SEQ.value} exceeds the model's "
                         f"max_position_embeddings={config.max_position_embeddings}")
  extract.layer_positions(layers, config.num_layers)
  examples = extract.read_examples(_INPUT.value)
  encoded = extract.encode(tokenizer, examples, _MAX_SEQ.value)
  extractor = extract.Extractor(params, config, layers)
  if _FORMAT.value == "json":
    extract.write_json(_OUTPUT.value, extractor, examples, encoded, _BATCH.value)
    logging.info("Wrote %d examples to %s.", len(examples), _OUTPUT.value)
  else:
    paths = extract.write_npy(_OUTPUT.value, extractor, examples, encoded, _BATCH.value)
    logging.info("Wrote %d examples to %s and %s.", len(examples), *paths)


if __name__ == "__main__":
  cli.run(main)
