"""Pretraining data creation as an Apache Beam pipeline.

The same map step as the local driver (`mapper.ShardMapper`) runs per input
shard; a GroupByKey on the output shard replaces the local spill files, and
each output shard is sorted by the same (key, origin) before it is written.
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

from bertjax.create import creation
from bertjax.create import documents
from bertjax.create import mapper
from bertjax.create import records
from bertjax.records import fileio
from bertjax.records import schema


def _build(pipeline, shards, tokenizer_spec, config, output_dir):
  """Adds the creation transforms to `pipeline`."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top

  @beam.typehints.with_output_types(tuple[int, tuple[bytes, bytes]])
  class MapShard(beam.DoFn):
    """One input shard -> (output shard, (sort key, record)) + its stats."""

    def setup(self):
      self.mapper = mapper.ShardMapper(config, tokenizer_spec.load())

    def process(self, shard):
      report = collections.Counter()
      for out, key, data in self.mapper.map_shard(shard, report):
        yield out, (key, data)
      inst, toks, plain = mapper.split_report(
          report, config.num_output_shards)
      yield beam.pvalue.TaggedOutput("stats", {
          "instances": inst, "tokens": toks, "report": plain})

  def write_shard(item):
    shard_index, entries = item
    entries = sorted(entries, key=lambda e: e[0])
    path = os.path.join(
        output_dir, records.shard_name(shard_index, config.num_output_shards))
    data, index = records.shard_bytes(e[1] for e in entries)
    # The index first, then the shard: a shard file, once there, is complete
    # and has its index (each written whole, through a temporary locally).
    fileio.write_bytes(path + records.INDEX_SUFFIX, index)
    fileio.write_bytes(path, data)
    return shard_index, len(entries)

  def merge_stats(stats_list):
    S = config.num_output_shards
    total = {"instances": [0] * S, "tokens": [0] * S, "report": {}}
    for st in stats_list:
      for k in ("instances", "tokens"):
        total[k] = [a + b for a, b in zip(total[k], st[k])]
      for k, v in st["report"].items():
        total["report"][k] = total["report"].get(k, 0) + v
    return total

  def write_stats(stats, written):
    path = os.path.join(output_dir, creation.WORK_DIR, "beam_stats.json")
    fileio.write_text(path, json.dumps({"stats": stats, "written": dict(written)}))

  mapped = (pipeline
            | "InputShards" >> beam.Create(list(shards))
            | "Reshuffle" >> beam.Reshuffle()
            | "MapShards" >> beam.ParDo(MapShard()).with_outputs(
                "stats", main="records"))
  written = (mapped.records
             | "GroupByShard" >> beam.GroupByKey()
             | "WriteShards" >> beam.Map(write_shard))
  stats = mapped.stats | "MergeStats" >> beam.CombineGlobally(merge_stats)
  _ = (stats
       | "WriteStats" >> beam.Map(write_stats,
                                  written=beam.pvalue.AsList(written)))


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
    creation._check_same(  # pylint: disable=protected-access
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
      fileio.write_bytes(path + records.INDEX_SUFFIX, b"")
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
