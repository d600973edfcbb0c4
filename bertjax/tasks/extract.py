"""Per-token hidden states of a pretrained BERT, as the original release's extract_features.py.

Input: one example a line, "text_a" or "text_a ||| text_b" (the release's
regex `^(.*) \\|\\|\\| (.*)$` after stripping the line), every line an example
(a blank one included), numbered from 0 in file order. Each is tokenized as
[CLS] A [SEP] (B [SEP]), truncated as the release does (A alone to
max_seq_length - 2 tokens; a pair trimmed from the longer side to
max_seq_length - 3); a B that is empty or has no tokens is left out.

`layers` index the encoder's layer outputs as the release's
get_all_encoder_layers() does: 0 is the first layer's output, -1 the last's
(transformers' hidden_states[i + 1] for i >= 0, hidden_states[i] for i < 0).

Outputs (write_json, NpyWriter):
  json  one line per example, the release's structure and rounding:
        {"linex_index": i, "features": [{"token": "[CLS]", "layers":
        [{"index": -1, "values": [...D floats, 6 decimals]}, ...]}, ...]}
  npy   OUTPUT.npy: float32 [N, max_seq_length, K, D], K = len(layers) in
        their given order, zeros past each example's tokens (not rounded);
        OUTPUT.tokens.jsonl: {"linex_index": i, "tokens": [...]} per line,
        so example i's length is len(tokens). Written through a memory map,
        one batch at a time.
"""

import dataclasses
import json
import re
from typing import Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model import feature_based
from bertjax.model.bert import BertModel
from bertjax.model.config import BertConfig
from bertjax.records import fileio
from bertjax.tasks import features as features_lib

_PAIR = re.compile(r"^(.*) \|\|\| (.*)$")


@dataclasses.dataclass(frozen=True)
class Example:
  index: int  # The line's number from 0 (the release's unique_id).
  text_a: str
  text_b: Optional[str]


def read_examples(path: str) -> list[Example]:
  """Every line of `path` as an Example, as the release's read_examples."""
  examples = []
  for i, line in enumerate(fileio.read_text(path).splitlines()):
    line = line.strip()
    m = _PAIR.match(line)
    examples.append(Example(i, line, None) if m is None else Example(i, m.group(1), m.group(2)))
  return examples


@dataclasses.dataclass
class Encoded:
  tokens: list[list[str]]  # Per example, [CLS] ... [SEP] as the model reads them.
  arrays: dict[str, np.ndarray]  # input_ids, input_mask, segment_ids [N, max_seq_length].


def encode(tokenizer, examples: Sequence[Example], max_seq_length: int) -> Encoded:
  """Model inputs and token strings, truncated as the release truncates."""
  if max_seq_length < 4:
    raise ValueError(f"--max_seq_length must be at least 4, got {max_seq_length}")
  ids_a = tokenizer.encode_batch([e.text_a for e in examples])
  texts_b = [e.text_b for e in examples if e.text_b]
  encoded_b = iter(tokenizer.encode_batch(texts_b))
  rows, tokens = [], []
  for e, a in zip(examples, ids_a):
    b = next(encoded_b) if e.text_b else None
    row = features_lib.pack(tokenizer, a, b or None, max_seq_length)
    rows.append(row)
    tokens.append(tokenizer.convert_ids_to_tokens(row[0][:int(row[1].sum())].tolist()))
  names = ("input_ids", "input_mask", "segment_ids")
  arrays = {n: (np.stack([r[i] for r in rows]) if rows
                else np.zeros((0, max_seq_length), np.int32)) for i, n in enumerate(names)}
  return Encoded(tokens, arrays)


def layer_positions(layers: Sequence[int], num_layers: int) -> list[int]:
  """Indices into BertModel.hidden_states (embeddings first) of the release's layer indexes."""
  try:
    return [feature_based.hidden_state_index(i, num_layers) for i in layers]
  except ValueError as e:
    raise ValueError(f"--layers: {e}") from None


class Extractor:
  """The chosen layers' outputs, [B, L, K, D] fp32 per batch, on the first local device."""

  def __init__(self, params, config: BertConfig, layers: Sequence[int]):
    self.config = config
    self.layers = list(layers)
    self.params = jax.device_put(params, jax.local_devices()[0])
    model = BertModel(config)
    take = jnp.asarray(layer_positions(self.layers, config.num_layers))

    def run(p, ids, mask, segments):
      states_NxBxLxD = model.apply({"params": p}, ids, mask, segments,
                                   method=BertModel.hidden_states)
      return jnp.transpose(states_NxBxLxD[take], (1, 2, 0, 3)).astype(jnp.float32)
    self._run = jax.jit(run)

  def batches(self, arrays: dict[str, np.ndarray], batch_size: int
              ) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, [rows, L, K, D]) per batch; every batch has batch_size rows
    on the device (one compile), the last one cut to the rows there are."""
    if batch_size <= 0:
      raise ValueError(f"--batch_size must be positive, got {batch_size}")
    n = len(arrays["input_ids"])
    for start in range(0, n, batch_size):
      rows = np.arange(start, start + batch_size)
      rows = np.where(rows < n, rows, n - 1)  # The last batch repeats its last row.
      x = [arrays[k][rows] for k in ("input_ids", "input_mask", "segment_ids")]
      out = np.asarray(self._run(self.params, *x))
      yield start, out[:min(batch_size, n - start)]


def _json_line(index: int, tokens: list[str], layers: Sequence[int],
               values_LxKxD: np.ndarray) -> str:
  """One example in the release's layout (its key names and 6-decimal rounding)."""
  features = []
  for t, token in enumerate(tokens):
    all_layers = [{"index": layer, "values": [round(float(x), 6) for x in values_LxKxD[t, k]]}
                  for k, layer in enumerate(layers)]
    features.append({"token": token, "layers": all_layers})
  return json.dumps({"linex_index": index, "features": features})


def write_json(output_file: str, extractor: Extractor, examples: Sequence[Example],
               encoded: Encoded, batch_size: int) -> None:
  with fileio.open_text(output_file, "w") as f:
    for start, out_BxLxKxD in extractor.batches(encoded.arrays, batch_size):
      for r, values in enumerate(out_BxLxKxD):
        i = start + r
        f.write(_json_line(examples[i].index, encoded.tokens[i], extractor.layers,
                           values) + "\n")


def npy_paths(output_file: str) -> tuple[str, str]:
  """(features .npy, tokens .jsonl) for --output_file."""
  stem = output_file[:-len(".npy")] if output_file.endswith(".npy") else output_file
  return stem + ".npy", stem + ".tokens.jsonl"


def write_npy(output_file: str, extractor: Extractor, examples: Sequence[Example],
              encoded: Encoded, batch_size: int) -> tuple[str, str]:
  """Writes the npy layout (module docstring); returns its two paths."""
  features_path, tokens_path = npy_paths(output_file)
  if fileio.is_remote(features_path):
    raise ValueError(f"--output_file={output_file}: the npy format is written through a "
                     "memory map and needs a local path; write locally and copy it")
  n, length = encoded.arrays["input_ids"].shape
  shape = (n, length, len(extractor.layers), extractor.config.hidden_size)
  out = np.lib.format.open_memmap(features_path, mode="w+", dtype=np.float32, shape=shape)
  for start, values in extractor.batches(encoded.arrays, batch_size):
    mask = encoded.arrays["input_mask"][start:start + len(values)]
    out[start:start + len(values)] = values * mask[:, :, None, None]
  out.flush()
  del out
  fileio.write_text(tokens_path, "".join(
      json.dumps({"linex_index": e.index, "tokens": t}) + "\n"
      for e, t in zip(examples, encoded.tokens)))
  return features_path, tokens_path
