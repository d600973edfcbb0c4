"""A benchmark corpus that is not copies of itself: installed packages' docstrings.

Every machine that runs the benchmarks has the Python packages bertjax
installs (TensorFlow, JAX, transformers, ...); their sources hold tens of
megabytes of English prose in docstrings. `docstring_corpus` turns the
docstrings of every `.py` file under the interpreter's site-packages and
standard library into documents of sentences (one document per module
section, as the demo corpus does), drops sentences of five or more words that
appeared before, and stops once `min_bytes` of text are gathered. No text is
repeated on purpose, so a word cache or a sentence cache sees the hit rate of
real text, not of shuffled copies.

  python -m bertjax.benchmarks.corpus --output=/tmp/docstrings.txt --min_mb=20
"""

import argparse
import site
import sysconfig

from bertjax.create import demo

_SKIPPED = frozenset({"__pycache__", "test", "tests", "testing", "_vendor"})


def _roots() -> list[str]:
  roots = [*site.getsitepackages(), sysconfig.get_paths()["stdlib"]]
  return list(dict.fromkeys(roots))


def docstring_corpus(min_bytes: int = 20 << 20) -> list[list[str]]:
  """Documents of sentences from installed docstrings, at least `min_bytes`
  of text (UTF-8) if the installation has that much; raises otherwise."""
  paths = [p for root in _roots() for p in demo.python_sources(root, _SKIPPED)]
  docs, size = [], 0
  # Modules in batches, so that the sentence de-duplication runs across them.
  for start in range(0, len(paths), 500):
    batch = demo.documents_from_sections(demo.module_sections(paths[start:start + 500]))
    for doc in batch:
      docs.append(doc)
      size += sum(len(s.encode("utf-8")) + 1 for s in doc) + 1
    if size >= min_bytes:
      return docs
  raise RuntimeError(f"the installed packages' docstrings give {size / 1e6:.1f} MB of "
                     f"text, less than the {min_bytes / 1e6:.1f} MB asked for")


def write_corpus(path: str, docs: list[list[str]]) -> int:
  """Writes one sentence per line, blank lines between documents; returns bytes."""
  text = "\n\n".join("\n".join(d) for d in docs) + "\n"
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return len(text.encode("utf-8"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--output", required=True, help="Text file to write.")
  parser.add_argument("--min_mb", type=float, default=20.0, help="Megabytes of text at least.")
  args = parser.parse_args()
  docs = docstring_corpus(int(args.min_mb * 1e6))
  size = write_corpus(args.output, docs)
  print(f"{len(docs):,} documents, {size / 1e6:.1f} MB -> {args.output}")


if __name__ == "__main__":
  main()
