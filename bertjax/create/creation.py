"""Parallel, streaming, resumable creation of pre-masked pretraining records.

The work is a map/reduce with deterministic keys, so the output is a pure
function of (input files, tokenizer, seed, settings), whatever the number of
worker processes (or Beam workers, see beam_pipeline.py):

Map, one task per input shard (documents.py: an input file, a group of small
  files, or a part of a tfds split): mapper.ShardMapper turns the shard's
  documents into keyed records (chunks, tokenization, the paper's algorithm
  per dupe pass, a 64-bit key per instance that picks its output shard and
  its place there). Records are spilled to disk per task (memory bounded by
  spill_bytes).
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
import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import queue
import shutil
import sys
import time
from typing import Any, Optional, Sequence

import numpy as np

from bertjax.create import documents
from bertjax.create import mapper
from bertjax.create import records
from bertjax.records import schema

# The names a caller of the driver needs, defined with the map step.
CreationConfig = mapper.CreationConfig
TokenizerSpec = mapper.TokenizerSpec
ShardMapper = mapper.ShardMapper

WORK_DIR = "_work"


# ---------------------------------------------------------------------------
# Local driver.

_WORKER = {}


def _worker_init(config, tokenizer_spec, progress_queue):
  if progress_queue is not None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  _WORKER["mapper"] = ShardMapper(config, tokenizer_spec.load())
  _WORKER["queue"] = progress_queue


def _map_task(shard: documents.InputShard, work_dir: str) -> dict[str, Any]:
  """Runs the map step of one input shard, spilling records to disk.

  A spill ("run") is three files: `.bin` holds the TFRecord frames of every
  output shard in turn, `.keys` their sort keys and lengths (SORT_DTYPE)
  in the same order, `.offsets` where each output shard's part begins, in
  records and in bytes.
  """
  shard_mapper: ShardMapper = _WORKER["mapper"]
  q = _WORKER.get("queue")
  config = shard_mapper.config
  S = config.num_output_shards
  task_dir = os.path.join(work_dir, f"map-{shard.index:05d}")
  shutil.rmtree(task_dir, ignore_errors=True)
  os.makedirs(task_dir)
  report = collections.Counter()
  frames = [[] for _ in range(S)]
  keys = [[] for _ in range(S)]
  buffered = 0
  runs = 0
  last_bytes = 0

  def flush():
    nonlocal buffered, runs
    path = os.path.join(task_dir, f"run-{runs:05d}")
    offsets = np.zeros((S + 1, 2), "<i8")
    with open(path + ".bin", "wb") as f:
      for s in range(S):
        f.writelines(frames[s])
        offsets[s + 1] = offsets[s] + (sum(map(len, keys[s])),
                                       sum(map(len, frames[s])))
        frames[s] = []
    np.concatenate([k for ks in keys for k in ks] or [
        np.zeros(0, mapper.SORT_DTYPE)]).tofile(path + ".keys")
    offsets.tofile(path + ".offsets")
    for s in range(S):
      keys[s] = []
    runs += 1
    buffered = 0

  def progress(bytes_read, n):
    nonlocal last_bytes
    if q is not None:
      q.put((bytes_read - last_bytes, n))
    elif "callback" in _WORKER:
      _WORKER["callback"](bytes_read - last_bytes, n)
    last_bytes = bytes_read

  for batch in shard_mapper.map_shard_batches(shard, report, progress):
    blob, ends = memoryview(batch.frames.blob), batch.frames.ends
    rows = np.concatenate([[0], np.cumsum(batch.shard_counts)])
    starts = np.concatenate([[0], ends])[rows].tolist()
    for s in np.flatnonzero(batch.shard_counts).tolist():
      frames[s].append(blob[starts[s]:starts[s + 1]])
      keys[s].append(batch.keys[rows[s]:rows[s + 1]])
    buffered += len(batch.frames.blob)
    if buffered >= config.spill_bytes:
      flush()
  if buffered or runs == 0:
    flush()
  inst, toks, plain = mapper.split_report(report, S)
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
  key_parts, parts = [], []
  for m in map_indices:
    task_dir = os.path.join(work_dir, f"map-{m:05d}")
    for name in sorted(os.listdir(task_dir)):
      if not name.endswith(".bin"):
        continue
      path = os.path.join(task_dir, name[:-len(".bin")])
      offsets = np.fromfile(path + ".offsets", "<i8").reshape(-1, 2)
      (r0, b0), (r1, b1) = offsets[shard_index], offsets[shard_index + 1]
      key_parts.append(np.fromfile(
          path + ".keys", mapper.SORT_DTYPE, count=int(r1 - r0),
          offset=int(r0) * mapper.SORT_DTYPE.itemsize))
      with open(path + ".bin", "rb") as f:
        f.seek(int(b0))
        parts.append(f.read(int(b1 - b0)))
  keys = np.concatenate([np.zeros(0, mapper.SORT_DTYPE), *key_parts])
  lengths = keys["length"].astype(np.int64)
  # Where each record is: its part and its offset there.
  part_of = np.repeat(np.arange(len(parts)), [len(k) for k in key_parts])
  starts = np.concatenate([np.zeros(0, np.int64)] + [
      np.cumsum(k["length"], dtype=np.int64) - k["length"] for k in key_parts])
  order = np.lexsort([keys[f] for f in reversed(mapper.SORT_FIELDS)])
  lengths = lengths[order]
  views = [memoryview(p) for p in parts]
  blob = b"".join([views[p][a:a + n] for p, a, n in zip(
      part_of[order].tolist(), starts[order].tolist(), lengths.tolist())])
  path = os.path.join(output_dir, records.shard_name(shard_index, num_shards))
  records.write_framed_shard(path, blob, np.cumsum(lengths) - lengths)
  return len(keys)


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
  todo_shards = [s for s in range(S) if not os.path.exists(
      os.path.join(output_dir, records.shard_name(s, S)))]
  with _worker_pool(num_workers, max(len(todo), len(todo_shards)), config,
                    tokenizer_spec) as (pool, q):
    start = time.time()
    for result in _run_map(todo, pool, q, tokenizer_spec, config, work_dir,
                           total_bytes, show_progress):
      done[result["index"]] = result
    map_seconds = time.time() - start
    inst = np.sum([d["instances"] for d in done.values()], axis=0,
                  dtype=np.int64)
    toks = np.sum([d["tokens"] for d in done.values()], axis=0,
                  dtype=np.int64)
    report = collections.Counter()
    for d in done.values():
      report.update(d["report"])
    start = time.time()
    counts = _run_reduce(todo_shards, pool, output_dir, work_dir, sorted(done),
                         S, show_progress)
  for s, n in counts.items():
    if n != inst[s]:
      raise RuntimeError(f"shard {s}: wrote {n} records, mapped {inst[s]}.")
  metadata = build_metadata(config, tokenizer, source, inst.tolist(),
                            toks.tolist(), report)
  schema.write_metadata(output_dir, metadata)
  shutil.rmtree(work_dir, ignore_errors=True)
  log(format_report(metadata, output_dir, map_seconds, time.time() - start))
  return metadata


@contextlib.contextmanager
def _worker_pool(num_workers, num_tasks, config, tokenizer_spec):
  """Yields (pool, progress queue), or (None, None) to work in this process.

  One pool of spawned processes serves both the map and the reduce tasks. A
  worker that dies (killed, out of memory) breaks the pool, and the run
  stops with an error instead of waiting for it.
  """
  if num_workers == 1 or num_tasks <= 1:
    yield None, None
    return
  ctx = multiprocessing.get_context("spawn")
  q = ctx.Queue()
  with concurrent.futures.ProcessPoolExecutor(
      min(num_workers, num_tasks), mp_context=ctx, initializer=_worker_init,
      initargs=(config, tokenizer_spec, q)) as pool:
    yield pool, q


def _result(future, what):
  try:
    return future.result()  # Re-raises a worker's error here.
  except concurrent.futures.process.BrokenProcessPool as e:
    raise RuntimeError(
        f"a worker process stopped unexpectedly while {what} (killed, or out "
        "of memory? fewer --num_workers use less); rerun to resume.") from e


def _run_map(shards, pool, q, tokenizer_spec, config, work_dir, total_bytes,
             show_progress):
  """Runs map tasks in this process or in the pool; yields their results."""
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
    if pool is None:
      _worker_init(config, tokenizer_spec, None)
      _WORKER["callback"] = advance
      try:
        for shard in shards:
          yield _map_task(shard, work_dir)
      finally:
        _WORKER.clear()
      return
    pending = {pool.submit(_map_task, s, work_dir): s for s in shards}
    while pending:
      try:
        advance(*q.get(timeout=0.2))
      except queue.Empty:
        pass
      for future in [f for f in pending if f.done()]:
        shard = pending.pop(future)
        name = (shard.paths or (shard.tfds_name,))[0]
        yield _result(future, f"mapping input shard {shard.index} ({name})")
    while True:
      try:
        advance(*q.get_nowait())
      except queue.Empty:
        break
  finally:
    if bar is not None:
      bar.close()


def _run_reduce(shards, pool, output_dir, work_dir, map_indices,
                num_shards, show_progress) -> dict[int, int]:
  """Writes the output shards in this process or in the pool."""
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
    if pool is None:
      for a in args:
        out[a[0]] = _reduce_task(*a)
        if bar is not None:
          bar.update(1)
      return out
    futures = {pool.submit(_reduce_task, *a): a[0] for a in args}
    for future in concurrent.futures.as_completed(futures):
      s = futures[future]
      out[s] = _result(future, f"writing output shard {s}")
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
