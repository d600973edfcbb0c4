"""Pretraining data creation: speed against the original release, and memory.

  pip install -e ".[bench]"  # The original release (bert-tensorflow 1.0.4).
  python -m bertjax.benchmarks.create_data_bench [--mb 20] [--repeat 3]
      [--dupe_factor 10] [--max_seq_length 128] [--workers 2]
  python -m bertjax.benchmarks.create_data_bench --peak_rss 2,20
  python -m bertjax.benchmarks.create_data_bench --whole_process [--baseline DIR]
      [--sizes_mb 10,20,40] [--skip_reference]
      [--corpus_file CORPUS --vocab_file VOCAB]

The corpus is text no part of which is repeated: docstrings of the installed
packages (corpus.py), `--mb` megabytes of it, one sentence per line, with a
WordPiece vocab built on it. Speed: paired runs, alternating, on the same
corpus, vocab and flags, each pair in turn:

* the original: google-research/bert's create_pretraining_data.py itself,
  as PyPI's bert-tensorflow package ships it, run in this process (imports
  not timed) with the same flags;
* bertjax with one worker process and the tokenizer on one thread (per-core
  figures), and with --workers processes.

Prints every run, then per configuration the median and range of
instances/s and of its ratio to the original's run of the same pair.

--whole_process runs each side as a fresh command-line process, its start-up
and imports included: the original's `python -m bert.create_pretraining_data`
and `python -m bertjax.create_data` (with --workers processes), in paired,
alternating runs; with --baseline DIR, also `python -m bertjax.create_data`
from the checkout at DIR (e.g. an older commit) in each pair; with
--also_workers N,..., also bertjax with N worker processes. Per run: wall
seconds, CPU seconds (user + system of the process and its workers) and the
peak resident memory of each of the process and its workers, summed (each
process's high-water mark, VmHWM, read from /proc every 20 ms, so no short
peak is missed; the sum is at least the peak of the total); then medians and ranges, and ratios to the original's run
of the same pair. Each bertjax checkout is byte-compiled first (`python -m
compileall`), as pip byte-compiles the original's installed package, and
every side runs from the scratch directory (from a checkout, `python -m`
would import that checkout's bertjax whatever PYTHONPATH says).

--sizes_mb SIZES repeats the runs on the first SIZES megabytes of one
corpus (its vocab built on the largest), to show how time and memory grow
with the corpus; --skip_reference leaves the original out. --corpus_file and
--vocab_file use a corpus and vocab written before (e.g. by corpus.py and
bertjax.text.vocab) instead of building them, which takes minutes.

--peak_rss SIZES runs bertjax (one process, one output shard, so the shard
grows with the corpus) on corpora of the given sizes in megabytes, each in a
fresh process, and prints the resident memory before creation and its peak
during creation (Linux: VmHWM of /proc/self/status, reset before). Figures depend on the machine; nothing here is a test.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bertjax.benchmarks import corpus as corpus_lib
from bertjax.create import creation
from bertjax.create import documents


# --- The original. -----------------------------------------------------------

def run_original(input_file, vocab_file, output_file, max_seq_length,
                 max_pred, dupe_factor, seed=12345):
  """Runs the original script; returns (seconds, instances)."""
  try:
    from bert import create_pretraining_data as original  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit("The original script comes from the bert-tensorflow "
                     "package: pip install -e \".[bench]\" (or pass "
                     "--skip_reference).") from e
  original.FLAGS([
      "create_pretraining_data", f"--input_file={input_file}",
      f"--output_file={output_file}", f"--vocab_file={vocab_file}",
      "--do_lower_case=True", f"--max_seq_length={max_seq_length}",
      f"--max_predictions_per_seq={max_pred}", f"--random_seed={seed}",
      f"--dupe_factor={dupe_factor}", "--masked_lm_prob=0.15",
      "--short_seq_prob=0.1"])
  start = time.time()
  original.main(None)
  seconds = time.time() - start
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  count = sum(1 for _ in tf.data.TFRecordDataset(output_file))
  return seconds, count


# --- bertjax. ----------------------------------------------------------------

def run_bertjax(corpus, vocab, config, out, workers):
  """Runs bertjax; returns (seconds, instances)."""
  shutil.rmtree(out, ignore_errors=True)
  start = time.time()
  md = creation.create_pretraining_data(
      documents.list_input_shards(corpus),
      creation.TokenizerSpec("wordpiece", vocab, True), config, out,
      num_workers=workers, show_progress=False, log=lambda *a: None)
  return time.time() - start, md.num_instances


# --- Whole processes. -------------------------------------------------------

def _tree_hwm_kib(pid: int, hwm: dict[int, int]) -> None:
  """Updates hwm[p], the peak resident memory (VmHWM, KiB) of `pid` and of
  each of its descendants (Linux /proc)."""
  children = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          parent = int(f.read().rsplit(")", 1)[1].split()[1])
      except (OSError, IndexError, ValueError):
        continue
      children.setdefault(parent, []).append(int(entry))
  todo = [pid]
  while todo:
    p = todo.pop()
    todo.extend(children.get(p, ()))
    try:
      with open(f"/proc/{p}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
      hwm[p] = max(hwm.get(p, 0), kib)
    except (OSError, StopIteration):
      pass


def run_process(argv, env=None, cwd=None) -> dict:
  """Runs a command; returns its wall and CPU seconds and peak tree memory."""
  with tempfile.TemporaryFile() as err:
    start = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,  # pylint: disable=consider-using-with
                            stderr=err)
    hwm = {}
    while True:
      pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
      if pid:
        break
      _tree_hwm_kib(proc.pid, hwm)
      time.sleep(0.02)
    peak = sum(hwm.values()) / 1024
    seconds = time.time() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
      err.seek(0)
      raise RuntimeError(f"{' '.join(argv)} failed:\n"
                         f"{err.read().decode(errors='replace')[-3000:]}")
  # The child's CPU time includes that of its workers, which it waited for.
  return {"wall": seconds, "cpu": usage.ru_utime + usage.ru_stime, "peak_mib": peak}


def whole_process(args, tmp, corpus, vocab):
  """Paired, alternating whole-process runs (module docstring)."""
  common = [f"--max_seq_length={args.max_seq_length}",
            f"--max_predictions_per_seq={args.max_predictions_per_seq}",
            f"--dupe_factor={args.dupe_factor}", "--random_seed=12345",
            f"--vocab_file={vocab}", f"--input_file={corpus}", "--do_lower_case=True"]
  out = os.path.join(tmp, "out")

  def bertjax_argv(workers):
    return [sys.executable, "-m", "bertjax.create_data", *common,
            f"--output_dir={out}", f"--num_workers={workers}", "--no_progress"]

  sides = []
  if not args.skip_reference:
    sides.append(("original", [sys.executable, "-m", "bert.create_pretraining_data", *common,
                               f"--output_file={out}.tfrecord", "--masked_lm_prob=0.15",
                               "--short_seq_prob=0.1"], None))
  here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if args.baseline:
    sides.append(("baseline", bertjax_argv(args.workers),
                  dict(os.environ, PYTHONPATH=args.baseline)))
  sides.append(("bertjax", bertjax_argv(args.workers), dict(os.environ, PYTHONPATH=here)))
  for w in [int(x) for x in args.also_workers.split(",") if x]:
    sides.append((f"bertjax {w}w", bertjax_argv(w), dict(os.environ, PYTHONPATH=here)))
  # Each checkout's modules byte-compiled first, as pip compiles installed
  # packages (the original's among them) and as Python does on a first run:
  # with PYTHONDONTWRITEBYTECODE set, every run would compile bertjax again.
  for checkout in {here, args.baseline} - {""}:
    subprocess.run([sys.executable, "-m", "compileall", "-q",
                    os.path.join(checkout, "bertjax")], check=True, stdout=subprocess.DEVNULL)
  results = {name: [] for name, _, _ in sides}
  for r in range(args.repeat):
    for name, argv, env in sides:
      shutil.rmtree(out, ignore_errors=True)
      # From the scratch directory: `python -m` puts the working directory
      # first on sys.path, ahead of PYTHONPATH, so from a checkout every side
      # would import that checkout's bertjax.
      got = run_process(argv, env, cwd=tmp)
      results[name].append(got)
      print(f"pair {r}: {name:<11} {got['wall']:7.1f} s wall {got['cpu']:7.1f} s CPU "
            f"{got['peak_mib']:7,.0f} MiB peak (load average {os.getloadavg()[0]:.1f})",
            flush=True)
  ref = results.get("original")
  for name, _, _ in sides:
    for field, unit in (("wall", "s"), ("cpu", "s CPU"), ("peak_mib", "MiB peak")):
      values = [x[field] for x in results[name]]
      line = (f"{name:<11} {field:<8} median {statistics.median(values):8,.1f} {unit} "
              f"(range {min(values):,.1f}-{max(values):,.1f})")
      if ref and name != "original":
        ratios = [o[field] / x[field] for o, x in zip(ref, results[name])]
        line += (f"; original / {name}: median {statistics.median(ratios):.1f}x "
                 f"(range {min(ratios):.1f}-{max(ratios):.1f})")
      print(line, flush=True)


# --- The benchmark. ----------------------------------------------------------

def build_corpus(directory, mb, vocab_size):
  """Writes the docstring corpus and its vocab; returns their paths."""
  from bertjax.text import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  path = os.path.join(directory, "corpus.txt")
  corpus_lib.write_corpus(path, corpus_lib.docstring_corpus(int(mb * 1e6)))
  vocab = os.path.join(directory, "vocab.txt")
  vocab_lib.build_wordpiece_vocab([path], vocab, vocab_size=vocab_size,
                                  do_lower_case=True)
  return path, vocab


def corpus_and_vocab(args, tmp, mb):
  """--corpus_file and --vocab_file if given, else a corpus of `mb` MB and a
  vocab built on it."""
  if args.corpus_file or args.vocab_file:
    if not (args.corpus_file and args.vocab_file):
      raise SystemExit("--corpus_file and --vocab_file go together.")
    return args.corpus_file, args.vocab_file
  return build_corpus(tmp, mb, args.vocab_size)


def _summary(name, rates, ratios):
  line = (f"{name:<36} median {statistics.median(rates):9,.0f} inst/s "
          f"(range {min(rates):,.0f}-{max(rates):,.0f})")
  if ratios:
    line += (f"; {statistics.median(ratios):.1f}x the original "
             f"(range {min(ratios):.1f}-{max(ratios):.1f})")
  print(line, flush=True)


def speed(args, tmp, corpus, vocab):
  config = creation.CreationConfig(
      max_seq_length=args.max_seq_length,
      max_predictions_per_seq=args.max_predictions_per_seq,
      dupe_factor=args.dupe_factor, num_output_shards=8)
  runs = [("bertjax, 1 process", 1)]
  if args.workers > 1:
    runs.append((f"bertjax, {args.workers} processes", args.workers))
  rates = {name: [] for name, _ in runs}
  ratios = {name: [] for name, _ in runs}
  original = []
  for r in range(args.repeat):
    ref = None
    if not args.skip_reference:
      seconds, count = run_original(
          corpus, vocab, os.path.join(tmp, "original.tfrecord"),
          args.max_seq_length, args.max_predictions_per_seq, args.dupe_factor)
      ref = count / seconds
      original.append(ref)
      print(f"pair {r}: original {seconds:8.1f} s {ref:10,.0f} inst/s",
            flush=True)
    for name, workers in runs:
      seconds, count = run_bertjax(corpus, vocab, config,
                                   os.path.join(tmp, "out"), workers)
      rates[name].append(count / seconds)
      if ref:
        ratios[name].append(count / seconds / ref)
      print(f"pair {r}: {name:<34} {seconds:8.1f} s "
            f"{count / seconds:10,.0f} inst/s ({count:,} instances)",
            flush=True)
  if original:
    _summary("original create_pretraining_data", original, [])
  for name, _ in runs:
    _summary(name, rates[name], ratios[name])


def _memory_mib(field: str) -> float:
  """A field of /proc/self/status (VmRSS, VmHWM) in MiB."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f"/proc/self/status has no {field}")


def _peak_rss_child(corpus, vocab, spill_mb, dupe_factor):
  """Runs creation here; prints, as JSON, the resident memory before it and
  its peak during it (the kernel's high-water mark, reset before)."""
  spec = creation.TokenizerSpec("wordpiece", vocab, True)
  shards = documents.list_input_shards(corpus)
  config = creation.CreationConfig(dupe_factor=dupe_factor, num_output_shards=1,
                                   spill_bytes=int(spill_mb * 2**20))
  out = tempfile.mkdtemp(prefix="create_data_rss_")
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # Resets VmHWM to the current resident size.
  before = _memory_mib("VmRSS")
  try:
    md = creation.create_pretraining_data(
        shards, spec, config, out, num_workers=1, show_progress=False,
        log=lambda *a: None)
    shard = os.path.getsize(os.path.join(out, md.files[0]["name"]))
  finally:
    shutil.rmtree(out, ignore_errors=True)
  print(json.dumps({"before_mib": before, "peak_mib": _memory_mib("VmHWM"),
                    "instances": md.num_instances, "shard_mib": shard / 2**20}))


def corpus_prefixes(tmp, big, sizes) -> list[str]:
  """Files of the first documents of `big`, `sizes` megabytes of each."""
  with open(big, encoding="utf-8") as f:
    docs = f.read().split("\n\n")
  paths = []
  for mb in sizes:
    path = os.path.join(tmp, f"corpus_{mb}.txt")
    kept, size = [], 0
    for d in docs:
      if size >= mb * 1e6:
        break
      kept.append(d)
      size += len(d.encode("utf-8")) + 2
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n\n".join(kept) + "\n")
    paths.append(path)
  return paths


def peak_rss(args, tmp, sizes):
  """Corpora of the given sizes (prefixes of one corpus), each in a child."""
  big, vocab = corpus_and_vocab(args, tmp, max(sizes))
  for mb, path in zip(sizes, corpus_prefixes(tmp, big, sizes)):
    done = subprocess.run(
        [sys.executable, "-m", "bertjax.benchmarks.create_data_bench",
         "--_rss_child", path, vocab, str(args.spill_mb),
         str(args.dupe_factor)], capture_output=True, text=True, check=True)
    r = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{os.path.getsize(path) / 1e6:6.1f} MB corpus: {r['instances']:,} "
          f"instances, one shard of {r['shard_mib']:,.0f} MiB; resident "
          f"{r['before_mib']:,.0f} MiB before creation, peak "
          f"{r['peak_mib']:,.0f} MiB during it (--spill_mb {args.spill_mb})",
          flush=True)


def main():
  if len(sys.argv) > 1 and sys.argv[1] == "--_rss_child":
    _peak_rss_child(sys.argv[2], sys.argv[3], float(sys.argv[4]),
                    int(sys.argv[5]))
    return
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mb", type=float, default=20.0,
                      help="Megabytes of corpus text.")
  parser.add_argument("--dupe_factor", type=int, default=10)
  parser.add_argument("--max_seq_length", type=int, default=128)
  parser.add_argument("--max_predictions_per_seq", type=int, default=20)
  parser.add_argument("--vocab_size", type=int, default=16000)
  parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--repeat", type=int, default=3)
  parser.add_argument("--skip_reference", action="store_true")
  parser.add_argument("--peak_rss", default="",
                      help="Comma-separated corpus sizes (MB) to measure "
                      "peak memory at, instead of speed.")
  parser.add_argument("--whole_process", action="store_true",
                      help="Time whole command-line processes (module docstring).")
  parser.add_argument("--baseline", default="",
                      help="With --whole_process: a checkout whose bertjax also runs.")
  parser.add_argument("--spill_mb", type=float, default=8.0,
                      help="Spill size for --peak_rss.")
  parser.add_argument("--also_workers", default="",
                      help="With --whole_process: comma-separated worker "
                      "counts bertjax also runs with, in each pair.")
  parser.add_argument("--sizes_mb", default="",
                      help="Comma-separated corpus sizes (MB): the runs on "
                      "each, prefixes of one corpus of the largest size "
                      "(with --skip_reference, bertjax alone: its memory "
                      "as the corpus grows).")
  parser.add_argument("--corpus_file", default="",
                      help="A corpus to use (one sentence per line, blank "
                      "lines between documents) instead of building one; "
                      "with --vocab_file.")
  parser.add_argument("--vocab_file", default="",
                      help="The WordPiece vocab.txt for --corpus_file.")
  args = parser.parse_args()
  os.environ["TOKENIZERS_PARALLELISM"] = "false"  # One thread: per-core figures.
  tmp = tempfile.mkdtemp(prefix="create_data_bench_")
  try:
    if args.peak_rss:
      peak_rss(args, tmp, [float(x) for x in args.peak_rss.split(",")])
      return
    sizes = [float(x) for x in args.sizes_mb.split(",")] if args.sizes_mb else []
    corpus, vocab = corpus_and_vocab(args, tmp, max(sizes) if sizes else args.mb)
    corpora = corpus_prefixes(tmp, corpus, sizes) if sizes else [corpus]
    for corpus in corpora:
      print(f"corpus {os.path.getsize(corpus) / 1e6:.1f} MB (installed "
            f"docstrings, no repeated text), max_seq_length "
            f"{args.max_seq_length}, dupe_factor {args.dupe_factor}", flush=True)
      if args.whole_process:
        whole_process(args, tmp, corpus, vocab)
      else:
        speed(args, tmp, corpus, vocab)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
