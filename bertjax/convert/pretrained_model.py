"""Fill-mask and next-sentence predictions from a pretrained model on this machine.

`Predictor` runs BertForPreTraining's heads on the first local device;

`load` reads what `python -m bertjax.fill_mask` and the notebook take: a
bertjax checkpoint (saved on any mesh or topology: read onto the first
local device) or a Hugging Face BERT directory, and finds the vocab the
model was trained with: the run's data for a checkpoint (run_vocab.py), the
directory's vocab.txt and tokenizer_config.json for an export.
`load_encoder` reads the encoder alone for `python -m bertjax.extract_features`,
from those two or the original release's TF1 checkpoint.
"""

import dataclasses
import json
import math
import os
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.convert import hf
from bertjax.convert import run_vocab
from bertjax.convert import weights
from bertjax.model.bert import BertForPreTraining, BertModel
from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.train import checkpoint as ckpt_lib

MASK = "[MASK]"
from bertjax.text import tokenization


def _hf_vocab(directory: str, vocab_file: Optional[str],
              do_lower_case: Optional[bool], default_lower_case: bool = True
              ) -> run_vocab.Vocab:
  path = vocab_file or os.path.join(directory, run_vocab.VOCAB_NAME)
  if not fileio.exists(path):
    raise ValueError(f"--vocab_file: {directory} has no {run_vocab.VOCAB_NAME}; pass the "
                     "vocab.txt the model was trained with")
  if do_lower_case is None:
    config_path = os.path.join(directory, run_vocab.TOKENIZER_CONFIG_NAME)
    settings = json.loads(fileio.read_text(config_path)) if fileio.exists(config_path) else {}
    do_lower_case = settings.get("do_lower_case", default_lower_case)
  return run_vocab.Vocab(tuple(tokenization.read_vocab(path)), bool(do_lower_case), path)


def load_encoder(path: str, vocab_file: Optional[str] = None,
                 do_lower_case: Optional[bool] = None
                 ) -> tuple[dict, BertConfig, tokenization.WordPieceTokenizer]:
  """(BertModel's params on the first local device, the model config computing
  in fp32, tokenizer)
  of a bertjax checkpoint (pretraining or fine-tuning), a Hugging Face BERT
  directory (heads optional) or the original release's TF1 checkpoint.

  The vocab is the run's (bertjax: run_vocab.find_vocab, which also finds the
  casing) or the directory's vocab.txt; a directory's casing is
  `do_lower_case`, else what it records (tokenizer_config.json or an original
  release's directory name), else lower-cased, as the original release's
  extract_features.py defaults.
  """
  if weights.is_bertjax_checkpoint(path):
    # Pretraining and fine-tuning trees alike hold BertModel's tree under "bert".
    config = weights.checkpoint_config(ckpt_lib.read_meta(path), path).replace(
        dtype="float32", attention_impl="auto")
    params = weights.read_checkpoint_params(path)  # Onto the first local device.
    if "bert" not in params:
      raise ValueError(f"--checkpoint={path}: the checkpoint's parameters have no encoder "
                       f"('bert'), only {sorted(params)}")
    params = params["bert"]
    vocab = run_vocab.find_vocab(path, vocab_file, do_lower_case)
  else:
    from bertjax.convert import tf1  # pylint: disable=g-import-not-at-top
    settings = weights.checkpoint_settings(path)
    config = BertConfig(**settings.model)
    shapes = jax.eval_shape(lambda: nn.unbox(BertModel(config).init(
        jax.random.key(0), *(jnp.zeros((1, 8), jnp.int32),) * 3)["params"]))
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes)
    params = weights.load_weights(path, abstract, config)
    directory = (os.path.dirname(tf1._prefix(path))  # pylint: disable=protected-access
                 if tf1.is_tf1_checkpoint(path) else path)
    recorded = settings.do_lower_case
    vocab = _hf_vocab(directory, vocab_file, do_lower_case,
                      True if recorded is None else recorded)
  run_vocab.check_fits(vocab, config.vocab_size)
  tokenizer = tokenization.WordPieceTokenizer(vocab.source, vocab.do_lower_case,
                                              tokens=vocab.tokens)
  return params, config, tokenizer


def load(path: str, vocab_file: Optional[str] = None, do_lower_case: Optional[bool] = None
         ) -> tuple[dict, BertConfig, tokenization.WordPieceTokenizer]:
  """(params as numpy, the model config, the tokenizer) of a checkpoint or HF directory."""
  if weights.is_bertjax_checkpoint(path):
    config = weights.checkpoint_config(ckpt_lib.read_meta(path), path)
    params = weights.read_checkpoint_params(path)  # Onto the first local device.
    vocab = run_vocab.find_vocab(path, vocab_file, do_lower_case)
  elif fileio.exists(os.path.join(path, hf.CONFIG_NAME)):
    from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
    try:
      params, config = hf_files.load_hf_checkpoint(path)
    except ValueError as e:
      if "no pretraining heads" in str(e):
        raise ValueError(f"--checkpoint={path}: the model has no masked-LM and "
                         "next-sentence heads (cls.*), which fill-mask needs; export a "
                         "pretraining checkpoint") from None
      raise
    params = hf.unwrap(params)
    vocab = _hf_vocab(path, vocab_file, do_lower_case)
  else:
    raise ValueError(f"--checkpoint={path}: neither a bertjax checkpoint (a params/ item) "
                     "nor a Hugging Face model directory (config.json)")
  run_vocab.check_fits(vocab, config.vocab_size)
  tokenizer = tokenization.WordPieceTokenizer(vocab.source, vocab.do_lower_case, tokens=vocab.tokens)
  return dict(params), config, tokenizer


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
