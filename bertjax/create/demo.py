"""The demo corpus: Python's own documentation, made into BERT data.

Every Python ships its language reference as text in `pydoc_data.topics`
(what `help("assert")` prints) and the docstrings of its standard library
in the library's sources. `ensure_demo_data` turns both into documents of
sentences (one per section of a reference topic, one per library class and
one per library module's own functions: about 1.5 MB of English prose),
holds out whole sources (reference topics and library files) holding ~10% of
the documents for evaluation, trains a small WordPiece vocab on the training
documents and creates pre-masked TFRecords for both pretraining phases:

  data_dir/
    text/train.txt, text/eval.txt  sentences per line, blank line between docs
    text/sources.json              each split's sources
    vocab.txt                      WordPiece vocab (training documents only)
    train_128/ eval_128/           max_seq_length 128, max_predictions 20
    train_512/ eval_512/           max_seq_length 512, max_predictions 80

Nothing is downloaded and no text is stored in the repository; the corpus is
built at run time. Each step is skipped when its output exists, so the call is
idempotent and resumes after an interruption (files are written atomically
and dataset creation resumes by itself).
"""

import ast
import json
import os
import random
import re
import sysconfig
from typing import Iterable, Iterator, Optional

from bertjax.create import creation
from bertjax.create import documents
from bertjax.records import fileio
from bertjax.records import schema

PHASES = {128: 20, 512: 80}  # max_seq_length -> max_predictions_per_seq
# WordPiece vocab of the demo corpus: small, since the masked-LM projection onto
# the vocab is a large share of the demo model's step (docs/demo.md).
VOCAB_SIZE = 3000
_HEADING_UNDERLINE = re.compile(r"^([=\-*~^+#\"])\1{2,}$")
_BULLET = re.compile(r"^(\*|-|\d+\.)\s+")


def _sections(topic_text: str) -> list[list[str]]:
  """Paragraphs of prose per section of one pydoc topic."""
  lines = topic_text.splitlines()
  sections, paragraphs, para = [], [], []

  def end_paragraph():
    if para:
      paragraphs.append(para[:])
      para.clear()

  i = 0
  while i < len(lines):
    line = lines[i]
    nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
    if line.strip() and _HEADING_UNDERLINE.match(nxt):
      end_paragraph()
      if paragraphs:
        sections.append(paragraphs)
      paragraphs = []
      i += 2
      continue
    if line.strip():
      para.append(line)
    else:
      end_paragraph()
    i += 1
  end_paragraph()
  if paragraphs:
    sections.append(paragraphs)
  return [[_prose(p) for p in sec if _is_prose(p)] for sec in sections]


def _is_prose(paragraph: list[str]) -> bool:
  """False for code samples, grammar rules and tables."""
  first = paragraph[0]
  indent = len(first) - len(first.lstrip())
  text = " ".join(paragraph)
  if indent >= 3 and not _BULLET.match(first.lstrip()):
    return False
  if ">>>" in text or "::=" in text or "+---" in text or "====" in text:
    return False
  letters = sum(c.isalpha() for c in text)
  return letters >= 0.6 * len(text.replace(" ", "")) and len(text.split()) >= 4


def _prose(paragraph: list[str]) -> str:
  text = " ".join(line.strip() for line in paragraph)
  return _BULLET.sub("", text)


def _split_sentences(text: str) -> list[str]:
  from bertjax.text import corpus  # pylint: disable=g-import-not-at-top
  return [s for s in corpus.split_sentences(text) if s.strip()]


def _topic_sections() -> Iterator[tuple[str, list[list[list[str]]]]]:
  """Per reference topic, its source name ("reference:NAME") and its sections'
  paragraphs of prose."""
  import pydoc_data.topics  # pylint: disable=g-import-not-at-top
  for name in sorted(pydoc_data.topics.topics):
    yield f"reference:{name}", _sections(pydoc_data.topics.topics[name])


_SKIPPED_LIBRARY_DIRS = {"test", "tests", "idlelib", "turtledemo", "lib2to3",
                         "site-packages", "dist-packages", "__pycache__"}


def _docstring_sections(tree: ast.Module) -> list[list[str]]:
  """The prose paragraphs of a module's docstrings, in source order, one
  section for the module and its functions and one per top-level class."""
  sections = [[]]

  def visit(node, paragraphs):
    doc = ast.get_docstring(node) if isinstance(
        node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if doc:
      para = []
      for line in doc.splitlines() + [""]:
        if line.strip():
          para.append(line)
        elif para:
          if _is_prose(para):
            paragraphs.append(_prose(para))
          para = []
    for child in getattr(node, "body", []):
      if isinstance(child, ast.ClassDef) and node is tree:
        sections.append([])
        visit(child, sections[-1])
      elif isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        visit(child, paragraphs)

  visit(tree, sections[0])
  return [s for s in sections if s]


def python_sources(root: str, skipped_dirs=frozenset()) -> list[str]:
  """The .py files under `root`, sorted, outside directories named in skipped_dirs."""
  paths = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if d not in skipped_dirs and not d.startswith("."))
    paths.extend(os.path.join(directory, n) for n in names if n.endswith(".py"))
  return sorted(paths)


def module_sections(paths: Iterable[str]) -> Iterator[tuple[str, list[list[str]]]]:
  """Per Python source file, its path and its docstrings' prose paragraphs by
  section; files that do not parse are passed over."""
  for path in paths:
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
      continue
    sections = _docstring_sections(tree)
    if sections:
      yield path, sections


def documents_by_source(sources: Iterable[tuple[str, list[list[str]]]],
                        min_sentences: int = 3) -> list[tuple[str, list[list[str]]]]:
  """Per source (a name, and the sections of prose paragraphs of one topic or
  module), its name and its documents (lists of sentences), in order; sources
  left without a document are dropped.

  A section with fewer than `min_sentences` sentences joins the document before
  it (of the same topic or module). Text recurs (topics share sections, classes
  repeat their methods' docs), so a sentence of five or more words is kept
  only where it first appears, and so belongs to one source; a document left
  with fewer than two sentences is dropped.
  """
  out, seen = [], set()
  for name, sections in sources:
    topic_docs = []
    for paragraphs in sections:
      sentences = []
      for p in paragraphs:
        for sentence in _split_sentences(p):
          if len(sentence.split()) >= 5:
            if sentence in seen:
              continue
            seen.add(sentence)
          sentences.append(sentence)
      if not sentences:
        continue
      if len(sentences) < min_sentences and topic_docs:
        topic_docs[-1].extend(sentences)
      else:
        topic_docs.append(sentences)
    docs = [d for d in topic_docs if len(d) >= 2]
    if docs:
      out.append((name, docs))
  return out


def documents_from_sections(sources: Iterable[tuple[str, list[list[str]]]],
                            min_sentences: int = 3) -> list[list[str]]:
  """The documents of `documents_by_source`, one list."""
  return [d for _, docs in documents_by_source(sources, min_sentences) for d in docs]


def demo_sources(min_sentences: int = 3) -> list[tuple[str, list[list[str]]]]:
  """The demo corpus by source, in a fixed order: each reference topic
  ("reference:NAME"), then each standard-library file (its path relative to
  the library, e.g. "asyncio/tasks.py"), with its documents (see
  `documents_by_source`)."""
  root = sysconfig.get_paths()["stdlib"]
  library = ((os.path.relpath(path, root), sections) for path, sections in
             module_sections(python_sources(root, _SKIPPED_LIBRARY_DIRS)))
  return documents_by_source([*_topic_sections(), *library], min_sentences)


def demo_documents(min_sentences: int = 3) -> list[list[str]]:
  """The documents (lists of sentences) of the demo corpus, in a fixed order:
  the reference topics' sections, then the standard library's modules."""
  return [d for _, docs in demo_sources(min_sentences) for d in docs]


def _format(docs: list[list[str]]) -> str:
  return "\n\n".join("\n".join(d) for d in docs) + "\n"


def ensure_demo_data(data_dir: str, *, vocab_size: int = VOCAB_SIZE,
                     dupe_factor: int = 10, eval_dupe_factor: int = 10,
                     eval_fraction: float = 0.1, seed: int = 12345,
                     phases: Optional[dict[int, int]] = None,
                     num_workers: int = 1, show_progress: bool = False,
                     log=print, objective: str = schema.DEFAULT_OBJECTIVE) -> dict[str, str]:
  """Builds the demo data under `data_dir` where absent; returns its paths.

  Returns {"data_dir": dir, "vocab": vocab.txt path, "train_text": path,
  "eval_text": path, "train": {L: glob}, "eval": {L: glob}} where, for each
  phase length L in `phases` (max_seq_length -> max_predictions_per_seq,
  default {128: 20, 512: 80}), the glob is `data_dir/{split}_{L}/part-*.tfrecord`
  (metadata.json beside the shards), the file pattern pipeline.TrainSource
  and evaluation.eval_batches take. The documents are split between train and
  eval by source (split_by_source: whole topics and files, drawn at random
  with `seed`).

  Another `objective` (schema.OBJECTIVES) makes the training records for it
  in `train_{L}_{objective}`; the held-out records stay the paper's
  (eval_{L}, masked at 15% with PHASES' predictions), so every objective
  but ltr is evaluated on the same masked tokens; ltr's are its own
  unmasked rows (`eval_{L}_ltr`).
  """
  phases = dict(PHASES if phases is None else phases)
  os.makedirs(os.path.join(data_dir, "text"), exist_ok=True)
  paths = {
      "data_dir": data_dir,
      "vocab": os.path.join(data_dir, "vocab.txt"),
      "train_text": os.path.join(data_dir, "text", "train.txt"),
      "eval_text": os.path.join(data_dir, "text", "eval.txt"),
      "train": {},
      "eval": {},
  }
  if not (os.path.exists(paths["train_text"])
          and os.path.exists(paths["eval_text"])):
    _write_demo_text(paths, eval_fraction, seed, log)
  if not os.path.exists(paths["vocab"]):
    from bertjax.text import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
    vocab_lib.build_wordpiece_vocab([paths["train_text"]], paths["vocab"],
                                    vocab_size=vocab_size, do_lower_case=True)
    log(f"demo vocab: {paths['vocab']}")
  spec = creation.TokenizerSpec("wordpiece", paths["vocab"], True)
  for length, max_pred in sorted(phases.items()):
    for split, dupe in (("train", dupe_factor), ("eval", eval_dupe_factor)):
      made_for = objective if split == "train" or objective == "ltr" else (
          schema.DEFAULT_OBJECTIVE)
      suffix = "" if made_for == schema.DEFAULT_OBJECTIVE else "_" + made_for
      out = os.path.join(data_dir, f"{split}_{length}{suffix}")
      paths[split][length] = os.path.join(out, "part-*.tfrecord")
      done = schema.read_metadata(out) is not None
      config = creation.CreationConfig(
          max_seq_length=length,
          max_predictions_per_seq=max_pred if split == "train" else PHASES.get(
              length, max_pred),
          dupe_factor=dupe, random_seed=seed + (0 if split == "train" else 1),
          num_output_shards=4 if split == "train" else 2, objective=made_for)
      shards = documents.list_input_shards(paths[f"{split}_text"])
      creation.create_pretraining_data(
          shards, spec, config, out, num_workers=num_workers,
          source=f"demo:python-docs/{split}",
          show_progress=show_progress, log=lambda *a: None)
      if not done:
        md = schema.read_metadata(out)
        log(f"demo {os.path.basename(out)}: {md.num_instances} instances in {out}")
  return paths


def split_by_source(sources: list[tuple[str, list[list[str]]]], eval_fraction: float,
                    seed: int) -> dict[str, list[tuple[str, list[list[str]]]]]:
  """{"train": sources, "eval": sources}: whole sources (demo_sources' topics
  and files) drawn at random (seeded) for "eval" until they hold
  `eval_fraction` of the documents (at least two), the rest "train"; each
  split's sources in their order in `sources`. No source has documents on
  both sides, so no topic or file is seen in pretraining and held out too."""
  order = list(range(len(sources)))
  random.Random(seed).shuffle(order)
  wanted = max(2, int(round(sum(len(docs) for _, docs in sources) * eval_fraction)))
  held, count = set(), 0
  for i in order:
    if count >= wanted:
      break
    held.add(i)
    count += len(sources[i][1])
  return {"train": [s for i, s in enumerate(sources) if i not in held],
          "eval": [s for i, s in enumerate(sources) if i in held]}


def sources_path(data_dir: str) -> str:
  """data_dir/text/sources.json: each split's sources ({"train": [...], "eval": [...]})."""
  return os.path.join(data_dir, "text", "sources.json")


def _write_demo_text(paths, eval_fraction, seed, log) -> None:
  """Writes the demo documents, split by source into train and eval text
  (split_by_source), each split's documents in a seeded random order, and
  each split's sources beside them (sources_path)."""
  splits = split_by_source(demo_sources(), eval_fraction, seed)
  counts = {}
  fileio.write_text(sources_path(os.path.dirname(os.path.dirname(paths["train_text"]))),
                    json.dumps({k: [name for name, _ in v] for k, v in splits.items()},
                               indent=0))
  for split, sources in splits.items():
    docs = [d for _, source_docs in sources for d in source_docs]
    random.Random(seed).shuffle(docs)
    fileio.write_text(paths[f"{split}_text"], _format(docs))
    counts[split] = (len(docs), len(sources))
  log(f"demo corpus: {counts['train'][0]} training documents from {counts['train'][1]} "
      f"sources and {counts['eval'][0]} evaluation documents from {counts['eval'][1]} "
      f"others in {os.path.dirname(paths['train_text'])}")


def prepare_config(config, workdir: str, **data_options) -> Optional[dict]:
  """Builds the demo data when `config.data.demo_dir` names a directory, and
  points every phase's train_files and eval_files at it.

  A relative demo_dir is taken inside `workdir`; `data_options` go to
  `ensure_demo_data` (e.g. dupe_factor). Returns the paths of
  `ensure_demo_data`, or None when the config uses no demo data.
  """
  if not config.data.demo_dir:
    return None
  phases = {p.max_seq_length: p.max_predictions_per_seq for p in config.phases.values()}
  data_options.setdefault("phases", phases)
  data_options.setdefault("objective", config.get("objective", schema.DEFAULT_OBJECTIVE))
  paths = ensure_demo_data(fileio.under(workdir, config.data.demo_dir), **data_options)
  for name, phase in config.phases.items():
    length = phase.max_seq_length
    if length not in paths.get("train", {}):
      raise ValueError(f"--config.phases.{name}.max_seq_length={length}: the demo data "
                       f"has only lengths {sorted(paths['train'])}")
    phase.train_files = paths["train"][length]
    phase.eval_files = paths["eval"][length]
  return paths
