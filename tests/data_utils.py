"""Writes small, valid pretraining datasets for tests.

`write_dataset` writes TFRecord shards of random BERT examples with
TensorFlow's own writer (so they are what the original release's tools
write), a `<shard>.index` of record offsets beside each and `metadata.json`,
and returns the examples it wrote so tests can check what they read back.
Ids 0..4 are [PAD] [UNK] [CLS] [SEP] [MASK]; the other ids are words.
"""

import os
import random
from typing import Any, Optional

import numpy as np

from bertjax.records import schema
from bertjax.records import tfrecord

SPECIAL_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
FIRST_WORD_ID = 5


def vocab_tokens(vocab_size: int) -> list[str]:
  """The test vocabulary (its hash goes into metadata.json)."""
  return list(schema.SPECIAL_TOKENS) + [f"w{i}" for i in range(FIRST_WORD_ID, vocab_size)]


def make_example(rng: np.random.Generator, max_seq_length: int, max_pred: int,
                 vocab_size: int, premasked: bool, min_length: int) -> dict[str, Any]:
  """One random example in the record layout, plus its unmasked ids."""
  n = int(rng.integers(min_length, max_seq_length + 1))
  num_a = int(rng.integers(1, n - 3))  # [CLS] a [SEP] b [SEP], b non-empty.
  words = rng.integers(FIRST_WORD_ID, vocab_size, n - 3)
  ids = np.concatenate(([SPECIAL_IDS["cls"]], words[:num_a], [SPECIAL_IDS["sep"]],
                        words[num_a:], [SPECIAL_IDS["sep"]])).astype(np.int64)
  original = ids.copy()
  positions = np.zeros(0, np.int64)
  if premasked:
    maskable = np.flatnonzero(ids >= FIRST_WORD_ID)
    k = min(max_pred, max(1, round(n * 0.15)), len(maskable))
    positions = np.sort(rng.choice(maskable, k, replace=False))
    for p in positions:
      u = rng.random()
      if u < 0.8:
        ids[p] = SPECIAL_IDS["mask"]
      elif u < 0.9:
        ids[p] = rng.integers(FIRST_WORD_ID, vocab_size)
  k = len(positions)

  def pad(values, length, dtype=np.int64):
    out = np.zeros(length, dtype)
    out[:len(values)] = values
    return out
  segments = np.concatenate((np.zeros(num_a + 2), np.ones(n - num_a - 2)))
  return {
      "input_ids": pad(ids, max_seq_length),
      "input_mask": pad(np.ones(n), max_seq_length),
      "segment_ids": pad(segments, max_seq_length),
      "masked_lm_positions": pad(positions, max_pred),
      "masked_lm_ids": pad(original[positions], max_pred),
      "masked_lm_weights": pad(np.ones(k), max_pred, np.float32),
      "next_sentence_labels": np.array([rng.integers(0, 2)], np.int64),
      "original_input_ids": pad(original, max_seq_length),
  }


def serialize(example: dict[str, Any]) -> bytes:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  feature = {}
  for name, (dtype, _) in schema.FEATURES.items():
    values = example[name]
    feature[name] = (tf.train.Feature(float_list=tf.train.FloatList(value=values))
                     if dtype == "float32" else
                     tf.train.Feature(int64_list=tf.train.Int64List(value=values)))
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_dataset(directory: str, num_files: int, records_per_file: int,
                  max_seq_length: int, max_pred: int, vocab_size: int, seed: int, *,
                  premasked: bool = True, with_index: bool = True,
                  with_metadata: bool = True, min_length: int = 8
                  ) -> list[dict[str, Any]]:
  """Writes the dataset; returns its examples in file order.

  Each returned example also has "original_input_ids" (before masking),
  "file" (shard path) and "record" (number within the shard).
  `records_per_file` may be an int or a list with one count per file.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  counts = ([records_per_file] * num_files if isinstance(records_per_file, int)
            else list(records_per_file))
  rng = np.random.default_rng(seed)
  examples, files_meta, num_tokens = [], [], 0
  for i, count in enumerate(counts):
    name = f"part-{i:05d}-of-{num_files:05d}.tfrecord"
    path = os.path.join(directory, name)
    offsets, pos = [], 0
    with tf.io.TFRecordWriter(path) as writer:
      for r in range(count):
        ex = make_example(rng, max_seq_length, max_pred, vocab_size, premasked,
                          min(min_length, max_seq_length))
        data = serialize(ex)
        writer.write(data)
        offsets.append(pos)
        pos += len(data) + 16
        ex.update(file=path, record=r)
        examples.append(ex)
        num_tokens += int(ex["input_mask"].sum())
    if with_index:
      np.asarray(offsets, "<i8").tofile(path + ".index")
    files_meta.append({"name": name, "num_instances": count})
  if with_metadata:
    schema.write_metadata(directory, schema.DatasetMetadata(
        max_seq_length=max_seq_length, max_predictions_per_seq=max_pred,
        vocab_size=vocab_size, vocab_hash=schema.vocab_hash(vocab_tokens(vocab_size)),
        special_ids=dict(SPECIAL_IDS), tokenizer={"type": "test"},
        masking={"masked_lm_prob": 0.15, "whole_word_mask": False,
                 "premasked": premasked},
        num_instances=len(examples), num_tokens=num_tokens, random_seed=seed,
        source="tests/data_utils.py", files=files_meta))
  return examples


def example_id(input_ids) -> bytes:
  """A key that tells examples apart (their ids are random)."""
  return np.asarray(input_ids, np.int64).tobytes()


# Reference encoders and readers that only tests use: the records as the
# original release's layout and TensorFlow's proto classes give them, a
# protobuf reader that needs no TensorFlow, and whole-shard reads through
# the production reader (bertjax.records.tfrecord).


def features_of(input_ids, num_a, masked_lm_positions, masked_lm_ids,
                is_random_next, max_seq_length, max_predictions_per_seq
                ) -> dict[str, list]:
  """The padded feature lists of one instance (the original's layout)."""
  n, k = len(input_ids), len(masked_lm_positions)
  pad_l, pad_p = max_seq_length - n, max_predictions_per_seq - k
  return {
      "input_ids": list(input_ids) + [0] * pad_l,
      "input_mask": [1] * n + [0] * pad_l,
      "segment_ids": [0] * (num_a + 2) + [1] * (n - num_a - 2) + [0] * pad_l,
      "masked_lm_positions": list(masked_lm_positions) + [0] * pad_p,
      "masked_lm_ids": list(masked_lm_ids) + [0] * pad_p,
      "masked_lm_weights": [1.0] * k + [0.0] * pad_p,
      "next_sentence_labels": [1 if is_random_next else 0],
  }


def tf_example_bytes(features: dict[str, list]) -> bytes:
  """The record built with TensorFlow's proto classes, deterministically."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  feature = {}
  for name in sorted(features):
    values = features[name]
    if schema.FEATURES[name][0] == "float32":
      feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
    else:
      feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString(deterministic=True)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
  result = shift = 0
  while True:
    b = buf[pos]
    pos += 1
    result |= (b & 0x7F) << shift
    if b < 0x80:
      return result, pos
    shift += 7


def _fields(buf: bytes):
  """(field number, payload) of each length-delimited field of a message."""
  pos = 0
  while pos < len(buf):
    tag, pos = _read_varint(buf, pos)
    if tag & 7 != 2:
      raise ValueError(f"unexpected wire type {tag & 7} in Example")
    size, pos = _read_varint(buf, pos)
    yield tag >> 3, buf[pos:pos + size]
    pos += size


def decode_example(data: bytes) -> dict[str, np.ndarray]:
  """A serialised Example of int64/float lists as numpy arrays, without
  TensorFlow."""
  out = {}
  (_, features), = _fields(data)
  for _, entry in _fields(features):
    parts = dict(_fields(entry))
    name = parts[1].decode()
    (kind, values), = _fields(parts[2])
    payload = b"".join(v for _, v in _fields(values))
    if kind == 2:
      out[name] = np.frombuffer(payload, "<f4").copy()
    elif kind == 3:
      ints, pos = [], 0
      while pos < len(payload):
        v, pos = _read_varint(payload, pos)
        ints.append(v - (1 << 64) if v >= 1 << 63 else v)
      out[name] = np.asarray(ints, np.int64)
    else:
      raise ValueError(f"feature {name}: bytes lists are not in the schema")
  return out


def read_index(shard_path: str) -> np.ndarray:
  """The record offsets of a shard from its `.index` file."""
  return np.fromfile(shard_path + tfrecord.INDEX_SUFFIX, dtype="<i8")


def scanned_index(shard_path: str) -> tfrecord.FileIndex:
  """The shard's index found by walking its frames (its .index unused)."""
  return tfrecord._scan(shard_path, os.path.getsize(shard_path), False)  # pylint: disable=protected-access


def iter_records(path: str) -> list[bytes]:
  """The data of every record of a TFRecord file, CRCs checked (raises
  tfrecord.CorruptRecordError on a bad frame)."""
  index = scanned_index(path)
  data = tfrecord.RecordReader([path]).read(
      np.zeros(len(index), np.int64), index.offsets, index.lengths)
  for item in data:
    if isinstance(item, Exception):
      raise item
  return data


def check_index(shard_path: str, expected: Optional[int] = None) -> int:
  """Checks that a shard's .index matches its frames; returns the count."""
  offsets, actual = read_index(shard_path), scanned_index(shard_path).offsets
  if not np.array_equal(offsets, actual):
    raise ValueError(f"{shard_path}.index does not match {shard_path}")
  if expected is not None and len(actual) != expected:
    raise ValueError(f"{shard_path}: {len(actual)} records, expected {expected}")
  return len(actual)


# Datasets made by bertjax.create read back, and corpora whose files can be
# told apart by their words.


def parse_files(files, max_seq_length: int, max_pred: int) -> dict[str, np.ndarray]:
  """Every record of TFRecord files in the schema, as numpy arrays (tf.data)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = {name: tf.io.FixedLenFeature(
      [schema.feature_length(name, max_seq_length, max_pred)],
      tf.float32 if dtype == "float32" else tf.int64)
          for name, (dtype, _) in schema.FEATURES.items()}
  rows = {}
  for ex in tf.data.TFRecordDataset(files).batch(1024).map(
      lambda x: tf.io.parse_example(x, spec)).as_numpy_iterator():
    for k, v in ex.items():
      rows.setdefault(k, []).append(v)
  return {k: np.concatenate(v) for k, v in rows.items()}


def parse_dataset(out: str) -> dict[str, np.ndarray]:
  """Every record of a dataset directory, as numpy arrays."""
  md = schema.read_metadata(out)
  return parse_files([os.path.join(out, f["name"]) for f in md.files],
                     md.max_seq_length, md.max_predictions_per_seq)


def unmasked_ids(ex):
  """input_ids with the original ids back at the masked positions."""
  ids = ex["input_ids"].copy()
  rows, cols = np.nonzero(ex["masked_lm_weights"] > 0)
  ids[rows, ex["masked_lm_positions"][rows, cols]] = ex["masked_lm_ids"][rows, cols]
  return ids


def file_words(f, n=40):
  """Words only file f uses, so a token tells its file."""
  return [f"q{f}x{i}" for i in range(n)]


def write_files_corpus(root, num_files, docs_per_file, seed=0):
  """Sentences-format files, each with its own words; returns (paths, vocab)."""
  rng = random.Random(seed)
  os.makedirs(root, exist_ok=True)
  paths = []
  for f in range(num_files):
    words = file_words(f)
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(
        rng.randint(4, 12))) + "." for _ in range(rng.randint(2, 6)))
            for _ in range(docs_per_file)]
    paths.append(os.path.join(root, f"file{f}.txt"))
    with open(paths[-1], "w", encoding="utf-8") as out:
      out.write("\n\n".join(docs) + "\n\n")  # The original joins a file's
      # last document to the next file's first unless a blank line ends it.
  vocab = os.path.join(root, "vocab.txt")
  with open(vocab, "w", encoding="utf-8") as out:
    out.write("\n".join(list(schema.SPECIAL_TOKENS) + ["."] + [
        w for f in range(num_files) for w in file_words(f)]) + "\n")
  return paths, vocab


def own_file_share(ex, vocab_path, num_files):
  """(share of random-next B segments from A's own file, random-next share)."""
  with open(vocab_path, encoding="utf-8") as f:
    tokens = f.read().split("\n")
  file_of = np.full(len(tokens), -1)
  for i, t in enumerate(tokens):
    if t.startswith("q") and "x" in t:
      file_of[i] = int(t[1:t.index("x")])
  ids, seg = unmasked_ids(ex), ex["segment_ids"]
  files = file_of[ids]
  random_next = ex["next_sentence_labels"][:, 0] == 1
  same = []
  for row in np.flatnonzero(random_next):
    a = files[row][(seg[row] == 0) & (files[row] >= 0)]
    b = files[row][(seg[row] == 1) & (files[row] >= 0)]
    assert len(set(a.tolist())) == 1 and len(set(b.tolist())) == 1
    same.append(a[0] == b[0])
  return float(np.mean(same)), float(random_next.mean())
