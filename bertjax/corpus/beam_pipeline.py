"""Corpus extraction as an Apache Beam pipeline (Dataflow, Flink, Spark).

The same steps as the local driver (extraction.py): each source shard's
documents are extracted in input order (sources.iter_documents) with their
place in the shard; the shards' sizes, a side input, place every document in
the output shard extraction.plan_shards would (a document starting at byte g
of the whole output goes to shard g * S // total); a GroupByKey on the
output shard and a sort by place give each file its documents in input
order. So the files are byte-identical to the local driver's with the same
input and settings, on any runner (DirectRunner in tests; Dataflow with
`--runner=beam:DataflowRunner` and the usual Beam pipeline options after the
flags). The launcher writes manifest.json once the pipeline has finished.
One output shard is joined in a worker's memory: choose
--num_output_shards to keep shards below a few hundred MB.

Needs the optional `beam` extra (`pip install bertjax[beam]`).
"""

import json
import os
from typing import Optional, Sequence

import numpy as np

from bertjax.corpus import extraction
from bertjax.corpus import sources
from bertjax.records import fileio


def _dofns(settings: extraction.Settings):
  """The (ExtractShard, Place) DoFn classes of a run."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  import collections  # pylint: disable=g-import-not-at-top

  class ExtractShard(beam.DoFn):
    """A source shard -> (shard, n, offset in shard, text, sentences, words)
    per document, and the shard's counts."""

    def process(self, shard):
      report = collections.Counter()
      n = offset = 0
      for sentences, words in sources.iter_documents(
          shard, settings.min_words, report):
        data = extraction.document_bytes(sentences)
        yield shard.index, n, offset, data, len(sentences), words
        n, offset = n + 1, offset + len(data)
      yield beam.pvalue.TaggedOutput("stats", (shard.index, {
          "index": shard.index, "report": dict(report), "documents": n,
          "bytes": offset}))

  class Place(beam.DoFn):
    """A document -> (output shard, (its place, text, sentences, words))."""

    def process(self, doc, stats):
      key = id(stats)
      if getattr(self, "_key", None) != key:
        totals = dict(stats)
        self._S = max(1, min(settings.num_output_shards,
                             sum(t["documents"] for t in totals.values())))
        self._total = sum(t["bytes"] for t in totals.values())
        before, self._offsets = 0, {}
        for i in sorted(totals):
          self._offsets[i] = before
          before += totals[i]["bytes"]
        self._key = key
      index, n, offset, data, sentences, words = doc
      k = (self._offsets[index] + offset) * self._S // self._total
      yield k, ((index, n), data, sentences, words)

  return ExtractShard, Place


def _write_shard(item, output_dir: str, stats):
  """Writes one output shard's documents in input order."""
  k, entries = item
  entries = sorted(entries, key=lambda e: e[0])
  S = max(1, min(stats[0], stats[1]))
  data = b"".join(e[1] for e in entries)
  fileio.write_bytes(os.path.join(output_dir, extraction.shard_name(k, S)), data)
  return k, [len(entries), len(data), sum(e[2] for e in entries),
             sum(e[3] for e in entries)]


def _build(pipeline, shards, settings: extraction.Settings, output_dir: str):
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  extract_shard, place = _dofns(settings)
  extracted = (pipeline
               | "SourceShards" >> beam.Create(list(shards))
               | "Reshuffle" >> beam.Reshuffle()
               | "Extract" >> beam.ParDo(extract_shard()).with_outputs(
                   "stats", main="documents"))
  stats = extracted.stats | "AllStats" >> beam.combiners.ToList()
  counts = (stats | "Counts" >> beam.Map(lambda s: (
      settings.num_output_shards, sum(t["documents"] for _, t in s))))
  written = (extracted.documents
             | "Place" >> beam.ParDo(place(), beam.pvalue.AsSingleton(stats))
             | "GroupByShard" >> beam.GroupByKey()
             | "WriteShards" >> beam.Map(_write_shard, output_dir,
                                         beam.pvalue.AsSingleton(counts)))
  _ = (stats | "WriteStats" >> beam.Map(
      _write_stats, written=beam.pvalue.AsList(written), output_dir=output_dir))


def _write_stats(stats, written, output_dir):
  fileio.write_text(os.path.join(output_dir, extraction.WORK_DIR,
                                 "beam_stats.json"),
                    json.dumps({"stats": [t for _, t in stats],
                                "written": {k: v for k, v in written}}))


def run_beam(settings: extraction.Settings, output_dir: str,
             runner: str = "DirectRunner",
             pipeline_args: Optional[Sequence[str]] = None,
             log=print) -> dict:
  """Runs the Beam pipeline and writes manifest.json; returns it."""
  try:
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
    from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError("--runner=beam:... needs Apache Beam: "
                     "pip install 'bertjax[beam]'.") from e
  settings.validate()
  manifest_path = os.path.join(output_dir, extraction.MANIFEST)
  if fileio.exists(manifest_path):
    manifest = json.loads(fileio.read_text(manifest_path))
    extraction.check_settings(manifest["settings"], settings.flags(),
                              output_dir)
    log(f"{output_dir}: complete already; nothing to do.")
    return manifest
  shards = settings.shards()
  fileio.makedirs(os.path.join(output_dir, extraction.WORK_DIR))
  options = pipeline_options.PipelineOptions(
      list(pipeline_args or []) + [f"--runner={runner}"])
  with beam.Pipeline(options=options) as p:
    _build(p, shards, settings, output_dir)
  result = json.loads(fileio.read_text(
      os.path.join(output_dir, extraction.WORK_DIR, "beam_stats.json")))
  extracted = {t["index"]: t for t in result["stats"]}
  docs = sum(t["documents"] for t in extracted.values())
  S = max(1, min(settings.num_output_shards, docs))
  stats = np.zeros((S, 4), dtype=np.int64)
  for k in range(S):
    if str(k) in result["written"]:
      stats[k] = result["written"][str(k)]
    else:  # No document starts in this shard.
      fileio.write_bytes(os.path.join(output_dir, extraction.shard_name(k, S)),
                         b"")
  manifest = extraction.build_manifest(settings, extracted, S, stats)
  fileio.write_text(manifest_path, json.dumps(manifest, indent=1) + "\n")
  if not fileio.is_remote(output_dir):
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(os.path.join(output_dir, extraction.WORK_DIR),
                  ignore_errors=True)
  log(extraction.format_report(manifest, output_dir))
  extraction.check_not_empty(manifest, output_dir)
  return manifest
