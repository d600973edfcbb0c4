"""The map step of record creation: a partition's documents -> keyed records.

Shared by the local driver (creation.py) and the Beam pipeline
(beam_pipeline.py), so both produce the same records with the same keys.
A partition's documents (partition.py: a random sample of the corpus, in
hash order) are processed in chunks of `docs_per_chunk` documents (a tail
of fewer than half a chunk joins the chunk before it). Each chunk is
tokenized with one `encode_flat` call, then for each dupe pass d the paper's
algorithm (instances.py) runs over all the chunk's documents at once
(instance_batches.pass_spans) with a generator seeded by (seed, partition,
chunk, d). The "random next" segment B is drawn
from another document of the same chunk: the original keeps the whole
corpus in memory for this choice; a chunk of a few thousand documents drawn
at random from the whole corpus gives the same statistics with memory
bounded by the chunk size. Every instance gets a 64-bit key from a generator
seeded by the same tuple; the key picks the output shard
(key % num_output_shards) and its place in it. Instances come out in
batches (`RecordBatch`): their fields as fixed-width rows (`row_dtype`, not
yet serialised) grouped by output shard, with their sort keys, so the local
driver spills and sorts them without a Python step per instance and
serialises them (`frame`) as it writes each output shard; a row is about
half the bytes of its TFRecord frame.
"""

import collections
import dataclasses
import functools
import struct
from typing import Any, Iterable, Iterator

import numpy as np

from bertjax.create import documents
from bertjax.create import instance_batches
from bertjax.create import instances as instances_lib
from bertjax.create import records
from bertjax.records import schema
from bertjax.records import tfrecord

# Sort key of a record: random key, then its origin (partition, chunk, dupe
# pass, index in the pass), so ties are broken deterministically; as
# big-endian bytes, which sort in the same order (spills.py; Beam's integer
# coder takes signed 64-bit values only).
SORT_KEY = struct.Struct(">QIIII")
_SORT_FIELDS = np.dtype([("key", ">u8"), ("partition", ">u4"),
                         ("chunk", ">u4"), ("dupe", ">u4"), ("index", ">u4")])
_KEY_DOMAIN = 0x6B6579  # Separates the key stream from the instance stream.
_MASK_BATCH = 4096  # Instances masked together.
# An instance's fields between the map and the reduce step, in
# ExampleEncoder.frame_batch's argument order (row_dtype).
ROW_FIELDS = ("input_ids", "length", "num_a", "masked_lm_positions", "masked_lm_ids",
              "num_predictions", "is_random_next")


def row_dtype(config: "CreationConfig", vocab_size: int) -> np.dtype:
  """One instance as a fixed-width row (ROW_FIELDS): ids in 2 bytes where the
  vocab has at most 65,536 entries, 4 otherwise; positions and counts in 2."""
  ids = "<u2" if vocab_size <= 1 << 16 else "<i4"
  small = "<u2" if config.max_seq_length < 1 << 16 else "<i4"
  L, P = config.max_seq_length, config.max_predictions_per_seq
  return np.dtype([("input_ids", ids, (L,)), ("length", small), ("num_a", small),
                   ("masked_lm_positions", small, (P,)), ("masked_lm_ids", ids, (P,)),
                   ("num_predictions", small), ("is_random_next", "u1")])


def to_rows(dtype: np.dtype, *fields: np.ndarray) -> np.ndarray:
  """frame_batch's arguments (ROW_FIELDS, B rows each) as B rows of `dtype`."""
  rows = np.empty(len(fields[1]), dtype)
  for name, value in zip(ROW_FIELDS, fields):
    top = int(np.max(value, initial=0))
    if top > np.iinfo(dtype[name].base).max:
      raise ValueError(f"{name}: value {top} does not fit the spilled rows' "
                       f"{dtype[name].base} (vocab or max_seq_length too large)")
    rows[name] = value
  return rows


def frame(encoder: records.ExampleEncoder, rows: np.ndarray) -> tuple[bytes, np.ndarray]:
  """(TFRecord frames back to back, frame lengths) of row_dtype rows."""
  return encoder.frame_batch(*(rows[name] for name in ROW_FIELDS))


@dataclasses.dataclass(frozen=True)
class CreationConfig:
  """Settings of pretraining data creation (flag names in comments)."""
  max_seq_length: int = 128  # --max_seq_length
  max_predictions_per_seq: int = 20  # --max_predictions_per_seq
  masked_lm_prob: float = 0.15  # --masked_lm_prob
  short_seq_prob: float = 0.1  # --short_seq_prob
  dupe_factor: int = 10  # --dupe_factor
  random_seed: int = 12345  # --random_seed
  whole_word_mask: bool = False  # --do_whole_word_mask
  objective: str = schema.DEFAULT_OBJECTIVE  # --objective (schema.OBJECTIVES)
  num_output_shards: int = 16  # --num_output_shards
  docs_per_chunk: int = 2048  # --docs_per_chunk: the scope of random-next B.
  chunk_chars: int = 32 << 20  # A chunk also ends at about this much text.
  partition_bytes: int = 4 << 20  # --partition_mb (in MiB): input per partition.
  spill_bytes: int = 8 << 20  # Spill buffers and merge blocks: memory, not output.

  def validate(self) -> None:
    """Raises ValueError naming the flag of any bad value."""
    def bad(flag, msg):
      raise ValueError(f"--{flag}={getattr(self, flag)}: {msg}")
    if self.max_seq_length < 5:
      bad("max_seq_length", "must be at least 5 ([CLS] A [SEP] B [SEP]).")
    if self.max_predictions_per_seq < 1:
      bad("max_predictions_per_seq", "must be at least 1.")
    if self.max_predictions_per_seq > self.max_seq_length:
      bad("max_predictions_per_seq", "must not exceed --max_seq_length.")
    if not 0.0 < self.masked_lm_prob < 1.0:
      bad("masked_lm_prob", "must be in (0, 1), e.g. 0.15.")
    if not 0.0 <= self.short_seq_prob <= 1.0:
      bad("short_seq_prob", "must be in [0, 1], e.g. 0.1.")
    if self.dupe_factor < 1:
      bad("dupe_factor", "must be at least 1.")
    if not 0 <= self.random_seed < 2**32:
      bad("random_seed", "must be in [0, 2**32).")
    if self.num_output_shards < 1:
      bad("num_output_shards", "must be at least 1.")
    if self.docs_per_chunk < 2:
      bad("docs_per_chunk", "must be at least 2 (B comes from another document).")
    if self.partition_bytes < 1:
      bad("partition_bytes", "must be positive.")
    if self.objective not in schema.OBJECTIVES:
      bad("objective", f"must be one of {schema.OBJECTIVES}.")
    if self.whole_word_mask and self.objective != schema.DEFAULT_OBJECTIVE:
      bad("objective", "whole-word masking makes the paper's pairs only; use "
          "--objective=mlm+nsp or drop --do_whole_word_mask.")

  def masking(self) -> dict[str, Any]:
    """The `masking` entry of the metadata."""
    if self.objective != schema.DEFAULT_OBJECTIVE:
      return {
          "premasked": self.objective == "mlm",
          "masked_lm_prob": self.masked_lm_prob,
          "dupe_factor": self.dupe_factor,
          "docs_per_chunk": self.docs_per_chunk,
          "chunk_chars": self.chunk_chars,
          "partition_bytes": self.partition_bytes,
          "rows": "full sentences across documents, [SEP] between documents, "
                  "documents in a random order per dupe pass",
          "replacement_tokens": "non-special",
      }
    return {
        "premasked": True,
        "masked_lm_prob": self.masked_lm_prob,
        "whole_word_mask": self.whole_word_mask,
        "dupe_factor": self.dupe_factor,
        "short_seq_prob": self.short_seq_prob,
        "docs_per_chunk": self.docs_per_chunk,
        "chunk_chars": self.chunk_chars,
        "partition_bytes": self.partition_bytes,
        "random_next_scope": "chunk of documents drawn at random from the "
                             "whole input",
        "replacement_tokens": "non-special",
    }


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
  """How a worker builds the tokenizer (tokenization.load_tokenizer)."""
  kind: str
  path: str
  do_lower_case: bool = True
  # WordPiece's variant: "original" (the original release's FullTokenizer)
  # or "hf" (transformers.BertTokenizer); see tokenization.py.
  compat: str = "original"

  def load(self):
    from bertjax.text import tokenization  # pylint: disable=g-import-not-at-top
    return tokenization.load_tokenizer(self.kind, self.path, self.do_lower_case,
                                       self.compat)



@dataclasses.dataclass
class TokenizedChunk:
  """A chunk's documents as token ids: no empty sentence or document."""
  tokens: np.ndarray  # Every sentence's ids back to back (int32).
  sentence_lengths: np.ndarray  # Ids per sentence.
  sentences_per_doc: np.ndarray  # Sentences per document.

  def __len__(self) -> int:
    return len(self.sentences_per_doc)

  @functools.cached_property
  def sentence_starts(self) -> np.ndarray:
    """Where each sentence's ids begin in `tokens`, and the total."""
    return np.concatenate([[0], np.cumsum(self.sentence_lengths)])

  @functools.cached_property
  def first_sentence(self) -> np.ndarray:
    """Each document's first sentence, and the number of sentences."""
    return np.concatenate([[0], np.cumsum(self.sentences_per_doc)])

  @property
  def doc_starts(self) -> np.ndarray:
    """Where each document's ids begin in `tokens`, and the total."""
    return self.sentence_starts[self.first_sentence]

  def documents(self) -> list[list[list[int]]]:
    """Documents as lists of sentences of ids (the scalar algorithm's form)."""
    ids = self.tokens.tolist()
    starts = self.sentence_starts.tolist()
    sentences = [ids[a:b] for a, b in zip(starts, starts[1:])]
    first = self.first_sentence.tolist()
    return [sentences[a:b] for a, b in zip(first, first[1:])]


@dataclasses.dataclass
class RecordBatch:
  """A batch of instances, grouped by output shard."""
  shards: np.ndarray  # Output shard per row, ascending.
  keys: np.ndarray  # SORT_KEY bytes per row (numpy "S24").
  rows: np.ndarray  # The instances as row_dtype rows (frame() serialises them).

  def __len__(self) -> int:
    return len(self.keys)


class ShardMapper:
  """The map step: a partition's documents -> keyed serialised Examples.

  Shared by the local driver and the Beam pipeline, so both produce the same
  records with the same keys.
  """

  def __init__(self, config: CreationConfig, tokenizer):
    self.config = config
    self.tokenizer = tokenizer
    self.vocab = instances_lib.VocabInfo.from_tokenizer(tokenizer)
    self.encoder = records.ExampleEncoder(config.max_seq_length,
                                          config.max_predictions_per_seq)
    self.row_dtype = row_dtype(config, tokenizer.vocab_size)
    ids = tokenizer.special_ids
    self._special_array = np.asarray(
        sorted({ids["cls"], ids["sep"], ids["mask"], ids["pad"]}), np.int32)
    self._unk = ids["unk"]

  def map_partition(self, partition: int, docs: Iterable[list[str]],
                    report: collections.Counter) -> Iterator[RecordBatch]:
    """Yields the keyed instances of the partition, a batch at a time.

    `docs` are the partition's documents in order; `report` receives counts
    of what was read, skipped or repaired, and "instances"/"tokens" per
    output shard under ("instances", s) keys.
    """
    c = self.config
    for chunk_index, chunk in enumerate(documents.iter_chunks(
        docs, c.docs_per_chunk, c.chunk_chars)):
      tokenized = self._tokenize(chunk, report)
      if len(tokenized) == 1:
        report["chunks_with_one_document"] += 1
      if tokenized:
        yield from self._chunk_instances(partition, chunk_index, tokenized,
                                         report)

  def map_records(self, partition: int, docs: Iterable[list[str]],
                  report: collections.Counter
                  ) -> Iterator[tuple[int, bytes, bytes]]:
    """Yields (output shard, SORT_KEY bytes, Example bytes) per instance."""
    for batch in self.map_partition(partition, docs, report):
      keys, w = batch.keys.tobytes(), SORT_KEY.size
      frames, frame_lengths = frame(self.encoder, batch.rows)
      ends = np.cumsum(frame_lengths).tolist()
      for i, (out, end) in enumerate(zip(batch.shards.tolist(), ends)):
        start = end - int(frame_lengths[i])
        yield out, keys[i * w:(i + 1) * w], frames[
            start + tfrecord.HEADER_BYTES:end - tfrecord.FOOTER_BYTES]

  def _tokenize(self, docs: list[list[str]], report) -> "TokenizedChunk":
    """Tokenizes a chunk's documents; drops empty sentences and documents."""
    flat = [s for doc in docs for s in doc]
    ids, lengths = self.tokenizer.encode_flat(flat)
    special = np.isin(ids, self._special_array)
    if special.any():
      report["special_tokens_in_text_replaced_by_unk"] += int(special.sum())
      ids[special] = self._unk
    empty = lengths == 0
    report["sentences_without_tokens"] += int(empty.sum())
    report["sentences_longer_than_max_seq_length_truncated"] += int(
        (lengths > self.config.max_seq_length - 3).sum())
    # Sentences kept per document, and their lengths, without empty ones.
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    kept_per_doc = np.bincount(doc_of[~empty], minlength=len(docs))
    report["documents_without_tokens_skipped"] += int(
        (kept_per_doc == 0).sum())
    kept_per_doc = kept_per_doc[kept_per_doc > 0]
    report["documents"] += len(kept_per_doc)
    report["sentences"] += int(kept_per_doc.sum())
    return TokenizedChunk(ids, lengths[~empty], kept_per_doc)

  def _chunk_instances(self, partition, chunk_index, chunk, report):
    """Yields the keyed records of every dupe pass over one chunk."""
    c = self.config
    for dupe in range(c.dupe_factor):
      origin = (c.random_seed, partition, chunk_index, dupe)
      rng = instances_lib.FastRng(origin)
      made = self._pass_instances(chunk, rng)
      keys = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
          (*origin, _KEY_DOMAIN)))).integers(
              0, 2**64, len(made), dtype=np.uint64, endpoint=False)
      for start in range(0, len(made), _MASK_BATCH):
        part = made[start:start + _MASK_BATCH]
        key_B = keys[start:start + len(part)]
        # Rows grouped by output shard, in their order within each shard.
        out_B = (key_B % np.uint64(c.num_output_shards)).astype(np.int64)
        order = np.argsort(out_B, kind="stable")
        rows = self._encode(part, order, chunk, rng)
        lengths = rows["length"].astype(np.int64)
        sort_keys = np.empty(len(part), _SORT_FIELDS)
        sort_keys["key"] = key_B[order]
        sort_keys["partition"], sort_keys["chunk"] = partition, chunk_index
        sort_keys["dupe"], sort_keys["index"] = dupe, start + order
        _count(report, out_B[order], lengths, c.num_output_shards)
        yield RecordBatch(out_B[order], sort_keys.view(f"S{SORT_KEY.size}"), rows)

  def _pass_instances(self, chunk, rng):
    """One dupe pass's instances: span rows (7 columns, instance_spans) of
    all documents at once (instance_batches.pass_spans), or
    masked `Instance`s for whole-word masking, which masks each instance in
    Python as it is made."""
    c = self.config
    if c.objective != schema.DEFAULT_OBJECTIVE:
      return instance_batches.full_sentence_rows(chunk, c.max_seq_length, self.vocab, rng)
    if c.whole_word_mask:
      docs = chunk.documents()
      return [inst for d in range(len(docs))
              for inst in instances_lib.create_instances_from_document(
                  docs, d, c.max_seq_length, c.short_seq_prob,
                  c.masked_lm_prob, c.max_predictions_per_seq, self.vocab,
                  rng, c.whole_word_mask)]
    return instance_batches.pass_spans(chunk.sentence_starts, chunk.first_sentence,
                                       c.max_seq_length, c.short_seq_prob, rng.generator)

  def _encode(self, part, order, chunk, rng) -> np.ndarray:
    """A batch of instances as row_dtype rows, in `order`."""
    c = self.config
    if c.objective != schema.DEFAULT_OBJECTIVE:
      ids, lengths = instance_batches.pad_rows([part[i] for i in order.tolist()],
                                               c.max_seq_length)
      return self._rows(instance_batches.mask_single_segment(
          ids, lengths, c.masked_lm_prob if c.objective == "mlm" else 0.0,
          c.max_predictions_per_seq, self.vocab, rng.generator))
    if c.whole_word_mask:
      return to_rows(self.row_dtype, *self.encoder.pad_rows(
          [(i.input_ids, i.num_a, i.masked_lm_positions, i.masked_lm_ids,
            i.is_random_next) for i in (part[j] for j in order.tolist())]))
    return self._rows(instance_batches.mask_arrays(
        *instance_batches.assemble_pairs(part, chunk.tokens, chunk.doc_starts,
                                         c.max_seq_length, self.vocab),
        c.masked_lm_prob, c.max_predictions_per_seq, self.vocab, rng.generator))[order]

  def _rows(self, batch: instance_batches.MaskedBatch) -> np.ndarray:
    return to_rows(self.row_dtype, batch.input_ids_BxL, batch.lengths_B, batch.num_a_B,
                   batch.masked_lm_positions_BxP, batch.masked_lm_ids_BxP,
                   batch.num_predictions_B, batch.is_random_next_B)


def _count(report, out_B, lengths_B, num_shards) -> None:
  """Adds a batch's instances and tokens per output shard to `report`."""
  inst_counts = np.bincount(out_B, minlength=num_shards)
  tok_counts = np.bincount(out_B, weights=lengths_B, minlength=num_shards)
  for s in np.nonzero(inst_counts)[0].tolist():
    report[("instances", s)] += int(inst_counts[s])
    report[("tokens", s)] += int(tok_counts[s])


def split_report(report: collections.Counter, num_shards: int):
  """(instances per shard, tokens per shard, plain counts) of a report."""
  inst = [0] * num_shards
  toks = [0] * num_shards
  plain = {}
  for k, v in report.items():
    if isinstance(k, tuple):
      (inst if k[0] == "instances" else toks)[k[1]] += v
    else:
      plain[k] = v
  return inst, toks, plain
