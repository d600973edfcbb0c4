"""The map step of record creation: one input shard -> keyed, serialised records.

Shared by the local driver (creation.py) and the Beam pipeline
(beam_pipeline.py), so both produce the same records with the same keys.
An input shard's documents are read in order and processed in chunks of
`docs_per_chunk` documents (a tail of fewer than half a chunk joins the chunk
before it). Each chunk is tokenized with one `encode_flat` call, then for
each dupe pass d the paper's algorithm (instances.py) runs over the chunk's
documents with a generator seeded by (seed, input shard, chunk, d). The
"random next" segment B is drawn from another document of the same chunk:
the original keeps the whole corpus in memory for this choice; a chunk of a
few thousand documents gives the same statistics with memory bounded by the
chunk size. Every instance gets a 64-bit key from a generator seeded by the
same tuple; the key picks the output shard (key % num_output_shards) and its
place in it. Instances come out in batches (`RecordBatch`): their TFRecord
frames grouped by output shard, with sort keys as numpy records, so the
local driver spills and sorts them without a Python step per instance.
"""

import collections
import dataclasses
import functools
import struct
from typing import Any, Iterator

import numpy as np

from bertjax.create import documents
from bertjax.create import instance_batches
from bertjax.create import instances as instances_lib
from bertjax.create import record_batches
from bertjax.create import records

# Sort key of a record: random key, then its origin (input shard, chunk,
# dupe pass, index in the pass), so ties are broken deterministically; kept
# with the length of the record's frame.
SORT_DTYPE = np.dtype([("key", "<u8"), ("input_shard", "<u4"),
                       ("chunk", "<u4"), ("dupe", "<u4"), ("index", "<u4"),
                       ("length", "<u4")])
SORT_FIELDS = SORT_DTYPE.names[:-1]
# The key as big-endian bytes, which sort in the same order, for Beam (its
# integer coder takes signed 64-bit values only).
SORT_KEY = struct.Struct(">QIIII")
_KEY_DOMAIN = 0x6B6579  # Separates the key stream from the instance stream.
_MASK_BATCH = 4096  # Instances masked and serialised together.


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
  num_output_shards: int = 16  # --num_output_shards
  docs_per_chunk: int = 2048  # --docs_per_chunk: the scope of random-next B.
  chunk_chars: int = 32 << 20  # A chunk also ends at about this much text.
  spill_bytes: int = 64 << 20  # Map-side buffer before spilling to disk.

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

  def masking(self) -> dict[str, Any]:
    """The `masking` entry of the metadata."""
    return {
        "premasked": True,
        "masked_lm_prob": self.masked_lm_prob,
        "whole_word_mask": self.whole_word_mask,
        "dupe_factor": self.dupe_factor,
        "short_seq_prob": self.short_seq_prob,
        "docs_per_chunk": self.docs_per_chunk,
        "chunk_chars": self.chunk_chars,
        "random_next_scope": "chunk",
        "replacement_tokens": "non-special",
    }


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
  """How a worker builds the tokenizer (tokenization.load_tokenizer)."""
  kind: str
  path: str
  do_lower_case: bool = True

  def load(self):
    from bertjax.text import tokenization  # pylint: disable=g-import-not-at-top
    return tokenization.load_tokenizer(self.kind, self.path, self.do_lower_case)



@dataclasses.dataclass
class TokenizedChunk:
  """A chunk's documents as token ids: no empty sentence or document."""
  tokens: np.ndarray  # Every sentence's ids back to back (int32).
  sentence_lengths: np.ndarray  # Ids per sentence.
  sentences_per_doc: np.ndarray  # Sentences per document.

  def __len__(self) -> int:
    return len(self.sentences_per_doc)

  @functools.cached_property
  def _sentence_starts(self) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(self.sentence_lengths)])

  @functools.cached_property
  def _first_sentence(self) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(self.sentences_per_doc)])

  @property
  def doc_starts(self) -> np.ndarray:
    """Where each document's ids begin in `tokens`, and the total."""
    return self._sentence_starts[self._first_sentence]

  def offsets(self) -> list[list[int]]:
    """Per document, its sentences' token offsets (instances.instance_spans)."""
    starts = self._sentence_starts.tolist()
    first = self._first_sentence.tolist()
    out = []
    for a, b in zip(first, first[1:]):
      base = starts[a]
      out.append([x - base for x in starts[a:b + 1]])
    return out

  def documents(self) -> list[list[list[int]]]:
    """Documents as lists of sentences of ids (the scalar algorithm's form)."""
    ids = self.tokens.tolist()
    starts = self._sentence_starts.tolist()
    sentences = [ids[a:b] for a, b in zip(starts, starts[1:])]
    first = self._first_sentence.tolist()
    return [sentences[a:b] for a, b in zip(first, first[1:])]


@dataclasses.dataclass
class RecordBatch:
  """Framed records of a batch of instances, grouped by output shard."""
  shard_counts: np.ndarray  # Records per output shard; rows go shard by shard.
  keys: np.ndarray  # SORT_DTYPE per row.
  frames: record_batches.FramedBatch  # The rows' TFRecord frames.

  def __len__(self) -> int:
    return len(self.keys)

  def output_shards(self) -> np.ndarray:
    return np.repeat(np.arange(len(self.shard_counts)), self.shard_counts)


class ShardMapper:
  """The map step: one input shard -> keyed serialised Examples + stats.

  Shared by the local driver and the Beam pipeline, so both produce the same
  records with the same keys.
  """

  def __init__(self, config: CreationConfig, tokenizer):
    self.config = config
    self.tokenizer = tokenizer
    self.vocab = instances_lib.VocabInfo.from_tokenizer(tokenizer)
    self.encoder = records.ExampleEncoder(
        config.max_seq_length, config.max_predictions_per_seq,
        tokenizer.vocab_size)
    self._frames = record_batches.FrameEncoder(self.encoder)
    ids = tokenizer.special_ids
    self._special_array = np.asarray(
        sorted({ids["cls"], ids["sep"], ids["mask"], ids["pad"]}), np.int32)
    self._unk = ids["unk"]

  def map_shard_batches(self, shard: documents.InputShard,
                        report: collections.Counter,
                        progress=None) -> Iterator["RecordBatch"]:
    """Yields the framed, keyed records of every instance, a batch at a time.

    `report` receives counts of what was read, skipped or repaired, and
    "instances"/"tokens" per output shard under ("instances", s) keys.
    `progress(bytes_read, num_instances)` is called after each chunk.
    """
    chunk_index = 0
    for docs, bytes_read in documents.iter_chunks(
        shard, self.config.docs_per_chunk, self.config.chunk_chars, report):
      tokenized = self._tokenize(docs, report)
      n = 0
      if len(tokenized) == 1:
        report["chunks_with_one_document"] += 1
      if tokenized:
        for batch in self._chunk_instances(shard.index, chunk_index, tokenized,
                                           report):
          n += len(batch)
          yield batch
      chunk_index += 1
      if progress is not None:
        progress(bytes_read, n)

  def map_shard(self, shard: documents.InputShard, report: collections.Counter,
                progress=None) -> Iterator[tuple[int, bytes, bytes]]:
    """Yields (output shard, SORT_KEY bytes, Example bytes) per instance."""
    for batch in self.map_shard_batches(shard, report, progress):
      keys = batch.keys[list(SORT_FIELDS)].tolist()
      for out, key, data in zip(batch.output_shards().tolist(), keys,
                                batch.frames.records()):
        yield out, SORT_KEY.pack(*key), data

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

  def _chunk_instances(self, shard_index, chunk_index, docs, report):
    """Yields the keyed records of every dupe pass over one chunk."""
    c = self.config
    num_shards = c.num_output_shards
    offsets = docs.offsets()
    doc_starts, tokens = docs.doc_starts, docs.tokens
    if c.whole_word_mask:
      docs = docs.documents()
    for dupe in range(c.dupe_factor):
      origin = (c.random_seed, shard_index, chunk_index, dupe)
      rng = instances_lib.FastRng(origin)
      # Instance spans first (Python, per document), then assembly, masking
      # and serialisation in numpy batches; whole-word masking masks each
      # instance in Python as it is made.
      if c.whole_word_mask:
        made = []
        for doc_index in range(len(docs)):
          made.extend(instances_lib.create_instances_from_document(
              docs, doc_index, c.max_seq_length, c.short_seq_prob,
              c.masked_lm_prob, c.max_predictions_per_seq, self.vocab, rng,
              c.whole_word_mask))
      else:
        spans = []
        for doc_index in range(len(docs)):
          spans.extend(instances_lib.instance_spans(
              offsets, doc_index, c.max_seq_length, c.short_seq_prob, rng))
        made = np.asarray(spans, np.int64).reshape(-1, 7)
      keys = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
          (*origin, _KEY_DOMAIN)))).integers(
              0, 2**64, len(made), dtype=np.uint64, endpoint=False)
      shards = (keys % np.uint64(num_shards)).astype(np.int64)
      for start in range(0, len(made), _MASK_BATCH):
        part = made[start:start + _MASK_BATCH]
        out_B = shards[start:start + len(part)]
        # Rows grouped by output shard, in their order within each shard.
        order = np.argsort(out_B, kind="stable")
        out_B = out_B[order]
        if c.whole_word_mask:
          part = [part[i] for i in order.tolist()]
          data = [records.frame(self.encoder.encode_instance(inst))
                  for inst in part]
          frames = record_batches.FramedBatch(
              b"".join(data), np.fromiter(map(len, data), np.int64, len(data)))
          lengths = np.fromiter((len(i.input_ids) for i in part), np.int64,
                                len(part))
        else:
          batch = instance_batches.mask_arrays(
              *instance_batches.assemble_pairs(part, tokens, doc_starts,
                                               c.max_seq_length, self.vocab),
              c.masked_lm_prob, c.max_predictions_per_seq, self.vocab,
              rng.generator).take(order)
          frames = self._frames.encode(batch)
          lengths = batch.lengths_B
        inst_counts = np.bincount(out_B, minlength=num_shards)
        tok_counts = np.bincount(out_B, weights=lengths, minlength=num_shards)
        for s in np.nonzero(inst_counts)[0].tolist():
          report[("instances", s)] += int(inst_counts[s])
          report[("tokens", s)] += int(tok_counts[s])
        sort_keys = np.empty(len(part), SORT_DTYPE)
        sort_keys["key"] = keys[start:start + len(part)][order]
        sort_keys["input_shard"] = shard_index
        sort_keys["chunk"] = chunk_index
        sort_keys["dupe"] = dupe
        sort_keys["index"] = start + order
        sort_keys["length"] = frames.lengths
        yield RecordBatch(inst_counts, sort_keys, frames)


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
