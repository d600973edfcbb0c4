"""Fill-mask and next-sentence predictions from a pretrained BERT.

  python -m bertjax.predict --checkpoint=WORKDIR/checkpoints \\
      --text="The capital of France is [MASK]."
  python -m bertjax.predict --checkpoint=HF_EXPORT_DIR --text="..." --text_b="..."

`--checkpoint` is a bertjax checkpoint (saved on any mesh or topology; it is
read onto this machine's first device) or a Hugging Face BERT directory with
its pretraining heads. The vocab comes from the run's data or the export;
`--vocab_file` overrides it (records that carry no vocab, such as the
original release's, need it). Each [MASK] gets its top-k tokens with their
probabilities; a run of adjacent masks is filled as whole words (left to
right, beam search over the pieces). With --text_b, the pair also gets the
probability that B is A's actual next sentence.
"""

import dataclasses
import math
from typing import Callable, Optional, Sequence

from absl import app
from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.bert import BertForPreTraining
from bertjax.model.config import BertConfig

MASK = "[MASK]"

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


@dataclasses.dataclass(frozen=True)
class Prediction:
  text: str  # The word or piece (pieces starting with ## continue a word).
  probability: float
  ids: tuple[int, ...]  # The token ids filled in.


class Predictor:
  """A pretrained model with its tokenizer, on the first local device."""

  def __init__(self, params, config: BertConfig, tokenizer):
    if "mlm" not in params or "nsp" not in params:
      raise ValueError("the checkpoint has no masked-LM and next-sentence heads (only "
                       f"{sorted(params)}): fill-mask needs a pretraining checkpoint or "
                       "an export of one")
    self.config, self.tokenizer = config, tokenizer
    self.params = jax.device_put(params, jax.local_devices()[0])
    model = BertForPreTraining(config)
    self._apply: Callable = jax.jit(lambda p, ids, mask, seg, pos: model.apply(
        {"params": p}, ids, mask, seg, pos, deterministic=True))

  @classmethod
  def from_random_init(cls, config: BertConfig, tokenizer, seed: int = 0) -> "Predictor":
    """An untrained model, to compare with: its guesses are close to uniform."""
    ones = jnp.ones((1, 8), jnp.int32)
    variables = BertForPreTraining(config).init(jax.random.key(seed), ones, ones, ones * 0,
                                                ones[:, :1])
    return cls(nn.unbox(variables)["params"], config, tokenizer)

  def encode(self, text: str, text_b: Optional[str] = None):
    """[CLS] A [SEP] (B [SEP]) ids, segment ids, and the positions of A's masks."""
    special = self.tokenizer.special_ids
    ids = [special["cls"]]
    masks = []
    for i, part in enumerate(text.split(MASK)):
      if i:
        masks.append(len(ids))
        ids.append(special["mask"])
      ids += self.tokenizer.encode(part) if part.strip() else []
    ids.append(special["sep"])
    segments = [0] * len(ids)
    if text_b is not None:
      b = self.tokenizer.encode(text_b) + [special["sep"]]
      ids, segments = ids + b, segments + [1] * len(b)
    limit = self.config.max_position_embeddings
    if len(ids) > limit:
      raise ValueError(f"--text: {len(ids)} tokens with [CLS] and [SEP], more than the "
                       f"model's position table (max_position_embeddings={limit})")
    return ids, segments, masks

  def _run(self, ids, segments, positions):
    length = max(8, 1 << (len(ids) - 1).bit_length())  # Few shapes, few compiles.
    length = min(length, self.config.max_position_embeddings)
    pad = length - len(ids)
    arr = lambda x: jnp.asarray([list(x) + [0] * pad], jnp.int32)
    pos = list(positions) or [0]
    out = self._apply(self.params, arr(ids), arr([1] * len(ids)), arr(segments),
                      jnp.asarray([pos], jnp.int32))
    logits = np.asarray(out["mlm_logits"][0], np.float64)[:, :self.tokenizer.vocab_size]
    return _log_softmax(logits), _log_softmax(np.asarray(out["nsp_logits"][0], np.float64))

  def fill_mask(self, text: str, top_k: int = 5) -> list[list[Prediction]]:
    """Per run of adjacent [MASK]s, the top_k fillings with their probabilities.

    A single mask gets the model's top tokens. A run of n masks gets the best
    n-piece fillings that read as one word or words (beam search, left to
    right, each piece predicted with the pieces before it filled in).
    """
    ids, segments, masks = self.encode(text)
    if not masks:
      raise ValueError(f"--text={text!r} has no {MASK} to fill")
    results = []
    for run in _runs(masks):
      if len(run) == 1:
        log_p, _ = self._run(ids, segments, run)
        best = np.argsort(-log_p[0])[:top_k]
        results.append([Prediction(self.tokenizer.tokens[i], math.exp(log_p[0][i]),
                                   (int(i),)) for i in best])
      else:
        results.append(self._fill_run(ids, segments, run, top_k))
    return results

  def _fill_run(self, ids, segments, run, top_k):
    beams = [(0.0, list(ids))]
    for k, position in enumerate(run):
      candidates = []
      for score, beam_ids in beams:
        log_p, _ = self._run(beam_ids, segments, [position])
        allowed = log_p[0].copy()
        if k == 0:  # A filling starts a word; later pieces may continue it.
          allowed[~np.asarray(self.tokenizer.is_word_start)] = -np.inf
        for i in np.argsort(-allowed)[:top_k]:
          filled = list(beam_ids)
          filled[position] = int(i)
          candidates.append((score + allowed[i], filled))
      beams = sorted(candidates, key=lambda c: -c[0])[:top_k]
    fillings = [(score, tuple(b[p] for p in run)) for score, b in beams]
    return [Prediction(_join(self.tokenizer.convert_ids_to_tokens(ids)), math.exp(score), ids)
            for score, ids in fillings]

  def next_sentence_probability(self, text_a: str, text_b: str) -> float:
    """P(text_b is text_a's actual next sentence), from the NSP head."""
    ids, segments, masks = self.encode(text_a, text_b)
    _, nsp = self._run(ids, segments, masks[:1])
    return math.exp(nsp[0])  # Class 0 = actual next sentence.


def _log_softmax(x):
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _runs(positions: Sequence[int]) -> list[list[int]]:
  runs: list[list[int]] = []
  for p in positions:
    if runs and runs[-1][-1] == p - 1:
      runs[-1].append(p)
    else:
      runs.append([p])
  return runs


def _join(pieces: Sequence[str]) -> str:
  text = ""
  for piece in pieces:
    text += piece[2:] if piece.startswith("##") else (" " if text else "") + piece
  return text


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from bertjax.convert import inference  # pylint: disable=g-import-not-at-top
  params, config, tokenizer = inference.load(_CHECKPOINT.value, vocab_file=_VOCAB.value,
                                             do_lower_case=_LOWER.value)
  predictor = Predictor(params, config, tokenizer)
  for text in _TEXT.value:
    print(text)
    if MASK in text or _TEXT_B.value is None:
      for n, run in enumerate(predictor.fill_mask(text, _TOP_K.value)):
        print(f"  [MASK] #{n + 1}: " + ", ".join(
            f"{p.text} ({p.probability:.3f})" for p in run))
    if _TEXT_B.value is not None:
      p = predictor.next_sentence_probability(text, _TEXT_B.value)
      print(f"  next sentence {_TEXT_B.value!r}: {p:.3f}")


if __name__ == "__main__":
  app.run(main)
