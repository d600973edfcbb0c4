"""create_text's Wikipedia extraction against WikiExtractor, on a real dump.

  pip install -e ".[bench]"  # WikiExtractor 3.1.0.
  python -m bertjax.benchmarks.corpus_bench --dump=SAMPLE.xml.bz2 \\
      [--repeat 5] [--rounds 5] [--workdir /tmp/corpus_bench]

`--dump` is a MediaWiki dump sample (docs/corpus.md says where a real one
comes from); its pages, repeated `--repeat` times, are written as one
single-stream bz2 file, as Wikimedia compresses `pages-articles`. Each round
runs both tools on it as fresh command-line processes (start-up and imports
included), in alternating order, each on one process:

  python -m bertjax.create_text --source=wikipedia --input_file=IN \\
      --output_dir=OUT --num_workers=1 --no_progress
  python -m wikiextractor.WikiExtractor --no-templates --processes 1 -q \\
      -o OUT IN

and prints each run's wall seconds and pages per second (pages in the input
over wall time), then the median and range of each tool's rate and of the
per-round ratio, what each wrote (documents and words: WikiExtractor keeps
headings, disambiguation pages and stubs), the load average before and
after, and projections of the full English dump on a 32-core host from the
measured per-process rate (by compressed bytes, and by articles).

`--check_reference` also compares, page by page, create_text's fast path
(markup_scan's pre-pass, then the tokens rendered) with the parser-only path
(mwparserfromhell's tree of the whole page) on the sample's articles, and
counts the pages where the parser-only output still holds markup it could
not read (`<ref`, `[[`, `{{`, `</`). Figures depend on the machine and its
load; nothing here is a test.
"""

import argparse
import bz2
import collections
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

# The full English dump (pages-articles of mid-2023): about 22 GB of bz2 and 6.7M articles.
FULL_DUMP_BYTES = 22e9
FULL_DUMP_ARTICLES = 6.7e6
HOST_CORES = 32
_MARKUP = re.compile(r"<ref|\[\[|\{\{|</")


def bench_input(dump: str, repeat: int, path: str) -> tuple[int, int]:
  """Writes the sample's pages `repeat` times as one bz2 stream; returns
  (pages, articles) in it."""
  opener = bz2.open if dump.endswith(".bz2") else open
  with opener(dump, "rb") as f:
    data = f.read()
  head, rest = data.split(b"<page>", 1)
  body, tail = (b"<page>" + rest).rsplit(b"</page>", 1)
  body += b"</page>"
  with bz2.open(path, "wb", compresslevel=9) as f:
    f.write(head)
    for _ in range(repeat):
      f.write(body)
    f.write(tail)
  pages = body.split(b"<page>")[1:]
  articles = sum(b"<ns>0</ns>" in p and b"<redirect" not in p for p in pages)
  return len(pages) * repeat, articles * repeat


def _run(cmd: list[str]) -> float:
  start = time.perf_counter()
  subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE)
  return time.perf_counter() - start


def _wikiextractor_output(directory: str) -> tuple[int, int]:
  docs = words = 0
  for path in glob.glob(os.path.join(directory, "*", "wiki_*")):
    with open(path, encoding="utf-8") as f:
      for line in f:
        if line.startswith("<doc "):
          docs += 1
        elif not line.startswith("</doc>"):
          words += len(line.split())
  return docs, words - docs  # Less each document's title line.


def check_reference(dump: str) -> str:
  """Fast path against the parser-only path on the sample's articles."""
  from bertjax.corpus import dumps  # pylint: disable=g-import-not-at-top
  from bertjax.corpus import markup_scan  # pylint: disable=g-import-not-at-top
  from bertjax.corpus import wikitext  # pylint: disable=g-import-not-at-top
  links = markup_scan.LinkRules(dumps.namespaces(dump))
  report = collections.Counter()
  articles = differ = markup = 0
  fast_s = reference_s = 0.0
  for r in dumps.list_ranges([dump], 1 << 40):
    for page in dumps.iter_pages(r, report):
      if page.ns != 0 or page.redirect or wikitext.is_redirect(page.text):
        continue
      articles += 1
      start = time.perf_counter()
      fast = wikitext.passages(page.text, links)
      fast_s += time.perf_counter() - start
      start = time.perf_counter()
      reference = wikitext.reference_passages(page.text, links)
      reference_s += time.perf_counter() - start
      if fast != reference:
        differ += 1
        markup += bool(_MARKUP.search(" ".join(reference))) and not bool(
            _MARKUP.search(" ".join(fast)))
  return (f"articles: {articles}; fast path {fast_s:.2f}s, parser-only path "
          f"{reference_s:.2f}s ({reference_s / max(fast_s, 1e-9):.1f}x); they "
          f"differ on {differ}, of which the parser-only output holds markup "
          f"it could not read (and the fast path's does not) on {markup}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dump", required=True, help="A MediaWiki dump sample.")
  parser.add_argument("--repeat", type=int, default=5,
                      help="Copies of the sample's pages in the input.")
  parser.add_argument("--rounds", type=int, default=5, help="Paired rounds.")
  parser.add_argument("--workdir", default="/tmp/corpus_bench")
  parser.add_argument("--check_reference", action="store_true",
                      help="Also compare the fast and parser-only paths.")
  args = parser.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  source = os.path.join(args.workdir, "enwiki-bench-pages-articles.xml.bz2")
  pages, articles = bench_input(args.dump, args.repeat, source)
  size = os.path.getsize(source)
  print(f"input: {source}: {pages:,} pages ({articles:,} articles) from "
        f"{args.dump} x{args.repeat}, {size / 1e6:.1f} MB bz2")
  ours_cmd = [sys.executable, "-m", "bertjax.create_text", "--source=wikipedia",
              f"--input_file={source}", "--num_workers=1", "--no_progress"]
  theirs_cmd = [sys.executable, "-m", "wikiextractor.WikiExtractor",
                "--no-templates", "--processes", "1", "-q"]
  print("bertjax:       " + " ".join(ours_cmd) + " --output_dir=OUT")
  print("WikiExtractor: " + " ".join(theirs_cmd) + f" -o OUT {source}")
  load_before = os.getloadavg()
  rates = {"bertjax": [], "WikiExtractor": []}
  for r in range(args.rounds):
    order = ["bertjax", "WikiExtractor"][::1 if r % 2 == 0 else -1]
    for tool in order:
      out = os.path.join(args.workdir, f"{tool}-{r}")
      shutil.rmtree(out, ignore_errors=True)
      cmd = (ours_cmd + [f"--output_dir={out}"] if tool == "bertjax"
             else theirs_cmd + ["-o", out, source])
      seconds = _run(cmd)
      rates[tool].append(pages / seconds)
      print(f"round {r} {tool:13s} {seconds:6.2f}s {pages / seconds:8.1f} "
            f"pages/s (load {os.getloadavg()[0]:.2f})")
  load_after = os.getloadavg()
  ratios = [a / b for a, b in zip(rates["bertjax"], rates["WikiExtractor"])]
  for tool, values in [*rates.items(), ("ratio", ratios)]:
    unit = "" if tool == "ratio" else " pages/s"
    print(f"{tool:13s} median {statistics.median(values):8.2f}{unit} "
          f"(range {min(values):.2f}-{max(values):.2f})")
  manifest = json.load(open(os.path.join(args.workdir, "bertjax-0",
                                         "manifest.json")))
  docs, words = _wikiextractor_output(os.path.join(args.workdir,
                                                   "WikiExtractor-0"))
  print(f"bertjax wrote {manifest['documents']:,} documents, "
        f"{manifest['words']:,} words; dropped {manifest['pages_dropped']}")
  print(f"WikiExtractor wrote {docs:,} documents, {words:,} words")
  ours = statistics.median(rates["bertjax"])
  by_bytes = FULL_DUMP_BYTES / (size * ours / pages) / HOST_CORES
  by_articles = FULL_DUMP_ARTICLES / (ours * articles / pages) / HOST_CORES
  print(f"full English dump ({FULL_DUMP_BYTES / 1e9:.0f} GB bz2, "
        f"{FULL_DUMP_ARTICLES / 1e6:.1f}M articles) on {HOST_CORES} processes "
        f"at this rate each: {by_bytes / 60:.0f} min by bytes, "
        f"{by_articles / 60:.0f} min by articles")
  print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} "
        f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
        f"{load_after[2]:.2f}; {os.cpu_count()} cores")
  if args.check_reference:
    print(check_reference(args.dump))


if __name__ == "__main__":
  main()
