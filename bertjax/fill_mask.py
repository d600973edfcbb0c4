"""Fill-mask and next-sentence predictions from a pretrained BERT.

  python -m bertjax.fill_mask --checkpoint=WORKDIR/checkpoints \\
      --text="The capital of France is [MASK]."
  python -m bertjax.fill_mask --checkpoint=HF_EXPORT_DIR --text="..." --text_b="..."

`--checkpoint` is a bertjax checkpoint (saved on any mesh or topology; it is
read onto this machine's first device) or a Hugging Face BERT directory with
its pretraining heads. The vocab comes from the run's data or the export;
`--vocab_file` overrides it (records that carry no vocab, such as the
original release's, need it). Each [MASK] gets its top-k tokens with their
probabilities; a run of adjacent masks is filled as whole words (left to
right, beam search over the pieces). With --text_b, the pair also gets the
probability that B is A's actual next sentence.
"""

from absl import app
from absl import flags

from bertjax.convert import pretrained_model
from bertjax.train import cli

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A bertjax checkpoints directory (latest step), one step of it, or "
    "a Hugging Face BERT directory.", required=True)
_TEXT = flags.DEFINE_multi_string("text", None, "Text with one or more [MASK]s "
                                  "(repeat the flag for several texts).", required=True)
_TEXT_B = flags.DEFINE_string("text_b", None, "A second sentence: also prints the "
                              "next-sentence probability of (text, text_b).")
_TOP_K = flags.DEFINE_integer("top_k", 5, "Predictions printed per mask.")
_VOCAB = flags.DEFINE_string("vocab_file", None, "vocab.txt to use instead of the run's "
                             "or the export's.")
_LOWER = flags.DEFINE_bool("do_lower_case", None, "Lower-case the text; default: what the "
                           "vocab's data or export says (True when unknown).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  params, config, tokenizer = pretrained_model.load(_CHECKPOINT.value, vocab_file=_VOCAB.value,
                                             do_lower_case=_LOWER.value)
  predictor = pretrained_model.Predictor(params, config, tokenizer)
  for text in _TEXT.value:
    print(text)
    if pretrained_model.MASK in text or _TEXT_B.value is None:
      for n, run in enumerate(predictor.fill_mask(text, _TOP_K.value)):
        print(f"  [MASK] #{n + 1}: " + ", ".join(
            f"{p.text} ({p.probability:.3f})" for p in run))
    if _TEXT_B.value is not None:
      p = predictor.next_sentence_probability(text, _TEXT_B.value)
      print(f"  next sentence {_TEXT_B.value!r}: {p:.3f}")


if __name__ == "__main__":
  cli.run(main)
