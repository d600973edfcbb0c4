"""Parallel, resumable extraction: a source -> balanced text shards + manifest.

The output is the original release's text format, one sentence a line and a
blank line after each document, in `part-XXXXX-of-YYYYY.txt` files, with
`manifest.json` (the settings; input items read and dropped by reason;
documents, sentences, words and bytes written, in all and per file). Two
steps of tasks (bertjax/records/task_pool.py), in worker processes:

extract (one per source shard, sources.py): the shard's documents, in input
  order, -> `_work/extract-XXXXX.txt` (already in the output format) and
  `.npy` (bytes, sentences and words of each document).
write (one per output shard): the driver places documents by their place in
  the whole input: a document whose text starts at byte g of the
  concatenated output goes to shard floor(g * S / total bytes). So shards
  are contiguous runs of the input of equal size (to a document), and the
  bytes depend only on the input and the settings, not on --num_workers or
  --split_mb. Each shard is copied from the extract files, under a temporary
  name, then renamed.

Memory is bounded by one page or book and the read buffers, not by the
input. Resuming: a finished extract task has `_work/extract-XXXXX.json`, a
finished output shard its file; a rerun skips both. `_work/settings.json`
holds the settings and the input's shards; a rerun with another setting is
refused naming the flag. `manifest.json` is written last and `_work/`
removed.
"""

import collections
import concurrent.futures
import dataclasses
import json
import logging
import os
import shutil
import time
from typing import Any, Optional

import numpy as np

from bertjax.corpus import sources
from bertjax.corpus import wikitext
from bertjax.records import fileio
from bertjax.records import task_pool

MANIFEST = "manifest.json"
WORK_DIR = "_work"
_COPY = 4 << 20
_WORKER: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the output depends on, and how the input is cut."""
  source: str
  input_file: str = ""
  tfds_name: str = ""
  tfds_split: str = "train"
  min_words: int = 100
  num_output_shards: int = 64
  split_mb: float = 32.0

  def flags(self) -> dict[str, Any]:
    """The settings by their command-line flags."""
    return {f"--{k}": v for k, v in dataclasses.asdict(self).items()}

  def validate(self) -> None:
    if self.min_words < 0:
      raise ValueError(f"--min_words={self.min_words}: must be >= 0.")
    if self.num_output_shards < 1:
      raise ValueError(f"--num_output_shards={self.num_output_shards}: must "
                       "be >= 1.")
    if self.split_mb <= 0:
      raise ValueError(f"--split_mb={self.split_mb}: must be > 0.")

  def shards(self) -> list[sources.SourceShard]:
    return sources.list_shards(self.source, self.input_file, self.tfds_name,
                               self.tfds_split, int(self.split_mb * 2**20))


def shard_name(k: int, num_shards: int) -> str:
  return f"part-{k:05d}-of-{num_shards:05d}.txt"


def document_bytes(sentences: list[str]) -> bytes:
  """A document in the output format: a sentence a line, then a blank line."""
  return ("\n".join(sentences) + "\n\n").encode("utf-8")


def check_settings(recorded: dict[str, Any], now: dict[str, Any],
                   output_dir: str) -> None:
  """Raises ValueError naming the first flag (or the input) that differs."""
  for key in now:
    if recorded.get(key) != now[key]:
      if key == "inputs":
        raise ValueError(
            f"--input_file: the input changed since {output_dir} was started "
            "(other files or sizes); choose a new --output_dir or remove it.")
      raise ValueError(
          f"{key}={now[key]}: {output_dir} holds work made with "
          f"{key}={recorded.get(key)}; rerun with the same flags, or choose a "
          "new --output_dir or remove it.")


def _start(output_dir: str, record: dict[str, Any], log) -> Optional[dict]:
  """Checks a directory against this run; its manifest if complete."""
  manifest_path = os.path.join(output_dir, MANIFEST)
  if os.path.exists(manifest_path):
    manifest = json.loads(fileio.read_text(manifest_path))
    check_settings(manifest["settings"],
                   {k: v for k, v in record.items() if k != "inputs"},
                   output_dir)
    log(f"{output_dir}: complete already ({manifest['documents']:,} "
        "documents); nothing to do.")
    return manifest
  work_dir = os.path.join(output_dir, WORK_DIR)
  settings_path = os.path.join(work_dir, "settings.json")
  if os.path.exists(settings_path):
    check_settings(json.loads(fileio.read_text(settings_path)), record,
                   output_dir)
    return None
  stale = sorted(n for n in os.listdir(output_dir) if n.startswith("part-"))
  if stale:
    raise ValueError(f"{output_dir} holds shards ({stale[0]}, ...) but no "
                     f"{MANIFEST} or unfinished work of this run; choose a new "
                     "--output_dir or remove them.")
  os.makedirs(work_dir, exist_ok=True)
  fileio.write_text(settings_path, json.dumps(record))
  return None


def _worker_init(settings: Settings, progress: task_pool.Progress) -> None:
  _WORKER.update(settings=settings, progress=progress)


def extract_task(shard: sources.SourceShard, work_dir: str) -> dict[str, Any]:
  """Writes one source shard's documents and their sizes."""
  settings, progress = _WORKER["settings"], _WORKER["progress"]
  base = task_pool.task_dir(work_dir, "extract", shard.index)
  report = collections.Counter()
  sizes, shown = [], 0
  tmp = fileio.temporary_path(base + ".txt")
  with open(tmp, "wb") as f:
    for sentences, words in sources.iter_documents(shard, settings.min_words,
                                                   report):
      data = document_bytes(sentences)
      f.write(data)
      sizes.append((len(data), len(sentences), words))
      if report["read"] - shown >= 64:
        progress.add(report["read"] - shown)
        shown = report["read"]
  progress.add(report["read"] - shown)
  table = np.array(sizes, dtype=np.int64).reshape(-1, 3)
  with open(fileio.temporary_path(base + ".npy"), "wb") as f:
    np.save(f, table)
  os.replace(fileio.temporary_path(base + ".npy"), base + ".npy")
  os.replace(tmp, base + ".txt")
  total = table.sum(axis=0)
  return task_pool.finish(work_dir, "extract", shard.index, {
      "index": shard.index, "report": dict(report), "documents": len(table),
      "bytes": int(total[0]), "sentences": int(total[1]),
      "words": int(total[2])})


def plan_shards(extracted: dict[int, dict], num_output_shards: int,
                work_dir: str):
  """(S, each output shard's segments [(extract task, start, end)], each
  shard's [documents, bytes, sentences, words]). A document starting at byte
  g of the whole output goes to shard g * S // total."""
  total = sum(r["bytes"] for r in extracted.values())
  docs = sum(r["documents"] for r in extracted.values())
  S = max(1, min(num_output_shards, docs))
  segments = [[] for _ in range(S)]
  stats = np.zeros((S, 4), dtype=np.int64)
  offset = 0
  for i in sorted(extracted):
    if not extracted[i]["documents"]:
      continue
    table = np.load(task_pool.task_dir(work_dir, "extract", i) + ".npy")
    local = np.cumsum(table[:, 0]) - table[:, 0]
    shard = (offset + local) * S // total
    for k in np.unique(shard).tolist():
      rows = table[shard == k]
      start = int(local[shard == k][0])
      segments[k].append((i, start, start + int(rows[:, 0].sum())))
      stats[k] += [len(rows), *rows.sum(axis=0).tolist()]
    offset += extracted[i]["bytes"]
  return S, segments, stats


def write_task(path: str, segments, work_dir: str) -> int:
  """Writes one output shard from its segments of the extract files."""
  tmp = fileio.temporary_path(path)
  written = 0
  with open(tmp, "wb") as out:
    for i, start, end in segments:
      with open(task_pool.task_dir(work_dir, "extract", i) + ".txt", "rb") as f:
        f.seek(start)
        while start < end:
          data = f.read(min(_COPY, end - start))
          if not data:
            raise RuntimeError(f"{f.name}: shorter than its sizes say.")
          out.write(data)
          start += len(data)
          written += len(data)
  os.replace(tmp, path)
  return written


def build_manifest(settings: Settings, extracted: dict[int, dict], S: int,
                   stats: np.ndarray) -> dict[str, Any]:
  """manifest.json: settings, counts, and each file's contents."""
  report = collections.Counter()
  for r in extracted.values():
    report.update(r["report"])
  unit = sources.unit(settings.source, settings.tfds_name)
  dropped = {k.split(".", 1)[1]: v for k, v in sorted(report.items())
             if k.startswith("dropped.")}
  totals = stats.sum(axis=0).tolist() if len(stats) else [0, 0, 0, 0]
  return {
      "settings": settings.flags(),
      f"{unit}_read": report.get("read", 0),
      f"{unit}_dropped": dropped,
      "documents": totals[0], "bytes": totals[1], "sentences": totals[2],
      "words": totals[3],
      "removed": {k: v for k, v in sorted(report.items())
                  if k != "read" and not k.startswith("dropped.")},
      "files": [{"name": shard_name(k, S), "documents": int(d), "bytes": int(b),
                 "sentences": int(s), "words": int(w)}
                for k, (d, b, s, w) in enumerate(stats.tolist())],
  }


def format_report(manifest: dict[str, Any], output_dir: str,
                  seconds: float = 0.0) -> str:
  unit = next(k for k in manifest if k.endswith("_read"))[:-len("_read")]
  read = manifest[f"{unit}_read"]
  lines = [f"Wrote {manifest['documents']:,} documents ({manifest['sentences']:,} "
           f"sentences, {manifest['words']:,} words) to "
           f"{len(manifest['files'])} shards in {output_dir}",
           f"  {unit} read: {read:,}"
           + (f" in {seconds:.1f}s ({read / max(seconds, 1e-9):,.0f}/s)"
              if seconds else "")]
  for k, v in manifest[f"{unit}_dropped"].items():
    lines.append(f"  {unit} dropped, {k.replace('_', ' ')}: {v:,}")
  return "\n".join(lines)


def extract(settings: Settings, output_dir: str,
            num_workers: Optional[int] = None, show_progress: bool = True,
            log=print) -> dict[str, Any]:
  """Extracts (or finishes extracting) a corpus; returns its manifest."""
  settings.validate()
  num_workers = num_workers or os.cpu_count() or 1
  if num_workers < 1:
    raise ValueError(f"--num_workers={num_workers}: must be at least 1.")
  if fileio.is_remote(output_dir):
    raise ValueError(f"--output_dir={output_dir}: the local runner writes "
                     "local files; use --runner=beam:... for remote output.")
  if settings.source == "wikipedia" and not wikitext.C_TOKENIZER:
    logging.warning("mwparserfromhell's C tokenizer is not installed: "
                    "extraction runs about ten times slower.")
  start_time = time.time()
  shards = settings.shards()
  os.makedirs(output_dir, exist_ok=True)
  record = {**settings.flags(), "inputs": [s.describe() for s in shards]}
  manifest = _start(output_dir, record, log)
  if manifest is not None:
    return manifest
  work_dir = os.path.join(output_dir, WORK_DIR)
  progress = task_pool.Progress(sources.unit(settings.source,
                                             settings.tfds_name))
  pool = None
  if num_workers > 1 and len(shards) > 1:
    pool = concurrent.futures.ProcessPoolExecutor(
        min(num_workers, len(shards)), mp_context=task_pool.spawn_context(),
        initializer=_worker_init, initargs=(settings, progress))
  else:
    _worker_init(settings, progress)
  try:
    extracted = task_pool.run_step(
        pool, "extracting", [s.index for s in shards],
        lambda i: (extract_task, shards[i], work_dir),
        lambda i: task_pool.read_done(work_dir, "extract", i),
        show_progress, progress)
    S, segments, stats = plan_shards(extracted, settings.num_output_shards,
                                     work_dir)
    names = [shard_name(k, S) for k in range(S)]
    task_pool.run_step(
        pool, "writing shards", range(S),
        lambda k: (write_task, os.path.join(output_dir, names[k]),
                   segments[k], work_dir),
        lambda k: (True if os.path.exists(os.path.join(output_dir, names[k]))
                   else None),
        show_progress)
  finally:
    if pool is not None:
      pool.shutdown(cancel_futures=True)
  manifest = build_manifest(settings, extracted, S, stats)
  fileio.write_text(os.path.join(output_dir, MANIFEST),
                    json.dumps(manifest, indent=1) + "\n")
  shutil.rmtree(work_dir, ignore_errors=True)
  log(format_report(manifest, output_dir, time.time() - start_time))
  check_not_empty(manifest, output_dir)
  return manifest


def check_not_empty(manifest: dict[str, Any], output_dir: str) -> None:
  """Raises ValueError naming the directory if no document was written."""
  if manifest["documents"]:
    return
  unit = next(k for k in manifest if k.endswith("_read"))[:-len("_read")]
  raise ValueError(f"{output_dir}: no document was written (every one of the "
                   f"{manifest[f'{unit}_read']:,} {unit} read was dropped: "
                   f"{manifest[f'{unit}_dropped']}); see {MANIFEST}.")
