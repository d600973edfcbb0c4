"""The demo corpus's labelled tasks (bertjax/create/demo_tasks.py, bertjax/tasks/
python_docs.py) and the suite that fine-tunes on them (bertjax/studies/suite.py)."""

import os

import ml_collections
import numpy as np
import pytest

from bertjax.studies import suite
from bertjax.create import demo_tasks
from bertjax.tasks import python_docs
from bertjax.tasks import registry
from bertjax.text import tokenization

_AREAS = list(demo_tasks.AREAS)


def _write_demo_text(data_dir, docs_by_split):
  os.makedirs(os.path.join(data_dir, "text"), exist_ok=True)
  for split, docs in docs_by_split.items():
    with open(os.path.join(data_dir, "text", split), "w", encoding="utf-8") as f:
      f.write("\n\n".join("\n".join(d) for d in docs) + "\n")


@pytest.fixture
def small_demo(tmp_path, monkeypatch):
  """Demo text of two documents per area in train and one in eval (three
  sentences each), every sentence's area, and one sentence no source names.
  Every sentence holds its area's own word; email's and gui's hold "buffer"
  too, the one word that two areas share."""
  monkeypatch.setattr(demo_tasks, "COMMON", 0)
  monkeypatch.setattr(demo_tasks, "MIN_COUNT", 2)
  areas, train_docs, eval_docs = {}, [], []
  i = 0
  for area in _AREAS:
    for docs in (train_docs, train_docs, eval_docs):
      doc = []
      for _ in range(3):
        shared = " buffer" if area in ("email", "gui") else ""
        doc.append(f"Sentence {i} fills{shared} with {area}stuff here.")
        areas[doc[-1]] = area
        i += 1
      docs.append(doc)
  train_docs[0].append("Unknown text that no source names here.")
  data_dir = str(tmp_path / "demo_data")
  _write_demo_text(data_dir, {"train.txt": train_docs, "eval.txt": eval_docs})
  return data_dir, areas, train_docs, eval_docs


def _read_tsv(path):
  with open(path, encoding="utf-8") as f:
    return [tuple(line.rstrip("\n").split("\t")) for line in f]


def _read_tagged(path):
  with open(path, encoding="utf-8") as f:
    return [[tuple(line.split()) for line in block.splitlines()]
            for block in f.read().strip().split("\n\n")]


def test_tasks_are_split_by_document_and_labelled_from_their_sources(small_demo):
  data_dir, areas, train_docs, eval_docs = small_demo
  dirs = demo_tasks.ensure_tasks(data_dir, log=lambda *a: None, areas=areas)
  for split, docs in (("train", train_docs), ("dev", eval_docs)):
    in_split = {s for d in docs for s in d}
    rows = _read_tsv(os.path.join(dirs["doc_area"], f"{split}.tsv"))
    assert rows and all(s in in_split for _, s in rows)
    assert all(areas[s] == a for a, s in rows)
    assert {a for a, _ in rows} == set(_AREAS)
  train = {s for _, s in _read_tsv(os.path.join(dirs["doc_area"], "train.tsv"))}
  dev = {s for _, s in _read_tsv(os.path.join(dirs["doc_area"], "dev.tsv"))}
  assert not train & dev


def test_word_tags_mark_shared_words_with_their_sentences_area(small_demo):
  data_dir, areas, _, eval_docs = small_demo
  dirs = demo_tasks.ensure_tasks(data_dir, log=lambda *a: None, areas=areas)
  sentences = _read_tagged(os.path.join(dirs["word_area"], "dev.txt"))
  # The sentences that hold a shared word: email's and gui's.
  assert len(sentences) == sum(len(d) for d in eval_docs if "buffer" in d[0])
  for sentence in sentences:
    text = " ".join(w for w, _ in sentence)
    area = next(a for s, a in areas.items() if " ".join(demo_tasks.words(s)) == text)
    assert area in ("email", "gui")
    assert [(w, t) for w, t in sentence if t != "O"] == [("buffer", f"B-{area}")]
    assert all(t in python_docs.WORD_LABELS for _, t in sentence)


def test_shared_words_need_two_areas_enough_count_and_are_not_the_commonest(monkeypatch):
  monkeypatch.setattr(demo_tasks, "MIN_COUNT", 3)
  monkeypatch.setattr(demo_tasks, "COMMON", 1)
  labelled = [("email", "the buffer the message the"), ("gui", "the buffer the window"),
              ("email", "the buffer message"), ("gui", "window window the"),
              ("email", "an message")]
  # the: commonest, left out; buffer: 2 email + 1 gui; message: email only;
  # window: gui only; an: too short.
  assert demo_tasks.ambiguous_words(labelled) == {"buffer"}
  monkeypatch.setattr(demo_tasks, "MIN_SHARE", 0.4)
  assert demo_tasks.ambiguous_words(labelled) == set()  # gui has 1 of 3 "buffer".


def test_an_area_without_sentences_names_the_file(small_demo):
  data_dir, areas, _, _ = small_demo
  no_gui = {s: a for s, a in areas.items() if a != "gui"}
  with pytest.raises(ValueError, match=r"train.txt: .*\['gui'\]"):
    demo_tasks.ensure_tasks(data_dir, log=lambda *a: None, areas=no_gui)


def test_area_labels_are_the_builders_areas():
  assert python_docs.AREA_LABELS == tuple(demo_tasks.AREAS)
  assert python_docs.WORD_LABELS == demo_tasks.WORD_TAGS
  assert registry.get_task("doc_area").num_labels == len(demo_tasks.AREAS)


def _tokenizer(tmp_path, words):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(words)])
                   + "\n")
  return tokenization.load_tokenizer("wordpiece", str(vocab), do_lower_case=True)


def test_loaders_read_the_files_and_score_them(small_demo, tmp_path):
  data_dir, areas, _, eval_docs = small_demo
  demo_tasks.ensure_tasks(data_dir, log=lambda *a: None, areas=areas)
  tok = _tokenizer(tmp_path, {w.lower() for s in areas for w in demo_tasks.words(s)})
  config = ml_collections.ConfigDict({"data_dir": data_dir, "max_seq_length": 32})
  area = python_docs.load_doc_area("dev", tok, config)
  labels = area.arrays["labels"]
  assert len(area) == len(labels) == 3 * len(_AREAS)
  assert area.score(np.eye(len(_AREAS))[labels])["accuracy"] == 1.0
  assert area.score(np.eye(len(_AREAS))[(labels + 1) % len(_AREAS)])["accuracy"] == 0.0
  words = python_docs.load_word_area("dev", tok, config)
  tagged = [s for d in eval_docs for s in d if "buffer" in s]
  assert len(words) == len(tagged)
  assert words.arrays["label_weights"].sum() == sum(len(demo_tasks.words(s)) for s in tagged)
  num_labels = len(python_docs.WORD_LABELS)
  assert words.score(np.eye(num_labels)[words.arrays["labels"]])["f1"] == 1.0
  assert words.score(np.eye(num_labels)[np.zeros_like(words.arrays["labels"])])["f1"] == 0.0


def test_loaders_name_the_missing_file(tmp_path):
  config = ml_collections.ConfigDict({"data_dir": str(tmp_path), "max_seq_length": 32})
  with pytest.raises(FileNotFoundError, match="tasks/doc_area/train.tsv"):
    python_docs.load_doc_area("train", None, config)
  with pytest.raises(ValueError, match="no split 'test'"):
    python_docs.load_word_area("test", None, config)


def test_suite_mean_is_over_the_tasks_that_are_not_nsps_question():
  assert "same_document" not in suite.NON_NSP
  assert suite.non_nsp_mean({"same_document": 1.0, "doc_area": 0.5, "word_area": 0.25}) == (
      0.375)
  for task in suite.TASKS:
    assert suite.task_config(task).task == task


@pytest.mark.slow
def test_the_real_corpus_gives_every_area_and_shared_words(tmp_path):
  """From the demo corpus built from this Python: every area has sentences in
  both splits, and word_area tags hundreds of shared words."""
  from bertjax.create import demo  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / "demo_data")
  text = os.path.join(data_dir, "text")
  demo._write_demo_text({"train_text": os.path.join(text, "train.txt"),  # pylint: disable=protected-access
                         "eval_text": os.path.join(text, "eval.txt")}, 0.1, 12345,
                        lambda *a: None)
  dirs = demo_tasks.ensure_tasks(data_dir, log=lambda *a: None)
  for split in ("train", "dev"):
    rows = _read_tsv(os.path.join(dirs["doc_area"], f"{split}.tsv"))
    assert {a for a, _ in rows} == set(_AREAS)
    assert all(0 < sum(1 for x, _ in rows if x == a) <= demo_tasks.MAX_PER_AREA[split]
               for a in _AREAS)
    sentences = _read_tagged(os.path.join(dirs["word_area"], f"{split}.txt"))
    assert len(sentences) == demo_tasks.MAX_SENTENCES[split]
    assert len({w.lower() for s in sentences for w, t in s if t != "O"}) > 100


def _suite_cli(args, tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  return subprocess.run([sys.executable, "-m", "bertjax.studies.suite", *args],
                        capture_output=True, text=True, timeout=300, check=False,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_suite_command_names_the_bad_flag(tmp_path):
  (tmp_path / "vocab.txt").write_text("[PAD]\n")
  cases = {
      (f"--data_dir={tmp_path / 'none'}", "--random_init"): "no vocab.txt there",
      (f"--data_dir={tmp_path}", f"--checkpoint={tmp_path / 'missing'}"): "is not a directory",
      (f"--data_dir={tmp_path}",): "at least one --checkpoint or --random_init",
      (f"--data_dir={tmp_path}", "--random_init", "--seeds=a"): "--seeds=a: expected integers",
  }
  for args, message in cases.items():
    result = _suite_cli([*args, f"--workdir={tmp_path / 'w'}"], tmp_path)
    assert result.returncode != 0 and message in result.stderr, (args, result.stderr[-500:])


@pytest.mark.slow
def test_suite_scores_random_initialisation_on_the_real_tasks(tmp_path):
  """Both non-NSP tasks fine-tuned from random initialisation on the tasks built
  from this Python's corpus: a score per task and their mean."""
  from bertjax.create import demo  # pylint: disable=g-import-not-at-top
  from bertjax.text import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / "demo_data")
  text = os.path.join(data_dir, "text")
  demo._write_demo_text({"train_text": os.path.join(text, "train.txt"),  # pylint: disable=protected-access
                         "eval_text": os.path.join(text, "eval.txt")}, 0.1, 12345,
                        lambda *a: None)
  vocab_lib.build_wordpiece_vocab([os.path.join(text, "train.txt")],
                                  os.path.join(data_dir, "vocab.txt"), vocab_size=2000,
                                  do_lower_case=True)
  scores = suite.score("", data_dir, str(tmp_path / "suite"), tasks=suite.NON_NSP)
  assert set(scores) == {"doc_area", "word_area", "non_nsp_mean"}
  assert all(0.0 <= scores[t] <= 1.0 for t in suite.NON_NSP)
  assert scores["non_nsp_mean"] == pytest.approx((scores["doc_area"] + scores["word_area"]) / 2)
  assert os.path.exists(tmp_path / "suite" / "word_area" / "results.json")
