"""The pre-masked pretraining record schema and its dataset metadata.

The record layout is that of the original BERT release's
`create_pretraining_data.py`, so files move freely between bertjax, the
original TF1 code, NVIDIA's BERT and the TF Model Garden. This module has no
TensorFlow dependency: the tf.data parser builds its feature spec from
`FEATURES` below.
"""

import dataclasses
import hashlib
import json
import os
from typing import Any, Optional, Sequence

import numpy as np

from bertjax.records import fileio

SCHEMA_VERSION = 1
METADATA_FILENAME = "metadata.json"

# name -> (dtype in the record, length key). The length key says which
# dimension the feature has: max_seq_length, max_predictions_per_seq or 1.
FEATURES = {
    "input_ids": ("int64", "max_seq_length"),
    "input_mask": ("int64", "max_seq_length"),
    "segment_ids": ("int64", "max_seq_length"),
    "masked_lm_positions": ("int64", "max_predictions_per_seq"),
    "masked_lm_ids": ("int64", "max_predictions_per_seq"),
    "masked_lm_weights": ("float32", "max_predictions_per_seq"),
    "next_sentence_labels": ("int64", 1),
}

# Batches handed to the model: every record feature (int64 becomes int32,
# next_sentence_labels is squeezed to shape [batch]) plus this per-example
# weight, 1.0 for a real example and 0.0 for padding added to fill the last
# evaluation batch.
EXAMPLE_WEIGHT_KEY = "example_weights"

# Fields that a packed batch (bertjax/input/packing.py: several examples per
# row) adds to the model batch, each [rows, ...]: packed_example_ids and
# position_ids [rows, max_seq_length], next_sentence_positions
# [rows, max examples per row]. In a packed batch next_sentence_labels and
# EXAMPLE_WEIGHT_KEY are [rows, max examples per row] too.
PACKED_KEYS = ("packed_example_ids", "position_ids", "next_sentence_positions")

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# The pretraining objectives as the paper's ablations (Table 5) name them, and
# the records each is trained on:
#   mlm+nsp  BERT: masked LM and next sentence; [CLS] A [SEP] B [SEP] pairs,
#            half with a random B (the original release's records).
#   mlm      "No NSP" (RoBERTa's FULL-SENTENCES, MosaicBERT): masked LM only;
#            [CLS] text [SEP], contiguous sentences filled to the length across
#            documents, a [SEP] between documents; next_sentence_labels 0.
#   ltr      "LTR & No NSP": a left-to-right LM predicting every next token;
#            the same rows as mlm, unmasked.
OBJECTIVES = ("mlm+nsp", "mlm", "ltr")
DEFAULT_OBJECTIVE = "mlm+nsp"
# The records a model trained for each objective is evaluated on. Training
# takes only its own objective's records. An mlm model is also scored on the
# paper's held-out pairs (their masked-LM figures; it has no NSP head), so
# that mlm and mlm+nsp runs compare on the same examples. An mlm+nsp model
# takes only pairs (mlm rows' next_sentence_labels are all 0), and an ltr
# model only unmasked rows (it predicts every next token, so masked records
# would have it predict [MASK]).
EVAL_OBJECTIVES = {"mlm+nsp": ("mlm+nsp",), "mlm": ("mlm", "mlm+nsp"), "ltr": ("ltr",)}


def feature_length(name: str, max_seq_length: int, max_predictions_per_seq: int) -> int:
  """The fixed length of feature `name` for the given sizes."""
  _, key = FEATURES[name]
  if key == "max_seq_length":
    return max_seq_length
  if key == "max_predictions_per_seq":
    return max_predictions_per_seq
  return int(key)


def batch_shapes(batch_size: int, max_seq_length: int,
                 max_predictions_per_seq: int) -> dict[str, tuple[tuple[int, ...], Any]]:
  """Shapes and numpy dtypes of one model batch (see EXAMPLE_WEIGHT_KEY)."""
  shapes = {}
  for name, (dtype, _) in FEATURES.items():
    length = feature_length(name, max_seq_length, max_predictions_per_seq)
    np_dtype = np.float32 if dtype == "float32" else np.int32
    shape = (batch_size,) if name == "next_sentence_labels" else (batch_size, length)
    shapes[name] = (shape, np_dtype)
  shapes[EXAMPLE_WEIGHT_KEY] = ((batch_size,), np.float32)
  return shapes


def vocab_hash(tokens: Sequence[str]) -> str:
  """A stable hash of a vocabulary given as its tokens in id order."""
  digest = hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()
  return "sha256:" + digest[:16]


@dataclasses.dataclass
class DatasetMetadata:
  """What `metadata.json` beside a directory of TFRecord shards records."""
  max_seq_length: int
  max_predictions_per_seq: int
  vocab_size: int
  vocab_hash: str
  # {"pad": 0, "unk": .., "cls": .., "sep": .., "mask": ..}
  special_ids: dict[str, int]
  # e.g. {"type": "wordpiece", "do_lower_case": true, "vocab_file": "..."}
  tokenizer: dict[str, Any]
  # e.g. {"masked_lm_prob": 0.15, "whole_word_mask": false, "dupe_factor": 10,
  #       "short_seq_prob": 0.1, "premasked": true}
  masking: dict[str, Any]
  num_instances: int
  num_tokens: int
  random_seed: int
  source: str
  # [{"name": "part-00000-of-00004.tfrecord", "num_instances": 1234}, ...]
  files: list[dict[str, Any]]
  # Counts of anything skipped or repaired while creating the data
  # (e.g. {"invalid_utf8_lines": 3, "empty_documents": 2}).
  report: dict[str, int] = dataclasses.field(default_factory=dict)
  # The objective the records are made for (OBJECTIVES); metadata written
  # before the field existed is the paper's.
  objective: str = DEFAULT_OBJECTIVE
  schema_version: int = SCHEMA_VERSION

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any], path: str = "<dict>") -> "DatasetMetadata":
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"{path}: unknown metadata fields {unknown}")
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    missing = sorted(required - set(d))
    if missing:
      raise ValueError(f"{path}: missing metadata fields {missing}")
    if d.get("schema_version", SCHEMA_VERSION) > SCHEMA_VERSION:
      raise ValueError(
          f"{path}: schema_version {d['schema_version']} is newer than this "
          f"bertjax understands ({SCHEMA_VERSION}); upgrade bertjax.")
    return cls(**d)


def metadata_path(directory: str) -> str:
  return os.path.join(directory, METADATA_FILENAME)


def write_metadata(directory: str, metadata: DatasetMetadata) -> None:
  """Writes metadata.json atomically (local) or in one object write (gs://)."""
  fileio.write_text(metadata_path(directory), metadata.to_json())


def read_metadata(directory: str) -> Optional[DatasetMetadata]:
  """Reads metadata.json from `directory`; None if there is none."""
  path = metadata_path(directory)
  if not fileio.retry(lambda: fileio.exists(path), f"lookup of {path}"):
    return None
  text = fileio.retry(lambda: fileio.read_text(path), f"read of {path}")
  try:
    d = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e})") from e
  return DatasetMetadata.from_dict(d, path)
