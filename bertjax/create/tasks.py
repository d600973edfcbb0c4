"""The three tasks of local creation, run in worker processes or in-process.

read (one per input shard): the shard's documents -> spill runs of their
  texts by partition (partition.py), sorted by document key.
map (one per partition): the partition's documents, merged from every read
  task's runs in key order -> instances -> spill runs of their rows
  (mapper.row_dtype) by output shard, sorted by record key (mapper.py).
reduce (one per output shard): the shard's rows, merged from every map
  task's runs in key order, serialised and streamed into the shard file and
  its index.

A task is done when its `<work>/<kind>-XXXXX.json` exists (written last,
atomically); its runs are in `<work>/<kind>-XXXXX/`. Memory is bounded by
`spill_bytes` (buffers and merge blocks) and the chunk size, not by the
size of the input, a partition or an output shard.
"""

import collections
import gc
import os
import shutil
from typing import Any, Sequence

from bertjax.create import documents
from bertjax.create import mapper
from bertjax.create import partition
from bertjax.create import records
from bertjax.create import spills
from bertjax.records import task_pool

_WORKER = {}
# The cyclic garbage collector's thresholds while tasks run. Creation makes
# millions of short-lived objects and few reference cycles; collecting the
# youngest generation every 10,000 allocations instead of Python's 700 takes
# its share of a run's CPU time from about 3% to 1%.
GC_THRESHOLD = (10_000, 10, 10)
FRAME_ROWS = 4096  # Rows the reduce step serialises and writes at once.
FRAME_THREADS = 2  # At most this many threads serialise them (in_process_threads).


def worker_init(config: mapper.CreationConfig,
                tokenizer_spec: mapper.TokenizerSpec, tokenizer=None,
                frame_threads: int = 1) -> None:
  """Sets what the tasks of this process share: the tokenizer, loaded from
  the spec on demand unless given (the one already loaded in this process),
  and the threads the reduce step serialises records on."""
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  _WORKER.clear()
  _WORKER.update(config=config, spec=tokenizer_spec, tokenizer=tokenizer,
                 frame_threads=frame_threads)


def worker_close() -> None:
  """Stops this process's serialising threads (in-process runs)."""
  encoder = _WORKER.pop("encoder", None)
  if encoder is not None:
    encoder.close()


def in_process_threads() -> int:
  """Threads for the reduce step's serialising when one process runs every
  task: the cores it may use, up to FRAME_THREADS."""
  cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
           else os.cpu_count() or 1)
  return max(1, min(FRAME_THREADS, cores))


def worker_process_init(config: mapper.CreationConfig,
                        tokenizer_spec: mapper.TokenizerSpec) -> None:
  """worker_init for a worker process of a pool (one thread: the pool's
  processes use the cores), which also collects garbage at GC_THRESHOLD."""
  gc.set_threshold(*GC_THRESHOLD)
  worker_init(config, tokenizer_spec)


def _mapper() -> mapper.ShardMapper:
  if "mapper" not in _WORKER:
    tokenizer = _WORKER["tokenizer"]
    if tokenizer is None:
      tokenizer = _WORKER["spec"].load()
    _WORKER["mapper"] = mapper.ShardMapper(_WORKER["config"], tokenizer)
  return _WORKER["mapper"]


# A task's directory of runs, and its result file (task_pool).
task_dir = task_pool.task_dir
read_done = task_pool.read_done
_finish = task_pool.finish


def _fresh_dir(path: str) -> str:
  shutil.rmtree(path, ignore_errors=True)
  os.makedirs(path)
  return path


def read_task(shard: documents.InputShard, work_dir: str,
              num_partitions: int) -> dict[str, Any]:
  """Deals one input shard's documents into partitions."""
  config = _WORKER["config"]
  report = collections.Counter()
  writer = spills.SpillWriter(
      _fresh_dir(task_dir(work_dir, "read", shard.index)), num_partitions,
      partition.DOC_KEY.size, config.spill_bytes)
  for parts, keys, blob, lengths in partition.read_shard(
      shard, config.random_seed, num_partitions, report):
    writer.add(parts, keys, blob, lengths)
  writer.flush()
  return _finish(work_dir, "read", shard.index,
                 {"index": shard.index, "report": dict(report)})


def map_task(part: int, work_dir: str, read_indices: Sequence[int]
             ) -> dict[str, Any]:
  """Makes the instances of one partition, spilled by output shard."""
  shard_mapper = _mapper()
  config = shard_mapper.config
  S = config.num_output_shards
  runs = spills.list_runs([task_dir(work_dir, "read", i)
                           for i in read_indices])
  docs = (doc for _, blob, lengths in spills.merge_part(
      runs, part, partition.DOC_KEY.size, config.spill_bytes)
          for doc in partition.documents_of(blob, lengths))
  report = collections.Counter()
  writer = spills.SpillWriter(_fresh_dir(task_dir(work_dir, "map", part)), S,
                              mapper.SORT_KEY.size, config.spill_bytes)
  for batch in shard_mapper.map_partition(part, docs, report):
    writer.add_rows(batch.shards, batch.keys, batch.rows)
  writer.flush()
  inst, toks, plain = mapper.split_report(report, S)
  return _finish(work_dir, "map", part, {
      "index": part, "instances": inst, "tokens": toks, "report": plain})


def reduce_task(shard_index: int, output_dir: str, work_dir: str,
                map_indices: Sequence[int], num_shards: int,
                block_bytes: int, row_dtype) -> int:
  """Writes one output shard: its records from every map task in key order
  (row_dtype: mapper.row_dtype of the run)."""
  config = _WORKER["config"]
  if "encoder" not in _WORKER:
    _WORKER["encoder"] = records.ExampleEncoder(config.max_seq_length,
                                                config.max_predictions_per_seq,
                                                _WORKER["frame_threads"])
  runs = spills.list_runs([task_dir(work_dir, "map", m) for m in map_indices])
  path = os.path.join(output_dir, records.shard_name(shard_index, num_shards))
  with records.FramedShardWriter(path) as writer:
    for _, rows, _ in spills.merge_part(runs, shard_index, mapper.SORT_KEY.size,
                                        block_bytes, row_dtype):
      for a in range(0, len(rows), FRAME_ROWS):
        writer.write(*mapper.frame(_WORKER["encoder"], rows[a:a + FRAME_ROWS]))
  return writer.count
