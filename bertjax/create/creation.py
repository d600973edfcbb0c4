"""Parallel, streaming, resumable creation of pre-masked pretraining records.

The work is three steps with deterministic keys (tasks.py), so the output
is a pure function of (input files, tokenizer, seed, settings), whatever
the number of worker processes, the cut of large files into byte ranges, or
the runner (Beam, see beam_pipeline.py):

Read, one task per input shard (documents.py: a file, a byte range of a
  large file, a group of small files, or a part of a tfds split): every
  document goes to a partition by a hash of its name (partition.py), so a
  partition is a random sample of the whole corpus.
Map, one task per partition: its documents in hash order, in chunks, become
  keyed records (mapper.ShardMapper: tokenization, the paper's algorithm per
  dupe pass, a 64-bit key per instance that picks its output shard and its
  place there).
Reduce, one task per output shard: the shard's records from all map tasks,
  merged in (key, origin) order, are streamed to `part-XXXXX-of-YYYYY.tfrecord`
  with its `.index`. Sorting by a random key is a uniform shuffle, like the
  original's shuffle of all instances, and it assigns instances to shards
  uniformly at random.

Between steps data are spilled to disk as sorted runs (spills.py), so memory
is bounded by `spill_bytes` and the chunk size, not by the corpus.

Resuming: a task is done when its `_work/<step>-XXXXX.json` exists; an output
shard is done when its file exists (written under a temporary name and
renamed after its index). A rerun skips both; `metadata.json` is written last
and `_work/` removed. A rerun with other settings, tokenizer or inputs is
refused, naming what differs.
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import gc
import json
import os
import shutil
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from bertjax.create import documents
from bertjax.create import mapper
from bertjax.create import partition
from bertjax.create import records
from bertjax.create import tasks
from bertjax.records import fileio
from bertjax.records import hostmem
from bertjax.records import schema
from bertjax.records import task_pool

# The names a caller of the driver needs, defined with the map step.
CreationConfig = mapper.CreationConfig
TokenizerSpec = mapper.TokenizerSpec
ShardMapper = mapper.ShardMapper

WORK_DIR = "_work"
# Fields of metadata.json a finished directory must share with a rerun.
_SAME_FIELDS = ("max_seq_length", "max_predictions_per_seq", "vocab_hash",
                "vocab_size", "special_ids", "tokenizer", "masking",
                "random_seed", "source", "objective")


def _fingerprint(config, tokenizer, shards) -> dict[str, Any]:
  return {
      "config": dataclasses.asdict(config) | {"spill_bytes": None},
      # The layout of the map step's spilled rows, which the reduce step reads.
      "spill_rows": mapper.row_dtype(config, tokenizer.vocab_size).descr,
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
      report={k: int(v) for k, v in sorted(report.items())},
      objective=config.objective)


def check_same(existing: schema.DatasetMetadata, new: schema.DatasetMetadata,
               output_dir: str) -> None:
  """Raises ValueError naming the first field (a tokenizer or masking entry
  by its key, e.g. tokenizer.do_lower_case) where a finished dataset differs
  from what a rerun would make."""
  for field in _SAME_FIELDS:
    old, now = getattr(existing, field), getattr(new, field)
    if old == now:
      continue
    name = field
    if isinstance(old, dict) and isinstance(now, dict):
      key = next(k for k in sorted(set(old) | set(now), key=str)
                 if old.get(k) != now.get(k))
      name, old, now = f"{field}.{key}", old.get(key), now.get(key)
    raise ValueError(
        f"{output_dir} already holds a dataset made with a different "
        f"{name} ({old!r}, now {now!r}); choose a new --output_dir or "
        "remove it.")


def _start(output_dir, fingerprint, existing, expected, log):
  """Checks a directory against this run; True if it is complete already."""
  if existing is not None:
    check_same(existing, expected, output_dir)
    missing = [f["name"] for f in existing.files
               if not os.path.exists(os.path.join(output_dir, f["name"]))]
    if missing:
      raise ValueError(f"{output_dir}: metadata.json lists missing shards "
                       f"{missing[:3]}; remove the directory and rerun.")
    log(f"{output_dir}: complete already ({existing.num_instances} "
        "instances); nothing to do.")
    return True
  work_dir = os.path.join(output_dir, WORK_DIR)
  os.makedirs(work_dir, exist_ok=True)
  fp_path = os.path.join(work_dir, "fingerprint.json")
  if os.path.exists(fp_path):
    if json.loads(fileio.read_text(fp_path)) != json.loads(json.dumps(fingerprint)):
      raise ValueError(
          f"{output_dir} holds unfinished work made with other settings, "
          "tokenizer or inputs; choose a new --output_dir or remove it.")
    return False
  stale = sorted(n for n in os.listdir(output_dir)
                 if n.startswith("part-") and n.endswith(".tfrecord"))
  if stale:
    raise ValueError(
        f"{output_dir} holds shards ({stale[0]}, ...) but no metadata.json "
        "or unfinished work of this run; choose a new --output_dir or "
        "remove them.")
  fileio.write_text(fp_path, json.dumps(fingerprint))
  return False


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
  expected = build_metadata(config, tokenizer, source, [0] * S, [0] * S, {})
  if _start(output_dir, _fingerprint(config, tokenizer, shards), existing,
            expected, log):
    return existing
  work_dir = os.path.join(output_dir, WORK_DIR)
  R = partition.num_partitions(shards, config.partition_bytes)
  reads = [s.index for s in shards]
  todo_shards = [s for s in range(S) if not os.path.exists(
      os.path.join(output_dir, records.shard_name(s, S)))]
  start = time.time()
  with _worker_pool(num_workers, max(len(shards), R, len(todo_shards)),
                    config, tokenizer_spec, tokenizer, show_progress) as run:
    read = run("reading input", reads, lambda i: (
        tasks.read_task, shards[i], work_dir, R),
               lambda i: tasks.read_done(work_dir, "read", i))
    mapped = run("creating instances", range(R), lambda r: (
        tasks.map_task, r, work_dir, reads),
                 lambda r: tasks.read_done(work_dir, "map", r))
    map_seconds = time.time() - start
    start = time.time()
    counts = run("writing shards", todo_shards, lambda s: (
        tasks.reduce_task, s, output_dir, work_dir, list(range(R)), S,
        config.spill_bytes, mapper.row_dtype(config, tokenizer.vocab_size)))
  inst = np.sum([d["instances"] for d in mapped.values()], axis=0,
                dtype=np.int64)
  toks = np.sum([d["tokens"] for d in mapped.values()], axis=0,
                dtype=np.int64)
  report = collections.Counter()
  for d in [*read.values(), *mapped.values()]:
    report.update(d["report"])
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
def _worker_pool(num_workers, num_tasks, config, tokenizer_spec, tokenizer,
                 show_progress):
  """Yields `run(desc, indices, task, done=None)`, which runs the tasks of a
  step (task_pool.run_step) in a pool of spawned processes (or here, for one
  worker, with the tokenizer already loaded) and returns their results by
  index."""
  gc_threshold = gc.get_threshold()
  arena = contextlib.nullcontext()
  if num_workers == 1 or num_tasks <= 1:
    threads = tasks.in_process_threads()
    if threads > 1:
      arena = hostmem.one_arena()
    tasks.worker_init(config, tokenizer_spec, tokenizer, threads)
    gc.set_threshold(*tasks.GC_THRESHOLD)
    pool = None
  else:
    pool = concurrent.futures.ProcessPoolExecutor(
        min(num_workers, num_tasks), mp_context=task_pool.spawn_context(),
        initializer=tasks.worker_process_init,
        initargs=(config, tokenizer_spec))

  def run(desc: str, indices, task: Callable[[int], tuple],
          done: Callable[[int], Any] = lambda i: None) -> dict[int, Any]:
    return task_pool.run_step(pool, desc, indices, task, done, show_progress)

  try:
    with arena:
      yield run
  finally:
    gc.set_threshold(*gc_threshold)
    tasks.worker_close()
    if pool is not None:
      pool.shutdown(cancel_futures=True)


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
    lines.append(f"  reading and instances: {map_seconds:.1f}s "
                 f"({metadata.num_instances / max(map_seconds, 1e-9):,.0f}/s), "
                 f"writing: {reduce_seconds:.1f}s")
  lines.append("  report:")
  for k, v in sorted(metadata.report.items()):
    lines.append(f"    {k}: {v:,}")
  return "\n".join(lines)
