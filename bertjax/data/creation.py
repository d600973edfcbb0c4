"""Parallel, streaming, resumable creation of pre-masked pretraining records.

The work is a map/reduce with deterministic keys, so the output is a pure
function of (input files, tokenizer, seed, settings), whatever the number of
worker processes (or Beam workers, see beam_pipeline.py):

Map, one task per input shard (documents.py: an input file, a group of small
  files, or a part of a tfds split):
  documents are read in order and processed in chunks of `docs_per_chunk`
  documents (a tail of fewer than half a chunk joins the chunk before it).
  Each chunk is tokenized with one `encode_batch` call, then for each dupe
  pass d the paper's algorithm (instances.py) runs over the chunk's documents
  with a generator seeded by (seed, input shard, chunk, d). The "random next"
  segment B is drawn from another document of the same chunk: the original
  keeps the whole corpus in memory for this choice; a chunk of a few thousand
  documents gives the same statistics with memory bounded by the chunk size.
  Every instance gets a 64-bit key from a generator seeded by the same tuple;
  the key picks the output shard (key % num_output_shards) and its place in
  it. Records are spilled to disk per task (memory bounded by spill_bytes).
Reduce, one task per output shard:
  the shard's records from all map tasks are sorted by (key, origin) and
  written as `part-XXXXX-of-YYYYY.tfrecord` with its `.index`. Sorting by a
  random key is a uniform shuffle, like the original's shuffle of all
  instances, and it assigns instances to shards uniformly at random.

Resuming: a map task is done when its `_work/map-XXXXX.json` exists; an
output shard is done when its file exists (written under a temporary name and
renamed after its index). A rerun skips both; `metadata.json` is written last
and `_work/` removed. A rerun with other settings is refused.
"""

import collections
import dataclasses
import itertools
import json
import multiprocessing
import os
import queue
import shutil
import struct
import sys
import time
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from bertjax.data import documents
from bertjax.data import instances as instances_lib
from bertjax.data import records
from bertjax.data import schema

WORK_DIR = "_work"
# Sort key of a record: random key, then its origin (input shard, chunk,
# dupe pass, index in the pass), so ties are broken deterministically.
_SORT_KEY = struct.Struct(">QIIII")
_LENGTH = struct.Struct(">I")
_KEY_DOMAIN = 0x6B6579  # Separates the key stream from the instance stream.
_MASK_BATCH = 1024  # Instances masked and serialised together.


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
    from bertjax.data import tokenization  # pylint: disable=g-import-not-at-top
    return tokenization.load_tokenizer(self.kind, self.path, self.do_lower_case)



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
    ids = tokenizer.special_ids
    self._in_text_special = {ids["cls"], ids["sep"], ids["mask"], ids["pad"]}
    self._unk = ids["unk"]

  def map_shard(self, shard: documents.InputShard, report: collections.Counter,
                progress=None) -> Iterator[tuple[int, bytes, bytes]]:
    """Yields (output shard, sort key, Example bytes) for every instance.

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
        for item in self._chunk_instances(shard.index, chunk_index, tokenized,
                                          report):
          n += 1
          yield item
      chunk_index += 1
      if progress is not None:
        progress(bytes_read, n)

  def _tokenize(self, docs: list[list[str]], report) -> list[list[list[int]]]:
    flat = [s for doc in docs for s in doc]
    encoded = self.tokenizer.encode_batch(flat) if flat else []
    max_tokens = self.config.max_seq_length - 3
    special = self._in_text_special
    out, pos = [], 0
    for doc in docs:
      sentences = []
      for ids in encoded[pos:pos + len(doc)]:
        if not ids:
          report["sentences_without_tokens"] += 1
          continue
        if not special.isdisjoint(ids):
          report["special_tokens_in_text_replaced_by_unk"] += sum(
              1 for t in ids if t in special)
          ids = [self._unk if t in special else t for t in ids]
        if len(ids) > max_tokens:
          report["sentences_longer_than_max_seq_length_truncated"] += 1
        sentences.append(ids)
      pos += len(doc)
      if sentences:
        out.append(sentences)
        report["documents"] += 1
        report["sentences"] += len(sentences)
      else:
        report["documents_without_tokens_skipped"] += 1
    return out

  def _chunk_instances(self, shard_index, chunk_index, docs, report):
    """Yields the keyed records of every dupe pass over one chunk."""
    c = self.config
    num_shards = c.num_output_shards
    offsets = [instances_lib.sentence_offsets(d) for d in docs]
    # Every document's tokens back to back, for assembling rows in numpy.
    doc_starts = np.cumsum([0] + [o[-1] for o in offsets])
    tokens = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(docs)),
                         np.int64, int(doc_starts[-1]))
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
        if c.whole_word_mask:
          data = [self.encoder.encode_instance(inst) for inst in part]
          lengths = np.fromiter((len(i.input_ids) for i in part), np.int64,
                                len(part))
        else:
          batch = instances_lib.mask_arrays(
              *instances_lib.assemble_pairs(part, tokens, doc_starts, c.max_seq_length,
                                            self.vocab),
              c.masked_lm_prob, c.max_predictions_per_seq, self.vocab, rng.generator)
          data = self.encoder.encode_batch(batch)
          lengths = batch.lengths_B
        out_B = shards[start:start + len(part)]
        inst_counts = np.bincount(out_B, minlength=num_shards)
        tok_counts = np.bincount(out_B, weights=lengths, minlength=num_shards)
        for s in np.nonzero(inst_counts)[0].tolist():
          report[("instances", s)] += int(inst_counts[s])
          report[("tokens", s)] += int(tok_counts[s])
        for i, (key, out, d) in enumerate(zip(
            keys[start:start + len(part)].tolist(), out_B.tolist(), data)):
          yield out, _SORT_KEY.pack(key, shard_index, chunk_index, dupe,
                                    start + i), d


# ---------------------------------------------------------------------------
# Local driver.

def _split_report(report: collections.Counter, num_shards: int):
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


_WORKER = {}


def _worker_init(config, tokenizer_spec, progress_queue):
  if progress_queue is not None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  _WORKER["mapper"] = ShardMapper(config, tokenizer_spec.load())
  _WORKER["queue"] = progress_queue


def _map_task(shard: documents.InputShard, work_dir: str) -> dict[str, Any]:
  """Runs the map step of one input shard, spilling records to disk."""
  mapper: ShardMapper = _WORKER["mapper"]
  q = _WORKER.get("queue")
  config = mapper.config
  S = config.num_output_shards
  task_dir = os.path.join(work_dir, f"map-{shard.index:05d}")
  shutil.rmtree(task_dir, ignore_errors=True)
  os.makedirs(task_dir)
  report = collections.Counter()
  buffers = [[] for _ in range(S)]
  buffered = 0
  runs = 0
  last_bytes = 0

  def flush():
    nonlocal buffered, runs
    offsets = [0]
    path = os.path.join(task_dir, f"run-{runs:05d}.bin")
    with open(path, "wb") as f:
      for s in range(S):
        data = b"".join(buffers[s])
        f.write(data)
        offsets.append(offsets[-1] + len(data))
        buffers[s] = []
    np.asarray(offsets, "<i8").tofile(path + ".offsets")
    runs += 1
    buffered = 0

  def progress(bytes_read, n):
    nonlocal last_bytes
    if q is not None:
      q.put((bytes_read - last_bytes, n))
    elif "callback" in _WORKER:
      _WORKER["callback"](bytes_read - last_bytes, n)
    last_bytes = bytes_read

  for out, head, data in mapper.map_shard(shard, report, progress):
    buffers[out].append(head + _LENGTH.pack(len(data)) + data)
    buffered += len(data) + 28
    if buffered >= config.spill_bytes:
      flush()
  if buffered or runs == 0:
    flush()
  inst, toks, plain = _split_report(report, S)
  done = {"index": shard.index, "runs": runs, "instances": inst, "tokens": toks,
          "report": plain}
  path = os.path.join(work_dir, f"map-{shard.index:05d}.json")
  with open(path + ".tmp", "w") as f:
    json.dump(done, f)
  os.replace(path + ".tmp", path)
  return done


def _reduce_task(shard_index: int, output_dir: str, work_dir: str,
                 map_indices: Sequence[int], num_shards: int) -> int:
  """Sorts one output shard's records from every map task and writes it."""
  entries = []
  for m in map_indices:
    task_dir = os.path.join(work_dir, f"map-{m:05d}")
    for name in sorted(os.listdir(task_dir)):
      if not name.endswith(".bin"):
        continue
      path = os.path.join(task_dir, name)
      offsets = np.fromfile(path + ".offsets", "<i8")
      start, end = int(offsets[shard_index]), int(offsets[shard_index + 1])
      with open(path, "rb") as f:
        f.seek(start)
        buf = f.read(end - start)
      entries.extend(_parse_entries(buf))
  entries.sort(key=lambda e: e[0])
  path = os.path.join(output_dir, records.shard_name(shard_index, num_shards))
  return records.write_shard(path, (data for _, data in entries))


def _parse_entries(buf: bytes) -> list[tuple[bytes, bytes]]:
  """(sort key, record) pairs of a spill segment."""
  out, pos, n = [], 0, len(buf)
  key_size, head = _SORT_KEY.size, _SORT_KEY.size + _LENGTH.size
  while pos < n:
    (length,) = _LENGTH.unpack_from(buf, pos + key_size)
    out.append((buf[pos:pos + key_size], buf[pos + head:pos + head + length]))
    pos += head + length
  return out


def _fingerprint(config, tokenizer, shards) -> dict[str, Any]:
  return {
      "config": dataclasses.asdict(config) | {"spill_bytes": None},
      "vocab_hash": tokenizer.vocab_hash(),
      "tokenizer": tokenizer.describe(),
      "inputs": [s.describe() for s in shards],
  }


def build_metadata(config, tokenizer, source, inst, toks, report
                   ) -> schema.DatasetMetadata:
  S = config.num_output_shards
  return schema.DatasetMetadata(
      max_seq_length=config.max_seq_length,
      max_predictions_per_seq=config.max_predictions_per_seq,
      vocab_size=tokenizer.vocab_size,
      vocab_hash=tokenizer.vocab_hash(),
      special_ids=dict(tokenizer.special_ids),
      tokenizer=tokenizer.describe(),
      masking=config.masking(),
      num_instances=int(sum(inst)),
      num_tokens=int(sum(toks)),
      random_seed=config.random_seed,
      source=source,
      files=[{"name": records.shard_name(s, S), "num_instances": int(inst[s]),
              "num_tokens": int(toks[s])} for s in range(S)],
      report={k: int(v) for k, v in sorted(report.items())})


def _check_same(existing: schema.DatasetMetadata, new: schema.DatasetMetadata,
                output_dir: str) -> None:
  for field in ("max_seq_length", "max_predictions_per_seq", "vocab_hash",
                "masking", "random_seed", "source"):
    if getattr(existing, field) != getattr(new, field):
      raise ValueError(
          f"{output_dir} already holds a dataset made with a different "
          f"{field} ({getattr(existing, field)!r}, now "
          f"{getattr(new, field)!r}); choose a new --output_dir or remove it.")


def create_pretraining_data(
    shards: Sequence[documents.InputShard], tokenizer_spec: TokenizerSpec,
    config: CreationConfig, output_dir: str, num_workers: Optional[int] = None,
    source: str = "", show_progress: bool = True,
    log=print) -> schema.DatasetMetadata:
  """Creates (or finishes) a dataset directory; returns its metadata."""
  config.validate()
  num_workers = num_workers or os.cpu_count() or 1
  if num_workers < 1:
    raise ValueError(f"--num_workers={num_workers}: must be at least 1.")
  tokenizer = tokenizer_spec.load()
  S = config.num_output_shards
  os.makedirs(output_dir, exist_ok=True)
  existing = schema.read_metadata(output_dir)
  work_dir = os.path.join(output_dir, WORK_DIR)
  fingerprint = _fingerprint(config, tokenizer, shards)
  if existing is not None:
    _check_same(existing, build_metadata(config, tokenizer, source, [0] * S,
                                         [0] * S, {}), output_dir)
    missing = [f["name"] for f in existing.files
               if not os.path.exists(os.path.join(output_dir, f["name"]))]
    if not missing:
      log(f"{output_dir}: complete already ({existing.num_instances} "
          "instances); nothing to do.")
      return existing
    raise ValueError(f"{output_dir}: metadata.json lists missing shards "
                     f"{missing[:3]}; remove the directory and rerun.")
  os.makedirs(work_dir, exist_ok=True)
  fp_path = os.path.join(work_dir, "fingerprint.json")
  if os.path.exists(fp_path):
    with open(fp_path) as f:
      if json.load(f) != json.loads(json.dumps(fingerprint)):
        raise ValueError(
            f"{output_dir} holds unfinished work made with other settings or "
            "inputs; choose a new --output_dir or remove it.")
  else:
    stale = sorted(n for n in os.listdir(output_dir)
                   if n.startswith("part-") and n.endswith(".tfrecord"))
    if stale:
      raise ValueError(
          f"{output_dir} holds shards ({stale[0]}, ...) but no metadata.json "
          "or unfinished work of this run; choose a new --output_dir or "
          "remove them.")
    with open(fp_path, "w") as f:
      json.dump(fingerprint, f)

  done = {}
  for shard in shards:
    path = os.path.join(work_dir, f"map-{shard.index:05d}.json")
    if os.path.exists(path):
      with open(path) as f:
        done[shard.index] = json.load(f)
  todo = [s for s in shards if s.index not in done]
  if done:
    log(f"Resuming: {len(done)} of {len(shards)} input shards already mapped.")
  total_bytes = sum(s.size_bytes for s in todo)
  start = time.time()
  for result in _run_map(todo, tokenizer_spec, config, work_dir, num_workers,
                         total_bytes, show_progress):
    done[result["index"]] = result
  map_seconds = time.time() - start

  inst = np.sum([d["instances"] for d in done.values()], axis=0, dtype=np.int64)
  toks = np.sum([d["tokens"] for d in done.values()], axis=0, dtype=np.int64)
  report = collections.Counter()
  for d in done.values():
    report.update(d["report"])
  todo_shards = [s for s in range(S) if not os.path.exists(
      os.path.join(output_dir, records.shard_name(s, S)))]
  map_indices = sorted(done)
  start = time.time()
  counts = _run_reduce(todo_shards, output_dir, work_dir, map_indices, S,
                       num_workers, show_progress)
  for s, n in counts.items():
    if n != inst[s]:
      raise RuntimeError(f"shard {s}: wrote {n} records, mapped {inst[s]}.")
  metadata = build_metadata(config, tokenizer, source, inst.tolist(),
                            toks.tolist(), report)
  schema.write_metadata(output_dir, metadata)
  shutil.rmtree(work_dir, ignore_errors=True)
  log(format_report(metadata, output_dir, map_seconds, time.time() - start))
  return metadata


def _run_map(shards, tokenizer_spec, config, work_dir, num_workers,
             total_bytes, show_progress):
  """Runs map tasks in this process or in a pool; yields their results."""
  bar = _progress_bar(total_bytes, show_progress)
  counts = {"instances": 0, "start": time.time()}

  def advance(nbytes, n):
    counts["instances"] += n
    if bar is not None:
      bar.update(nbytes)
      elapsed = max(time.time() - counts["start"], 1e-9)
      bar.set_postfix(instances=counts["instances"],
                      inst_per_s=f"{counts['instances'] / elapsed:,.0f}",
                      refresh=False)

  try:
    if num_workers == 1 or len(shards) <= 1:
      _worker_init(config, tokenizer_spec, None)
      _WORKER["callback"] = advance
      try:
        for shard in shards:
          yield _map_task(shard, work_dir)
      finally:
        _WORKER.clear()
      return
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    with ctx.Pool(min(num_workers, len(shards)), _worker_init,
                  (config, tokenizer_spec, q)) as pool:
      pending = [pool.apply_async(_map_task, (s, work_dir)) for s in shards]
      while pending:
        try:
          advance(*q.get(timeout=0.2))
        except queue.Empty:
          pass
        still = []
        for r in pending:
          if r.ready():
            yield r.get()  # Re-raises a worker's error here.
          else:
            still.append(r)
        pending = still
      while True:
        try:
          advance(*q.get_nowait())
        except queue.Empty:
          break
  finally:
    if bar is not None:
      bar.close()


def _run_reduce(shards, output_dir, work_dir, map_indices, num_shards,
                num_workers, show_progress) -> dict[int, int]:
  if not shards:
    return {}
  args = [(s, output_dir, work_dir, map_indices, num_shards) for s in shards]
  bar = None
  if show_progress:
    import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm.tqdm(total=len(shards), desc="writing shards", unit="shard",
                    file=sys.stderr)
  out = {}
  try:
    if num_workers == 1 or len(shards) == 1:
      for a in args:
        out[a[0]] = _reduce_task(*a)
        if bar is not None:
          bar.update(1)
      return out
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(min(num_workers, len(shards))) as pool:
      for s, n in zip(shards, pool.starmap(_reduce_task, args, chunksize=1)):
        out[s] = n
        if bar is not None:
          bar.update(1)
    return out
  finally:
    if bar is not None:
      bar.close()


def _progress_bar(total_bytes, show_progress):
  if not show_progress:
    return None
  import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm.tqdm(total=total_bytes or None, desc="creating instances",
                   unit="B", unit_scale=True, file=sys.stderr)


def format_report(metadata: schema.DatasetMetadata, output_dir: str,
                  map_seconds: float = 0.0, reduce_seconds: float = 0.0) -> str:
  """The final report printed after creation."""
  lines = [
      f"Wrote {metadata.num_instances:,} instances ({metadata.num_tokens:,} "
      f"tokens) to {len(metadata.files)} shards in {output_dir}",
      f"  max_seq_length={metadata.max_seq_length} "
      f"max_predictions_per_seq={metadata.max_predictions_per_seq} "
      f"vocab_size={metadata.vocab_size} seed={metadata.random_seed}",
  ]
  if map_seconds:
    lines.append(f"  instances: {map_seconds:.1f}s "
                 f"({metadata.num_instances / max(map_seconds, 1e-9):,.0f}/s), "
                 f"writing: {reduce_seconds:.1f}s")
  lines.append("  report:")
  for k, v in sorted(metadata.report.items()):
    lines.append(f"    {k}: {v:,}")
  return "\n".join(lines)
