"""Pretraining data creation as an Apache Beam pipeline.

The same steps as the local driver: input shards are read and their
documents dealt into partitions (partition.read_shard), a GroupByKey on the
partition and a sort by document key give each partition's documents in the
same order, the same map step (`mapper.ShardMapper`) runs per partition, and
a GroupByKey on the output shard replaces the local spill files; each output
shard is sorted by the same (key, origin) before it is written.
So the shards are byte-identical to those of `creation.create_pretraining_data`
with the same inputs and settings, on any runner (DirectRunner in tests;
Dataflow, Flink or Spark with `--runner=beam:DataflowRunner` and the usual
Beam pipeline options after the flags).

Needs the optional `beam` extra (`pip install bertjax[beam]`). The launcher
writes metadata.json once the pipeline has finished. One output shard is
sorted in a worker's memory, so choose --num_output_shards to keep shards
below a few hundred MB.
"""

import collections
import json
import os
from typing import Optional, Sequence

import numpy as np

from bertjax.create import creation
from bertjax.create import documents
from bertjax.create import mapper
from bertjax.create import partition
from bertjax.create import records
from bertjax.records import fileio
from bertjax.records import schema
from bertjax.records import tfrecord


def _dofns(config, tokenizer_spec, num_parts):
  """The (ReadShard, MapPartition) DoFn classes of a run."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top

  @beam.typehints.with_output_types(tuple[int, tuple[bytes, bytes]])
  class ReadShard(beam.DoFn):
    """One input shard -> (partition, (document key, text)) + its stats."""

    def process(self, shard):
      report = collections.Counter()
      for parts, keys, blob, lengths in partition.read_shard(
          shard, config.random_seed, num_parts, report):
        ends = np.cumsum(lengths).tolist()
        for p, key, a, b in zip(parts.tolist(), keys.tolist(),
                                [0] + ends[:-1], ends):
          yield p, (key.ljust(partition.DOC_KEY.size, b"\0"), blob[a:b])
      yield beam.pvalue.TaggedOutput("stats", {"report": dict(report)})

  @beam.typehints.with_output_types(tuple[int, tuple[bytes, bytes]])
  class MapPartition(beam.DoFn):
    """A partition's documents -> (output shard, (sort key, record))."""

    def setup(self):
      self.mapper = mapper.ShardMapper(config, tokenizer_spec.load())

    def process(self, item):
      part, entries = item
      docs = (text.decode("utf-8").split("\n")
              for _, text in sorted(entries, key=lambda e: e[0]))
      report = collections.Counter()
      for out, key, data in self.mapper.map_records(part, docs, report):
        yield out, (key, data)
      inst, toks, plain = mapper.split_report(
          report, config.num_output_shards)
      yield beam.pvalue.TaggedOutput("stats", {
          "instances": inst, "tokens": toks, "report": plain})

  return ReadShard, MapPartition


def _write_shard(item, output_dir, num_shards):
  """Writes one output shard's records, sorted by key, and its index."""
  shard_index, entries = item
  entries = sorted(entries, key=lambda e: e[0])
  path = os.path.join(output_dir, records.shard_name(shard_index, num_shards))
  data, index = records.shard_bytes(e[1] for e in entries)
  # The index first, then the shard: a shard file, once there, is complete
  # and has its index (each written whole, through a temporary locally).
  fileio.write_bytes(tfrecord.index_path(path), index)
  fileio.write_bytes(path, data)
  return shard_index, len(entries)


def _merge_stats(stats_list, num_shards):
  total = {"instances": [0] * num_shards, "tokens": [0] * num_shards,
           "report": {}}
  for st in stats_list:
    for k in ("instances", "tokens"):
      if k in st:
        total[k] = [a + b for a, b in zip(total[k], st[k])]
    for k, v in st["report"].items():
      total["report"][k] = total["report"].get(k, 0) + v
  return total


def _write_stats(stats, written, output_dir):
  path = os.path.join(output_dir, creation.WORK_DIR, "beam_stats.json")
  fileio.write_text(path, json.dumps({"stats": stats, "written": dict(written)}))


def _build(pipeline, shards, tokenizer_spec, config, output_dir):
  """Adds the creation transforms to `pipeline`."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  S = config.num_output_shards
  read_shard, map_partition = _dofns(
      config, tokenizer_spec,
      partition.num_partitions(shards, config.partition_bytes))
  read = (pipeline
          | "InputShards" >> beam.Create(list(shards))
          | "Reshuffle" >> beam.Reshuffle()
          | "ReadShards" >> beam.ParDo(read_shard()).with_outputs(
              "stats", main="documents"))
  mapped = (read.documents
            | "GroupByPartition" >> beam.GroupByKey()
            | "MapPartitions" >> beam.ParDo(map_partition()).with_outputs(
                "stats", main="records"))
  written = (mapped.records
             | "GroupByShard" >> beam.GroupByKey()
             | "WriteShards" >> beam.Map(_write_shard, output_dir, S))
  stats = ((read.stats, mapped.stats) | "AllStats" >> beam.Flatten()
           | "MergeStats" >> beam.CombineGlobally(_merge_stats, S))
  _ = (stats
       | "WriteStats" >> beam.Map(_write_stats,
                                  written=beam.pvalue.AsList(written),
                                  output_dir=output_dir))


def run_beam(shards: Sequence[documents.InputShard],
             tokenizer_spec: creation.TokenizerSpec,
             config: creation.CreationConfig, output_dir: str,
             runner: str = "DirectRunner", source: str = "",
             pipeline_args: Optional[Sequence[str]] = None,
             log=print) -> schema.DatasetMetadata:
  """Runs the Beam pipeline and writes metadata.json; returns the metadata."""
  try:
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
    from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError("--runner=beam:... needs Apache Beam: "
                     "pip install 'bertjax[beam]'.") from e
  config.validate()
  tokenizer = tokenizer_spec.load()
  existing = schema.read_metadata(output_dir)
  if existing is not None:
    creation.check_same(
        existing, creation.build_metadata(config, tokenizer, source, [], [],
                                          {}), output_dir)
    log(f"{output_dir}: complete already; nothing to do.")
    return existing
  fileio.makedirs(os.path.join(output_dir, creation.WORK_DIR))
  options = pipeline_options.PipelineOptions(
      list(pipeline_args or []) + [f"--runner={runner}"])
  with beam.Pipeline(options=options) as p:
    _build(p, shards, tokenizer_spec, config, output_dir)
  result = json.loads(fileio.read_text(
      os.path.join(output_dir, creation.WORK_DIR, "beam_stats.json")))
  stats, written = result["stats"], {int(k): v for k, v in
                                     result["written"].items()}
  S = config.num_output_shards
  for s in range(S):
    path = os.path.join(output_dir, records.shard_name(s, S))
    if s not in written:  # No instance fell into this shard.
      if stats["instances"][s]:
        raise RuntimeError(f"shard {s} was not written.")
      fileio.write_bytes(tfrecord.index_path(path), b"")
      fileio.write_bytes(path, b"")
    elif written[s] != stats["instances"][s]:
      raise RuntimeError(f"shard {s}: wrote {written[s]} records, mapped "
                         f"{stats['instances'][s]}.")
  metadata = creation.build_metadata(config, tokenizer, source,
                                     stats["instances"], stats["tokens"],
                                     stats["report"])
  schema.write_metadata(output_dir, metadata)
  if not fileio.is_remote(output_dir):
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(os.path.join(output_dir, creation.WORK_DIR),
                  ignore_errors=True)
  log(creation.format_report(metadata, output_dir))
  return metadata
