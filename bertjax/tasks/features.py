"""Text -> model inputs: [CLS] A [SEP] B [SEP] with the project's tokenizer.

The layout of the original release's run_classifier.py: segment 0 for
[CLS] A [SEP], segment 1 for B [SEP], zeros after the last token with
input_mask 0, and pairs longer than max_seq_length trimmed one token at a
time from the longer side (`_truncate_seq_pair`).
"""

from typing import Optional, Sequence

import numpy as np

from bertjax.text.tokenization import Tokenizer


def truncate_pair(a: list[int], b: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
  """Drops tokens from the end of the longer sequence until both fit in max_tokens."""
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    if len(a) > len(b):
      a.pop()
    else:
      b.pop()
  return a, b


def pack(tokenizer: Tokenizer, a: Sequence[int], b: Optional[Sequence[int]],
         max_seq_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(input_ids, input_mask, segment_ids) of one example, truncated and padded."""
  cls, sep = tokenizer.special_ids["cls"], tokenizer.special_ids["sep"]
  if b is None:
    a, b_ids = list(a)[:max_seq_length - 2], []
  else:
    a, b_ids = truncate_pair(a, b, max_seq_length - 3)
  ids = [cls, *a, sep] + ([*b_ids, sep] if b is not None else [])
  segments = [0] * (len(a) + 2) + [1] * (len(ids) - len(a) - 2)
  out = np.zeros((3, max_seq_length), np.int32)
  out[0, :len(ids)] = ids
  out[1, :len(ids)] = 1
  out[2, :len(ids)] = segments
  out[0, len(ids):] = tokenizer.special_ids["pad"]
  return out[0], out[1], out[2]


def encode_pairs(tokenizer: Tokenizer, texts_a: Sequence[str],
                 texts_b: Optional[Sequence[Optional[str]]],
                 max_seq_length: int) -> dict[str, np.ndarray]:
  """input_ids, input_mask, segment_ids [N, max_seq_length] of N single texts or pairs."""
  if max_seq_length < 4:
    raise ValueError(f"max_seq_length must be at least 4, got {max_seq_length}")
  ids_a = tokenizer.encode_batch(list(texts_a))
  if texts_b is None:
    ids_b = [None] * len(ids_a)
  else:
    encoded = iter(tokenizer.encode_batch([t for t in texts_b if t is not None]))
    ids_b = [None if t is None else next(encoded) for t in texts_b]
  rows = [pack(tokenizer, a, b, max_seq_length) for a, b in zip(ids_a, ids_b)]
  names = ("input_ids", "input_mask", "segment_ids")
  if not rows:
    return {n: np.zeros((0, max_seq_length), np.int32) for n in names}
  return {n: np.stack([r[i] for r in rows]) for i, n in enumerate(names)}


def check_vocab(tokenizer: Tokenizer, vocab_size: int, field: str) -> None:
  """The model's vocab must hold every id the tokenizer gives."""
  if tokenizer.vocab_size != vocab_size:
    raise ValueError(
        f"{field}={vocab_size} but the tokenizer's vocab ({tokenizer.path}) has "
        f"{tokenizer.vocab_size} tokens: the checkpoint and the vocab file must belong "
        "together (give the vocab.txt the model was pretrained with)")
