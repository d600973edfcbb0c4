"""`python -m bertjax.create_text`: dumps and books to balanced text shards
with a manifest, byte-identical whatever the workers, ranges or runner,
resumable, and read unchanged by create_data (bertjax/corpus/extraction.py,
beam_pipeline.py, bertjax/create_text.py)."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import wiki_dumps
from bertjax.corpus import extraction
from bertjax.create import creation
from bertjax.create import documents
from bertjax.text import corpus
from bertjax.text import vocab as vocab_lib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pages(n=120):
  """A dump's pages: the every-construct article, articles, and a page of
  each kind the rules skip."""
  pages = [wiki_dumps.page_xml("Testville", wiki_dumps.ARTICLE, 1)]
  for i in range(2, n):
    kind = i % 10
    if kind == 1:
      pages.append(wiki_dumps.page_xml(f"Alias {i}", "#REDIRECT [[Place 2]]",
                                       i, redirect="Place 2"))
    elif kind == 2:
      pages.append(wiki_dumps.page_xml(f"Place {i} (disambiguation)",
                                       "'''Place''' may be:\n* [[A]]\n{{dab}}", i))
    elif kind == 3:
      pages.append(wiki_dumps.page_xml(f"Template:Box {i}", "{{{1}}}", i, ns=10))
    elif kind == 4:
      pages.append(wiki_dumps.page_xml(f"Stub {i}", "A short stub.", i))
    else:
      pages.append(wiki_dumps.page_xml(f"Place {i}", wiki_dumps.filler(i, 150 + i),
                                       i))
  return pages


def _extract(input_file, output_dir, **kwargs):
  settings = extraction.Settings(
      source=kwargs.pop("source", "wikipedia"), input_file=input_file,
      min_words=kwargs.pop("min_words", 20),
      num_output_shards=kwargs.pop("num_output_shards", 4),
      split_mb=kwargs.pop("split_mb", 32.0))
  return extraction.extract(settings, str(output_dir),
                            num_workers=kwargs.pop("num_workers", 1),
                            show_progress=False, log=lambda *a: None, **kwargs)


def _files(directory):
  return {os.path.basename(p): open(p, "rb").read()
          for p in sorted(glob.glob(os.path.join(str(directory), "part-*.txt")))}


def test_dump_to_text_shards_and_manifest(tmp_path):
  dump = wiki_dumps.write_dump(str(tmp_path / "enwiki-pages-articles.xml"),
                               _pages())
  manifest = _extract(dump, tmp_path / "out")
  assert manifest["pages_read"] == 119
  assert manifest["pages_dropped"] == {"disambiguation": 12, "namespace": 12,
                                       "redirect": 11, "too_short": 12}
  assert manifest["documents"] == 72
  files = _files(tmp_path / "out")
  assert list(files) == [f"part-0000{k}-of-00004.txt" for k in range(4)]
  assert [f["bytes"] for f in manifest["files"]] == [len(b) for b in files.values()]
  sizes = [len(b) for b in files.values()]
  assert max(sizes) - min(sizes) < 2 * 1600  # Two documents at most.
  text = b"".join(files.values()).decode()
  docs = text.split("\n\n")[:-1]
  assert len(docs) == 72 and text.endswith("\n\n")
  first = docs[0].split("\n")
  expected = [s for p in wiki_dumps.ARTICLE_PASSAGES
              for s in corpus.split_sentences(p)]
  assert first == expected
  assert manifest["sentences"] == text.count("\n") - 72
  assert manifest["words"] == len(text.split())
  assert json.load(open(tmp_path / "out" / "manifest.json")) == manifest
  assert not os.path.exists(tmp_path / "out" / "_work")


def test_output_depends_only_on_the_input_and_settings(tmp_path):
  pages = _pages()
  plain = wiki_dumps.write_dump(str(tmp_path / "a.xml"), pages)
  multi = wiki_dumps.write_dump(str(tmp_path / "b-multistream.xml.bz2"), pages,
                                "multistream", pages_per_stream=10)
  single = wiki_dumps.write_dump(str(tmp_path / "c.xml.bz2"), pages, "bz2")
  reference = _files(tmp_path / "ref") if _extract(plain, tmp_path / "ref") else {}
  for name, path, split in [("plain-ranges", plain, 0.01),
                            ("multistream", multi, 0.002),
                            ("single-stream", single, 32.0)]:
    _extract(path, tmp_path / name, split_mb=split)
    assert _files(tmp_path / name) == reference, name


def test_rerun_skips_finished_work_and_refuses_changed_settings(tmp_path,
                                                                monkeypatch):
  dump = wiki_dumps.write_dump(str(tmp_path / "d.xml"), _pages())
  clean = _files(tmp_path / "clean") if _extract(dump, tmp_path / "clean") else {}
  out = tmp_path / "out"
  calls = []
  real_write = extraction.write_task

  def failing_write(path, segments, work_dir):
    calls.append(path)
    if len(calls) == 3:
      raise RuntimeError("stopped")
    return real_write(path, segments, work_dir)

  monkeypatch.setattr(extraction, "write_task", failing_write)
  with pytest.raises(RuntimeError, match="stopped"):
    _extract(dump, out, split_mb=0.005)
  monkeypatch.setattr(extraction, "write_task", real_write)
  assert len(_files(out)) == 2 and os.path.exists(out / "_work")
  with pytest.raises(ValueError, match="--min_words=30: .* made with "
                     "--min_words=20"):
    _extract(dump, out, split_mb=0.005, min_words=30)
  with pytest.raises(ValueError, match="--split_mb"):
    _extract(dump, out)
  extracted = []
  monkeypatch.setattr(extraction, "extract_task",
                      lambda *a: extracted.append(a) or None)
  _extract(dump, out, split_mb=0.005)  # Finishes without extracting again.
  assert not extracted and _files(out) == clean
  with pytest.raises(ValueError, match="--num_output_shards=5: .* made with "
                     "--num_output_shards=4"):
    _extract(dump, out, split_mb=0.005, num_output_shards=5)
  assert _extract(dump, out, split_mb=0.005)["documents"] == 72


def test_books_to_documents(tmp_path):
  prose = "The miller walked down to the river with a heavy sack. " * 12
  for i in range(3):
    (tmp_path / f"book{i}.txt").write_text(
        f"*** START OF THE PROJECT GUTENBERG EBOOK BOOK {i} ***\n\nCHAPTER I."
        f"\n\n{prose}\n\nCHAPTER II.\n\n{prose}\n\n*** END OF THE PROJECT "
        "GUTENBERG EBOOK ***\n\nLicence text.\n")
  (tmp_path / "short.txt").write_text("Too short.\n")
  manifest = _extract(str(tmp_path / "*.txt"), tmp_path / "out",
                      source="books", num_output_shards=2)
  assert manifest["books_read"] == 4
  assert manifest["books_dropped"] == {"too_short": 1}
  assert manifest["documents"] == 3 and manifest["removed"]["headings"] == 6
  text = b"".join(_files(tmp_path / "out").values()).decode()
  assert "CHAPTER" not in text and "Licence" not in text
  assert text.count("\n\n") == 3


def test_no_document_is_an_error_naming_the_directory(tmp_path):
  dump = wiki_dumps.write_dump(str(tmp_path / "d.xml"), [
      wiki_dumps.page_xml("Stub", "Short.", 1)])
  with pytest.raises(ValueError, match="no document was written.*too_short"):
    _extract(dump, tmp_path / "out")


def test_output_feeds_create_data_unchanged(tmp_path):
  dump = wiki_dumps.write_dump(str(tmp_path / "d.xml.bz2"), _pages(), "bz2")
  _extract(dump, tmp_path / "text")
  pattern = str(tmp_path / "text" / "part-*.txt")
  vocab = str(tmp_path / "vocab.txt")
  vocab_lib.build_wordpiece_vocab(sorted(glob.glob(pattern)), vocab,
                                  vocab_size=300)
  shards = documents.list_input_shards(pattern, "sentences")
  config = creation.CreationConfig(max_seq_length=64, max_predictions_per_seq=8,
                                   dupe_factor=1, num_output_shards=2)
  md = creation.create_pretraining_data(
      shards, creation.TokenizerSpec("wordpiece", vocab), config,
      str(tmp_path / "records"), num_workers=1, show_progress=False,
      source=documents.describe_source("sentences", pattern),
      log=lambda *a: None)
  assert md.report["documents"] == 72 and md.num_instances > 71


@pytest.mark.slow
def test_output_does_not_depend_on_the_number_of_processes(tmp_path):
  dump = wiki_dumps.write_dump(str(tmp_path / "d-multistream.xml.bz2"),
                               _pages(300), "multistream", pages_per_stream=10)
  _extract(dump, tmp_path / "one", split_mb=0.003)
  _extract(dump, tmp_path / "three", split_mb=0.003, num_workers=3)
  assert _files(tmp_path / "one") == _files(tmp_path / "three")


@pytest.mark.slow
def test_beam_pipeline_gives_the_same_bytes(tmp_path):
  from bertjax.corpus import beam_pipeline  # pylint: disable=g-import-not-at-top
  dump = wiki_dumps.write_dump(str(tmp_path / "d.xml"), _pages())
  local = _extract(dump, tmp_path / "local", split_mb=0.01)
  settings = extraction.Settings(source="wikipedia", input_file=dump,
                                 min_words=20, num_output_shards=4,
                                 split_mb=0.01)
  beam = beam_pipeline.run_beam(settings, str(tmp_path / "beam"),
                                log=lambda *a: None)
  assert _files(tmp_path / "beam") == _files(tmp_path / "local")
  assert beam == local


def _cli(*args, **kwargs):
  return subprocess.run([sys.executable, "-m", "bertjax.create_text", *args],
                        cwd=_ROOT, capture_output=True, text=True,
                        timeout=600, check=False, **kwargs)


@pytest.mark.slow
def test_cli_mistakes_are_one_line_naming_the_flag(tmp_path):
  result = _cli("--output_dir", str(tmp_path))
  assert result.returncode != 0 and "--source is required" in result.stderr
  result = _cli("--source=wikipedia", f"--input_file={tmp_path}/none*.xml",
                f"--output_dir={tmp_path}/o")
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      f"Error: --input_file: '{tmp_path}/none*.xml' matches no files.")
  assert "Traceback" not in result.stderr
  cut = tmp_path / "cut.xml.bz2"
  data = open(wiki_dumps.write_dump(str(tmp_path / "d.xml.bz2"), _pages(),
                                    "bz2"), "rb").read()
  cut.write_bytes(data[:len(data) // 2])
  result = _cli("--source=wikipedia", f"--input_file={cut}",
                f"--output_dir={tmp_path}/o2", "--no_progress",
                "--num_workers=1")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert f"Error: {cut}: truncated" in result.stderr


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_bytes(tmp_path):
  dump = wiki_dumps.write_dump(str(tmp_path / "d-multistream.xml.bz2"),
                               _pages(2000), "multistream", pages_per_stream=20)
  args = ["--source=wikipedia", f"--input_file={dump}", "--min_words=20",
          "--num_output_shards=4", "--split_mb=0.01", "--num_workers=2"]
  out = tmp_path / "out"
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, "-m", "bertjax.create_text", *args,
       f"--output_dir={out}"], cwd=_ROOT, start_new_session=True,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if len(glob.glob(str(out / "_work" / "extract-*.json"))) >= 3:
      break
    time.sleep(0.05)
  assert proc.poll() is None, "the run finished before it could be killed"
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not os.path.exists(out / "manifest.json")
  result = _cli(*args, f"--output_dir={out}", "--no_progress")
  assert result.returncode == 0, result.stderr
  result = _cli(*args, f"--output_dir={tmp_path}/clean", "--no_progress",
                "--num_workers=1")
  assert result.returncode == 0, result.stderr
  assert _files(out) == _files(tmp_path / "clean")


@pytest.mark.slow
def test_whole_path_dump_to_records(tmp_path):
  dump = wiki_dumps.write_dump(str(tmp_path / "enwiki-multistream.xml.bz2"),
                               _pages(), "multistream")
  result = _cli("--source=wikipedia", f"--input_file={dump}",
                f"--output_dir={tmp_path}/text", "--min_words=20",
                "--num_output_shards=2", "--no_progress")
  assert result.returncode == 0, result.stderr
  assert "pages read: 119" in result.stdout
  pattern = f"{tmp_path}/text/part-*.txt"
  vocab = str(tmp_path / "vocab.txt")
  vocab_lib.build_wordpiece_vocab(sorted(glob.glob(pattern)), vocab,
                                  vocab_size=300)
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.create_data", f"--input_file={pattern}",
       f"--vocab_file={vocab}", f"--output_dir={tmp_path}/records",
       "--max_seq_length=64", "--max_predictions_per_seq=8", "--dupe_factor=1",
       "--num_output_shards=2", "--num_workers=1", "--no_progress"],
      cwd=_ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr
  assert os.path.exists(tmp_path / "records" / "metadata.json")
