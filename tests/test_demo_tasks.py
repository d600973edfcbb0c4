"""The demo corpus's labelled tasks (bertjax/create/demo_tasks.py, bertjax/tasks/
python_docs.py) and the suite that fine-tunes on them (bertjax/studies/suite.py)."""

import collections
import json
import os
import random

import ml_collections
import numpy as np
import pytest

from bertjax.create import demo
from bertjax.create import demo_tasks
from bertjax.studies import suite
from bertjax.tasks import bag_of_words
from bertjax.tasks import python_docs
from bertjax.tasks import registry
from bertjax.tasks.split import Split
from bertjax.text import tokenization

_AREAS = list(demo_tasks.AREAS)


def _write_demo_text(data_dir, docs_by_split, sources=None):
  """The demo's text files, and each split's sources (one per document unless
  `sources` gives them) as bertjax.create.demo writes them."""
  os.makedirs(os.path.join(data_dir, "text"), exist_ok=True)
  for split, docs in docs_by_split.items():
    with open(os.path.join(data_dir, "text", split), "w", encoding="utf-8") as f:
      f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
  if sources is None:
    sources = {split.removesuffix(".txt"): [f"{split}:{i}" for i in range(len(docs))]
               for split, docs in docs_by_split.items()}
  with open(demo.sources_path(data_dir), "w", encoding="utf-8") as f:
    json.dump(sources, f)


@pytest.fixture
def small_demo(tmp_path, monkeypatch):
  """Demo text of two documents per area in train and one in eval (three
  sentences each), every sentence's area, and one sentence no source names.
  Every sentence holds its area's own three words; email's and gui's hold
  "buffer" too, the one word that two areas share. Half of the area words
  make related_words' dev pairs."""
  monkeypatch.setattr(demo_tasks, "COMMON", 0)
  monkeypatch.setattr(demo_tasks, "MIN_COUNT", 2)
  monkeypatch.setattr(demo_tasks, "DEV_WORD_SHARE", 0.5)
  monkeypatch.setattr(demo_tasks, "MAX_PAIRS", {"train": 40, "dev": 20})
  areas, train_docs, eval_docs = {}, [], []
  i = 0
  for area in _AREAS:
    for docs in (train_docs, train_docs, eval_docs):
      doc = []
      for _ in range(3):
        shared = " buffer" if area in ("email", "gui") else ""
        doc.append(f"Sentence {i} fills{shared} with {area}stuff, {area}bits and "
                   f"{area}things here.")
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


def test_loaders_name_the_malformed_line(tmp_path):
  config = ml_collections.ConfigDict({"data_dir": str(tmp_path), "max_seq_length": 16})
  for task, text, message in (
      ("doc_area", "email\tA sentence.\nemail\n", r"dev.tsv:2: expected 'label<TAB>sentence'"),
      ("related_words", "same\tmailbox\tmessage\nsame\tmailbox\ta\tb\n",
       r"dev.tsv:2: expected 'label<TAB>word<TAB>word'"),
      ("related_words", "same\tmailbox\t \n", r"dev.tsv:1: expected")):
    os.makedirs(tmp_path / "tasks" / task, exist_ok=True)
    (tmp_path / "tasks" / task / "dev.tsv").write_text(text)
    with pytest.raises(ValueError, match=message):
      registry.get_task(task).load("dev", None, config)


def test_loaders_name_the_missing_file(tmp_path):
  config = ml_collections.ConfigDict({"data_dir": str(tmp_path), "max_seq_length": 32})
  with pytest.raises(FileNotFoundError, match="tasks/doc_area/train.tsv"):
    python_docs.load_doc_area("train", None, config)
  with pytest.raises(ValueError, match="no split 'test'"):
    python_docs.load_word_area("test", None, config)


def test_suite_summary_is_over_the_tasks_a_bag_of_words_cannot_do():
  assert suite.TRANSFER == ("same_document", "related_words")
  assert not set(suite.TRANSFER) & set(suite.REFERENCE)
  scores = {"same_document": 1.0, "related_words": 0.5, "doc_area": 0.0, "word_area": 0.0}
  assert suite.transfer_mean(scores) == 0.75
  for task in suite.TASKS:
    assert suite.task_config(task).task == task
    assert registry.get_task(task).name == task
  assert set(suite.TASKS) == set(demo_tasks.TASK_FILES) | {"same_document"}


def test_tasks_need_the_text_split_by_source(small_demo):
  data_dir, areas, _, _ = small_demo
  os.remove(demo.sources_path(data_dir))
  with pytest.raises(FileNotFoundError, match="sources.json: missing"):
    demo_tasks.ensure_tasks(data_dir, log=lambda *a: None, areas=areas)
  with open(demo.sources_path(data_dir), "w", encoding="utf-8") as f:
    json.dump({"train": ["a.py", "b.py"], "eval": ["b.py"]}, f)
  with pytest.raises(ValueError, match=r"both sides of the split: \['b.py'\]"):
    demo_tasks.ensure_tasks(data_dir, log=lambda *a: None, areas=areas)


def test_split_by_source_keeps_every_source_on_one_side():
  sources = [(f"m{i}.py", [[f"s{i}.{j}"] for j in range(1 + i % 4)]) for i in range(40)]
  split = demo.split_by_source(sources, 0.1, seed=3)
  train, held = ({name for name, _ in split[k]} for k in ("train", "eval"))
  assert train | held == {name for name, _ in sources} and not train & held
  held_docs = sum(len(docs) for _, docs in split["eval"])
  total = sum(len(docs) for _, docs in sources)
  # Whole sources are drawn until a tenth of the documents is held out.
  assert round(0.1 * total) <= held_docs < round(0.1 * total) + 4
  assert split == demo.split_by_source(sources, 0.1, seed=3)
  assert split != demo.split_by_source(sources, 0.1, seed=4)
  assert [name for name, _ in split["eval"]] == [n for n, _ in sources if n in held]


def test_same_document_pairs_a_sentence_with_the_next_or_another_documents():
  from bertjax.tasks import same_document  # pylint: disable=g-import-not-at-top
  docs = [[f"d{d} s{i}" for i in range(2 + d % 3)] for d in range(30)]
  where = {s: (d, i) for d, doc in enumerate(docs) for i, s in enumerate(doc)}
  first, second, labels = same_document.make_pairs(docs, 200, seed=0)
  assert labels.sum() == 100  # Balanced.
  for a, b, label in zip(first, second, labels):
    (da, ia), (db, ib) = where[a], where[b]
    assert (da == db and ib == ia + 1) if label else da != db


def test_area_words_are_mostly_in_one_area_and_pairs_alternate_same_and_different(
    monkeypatch):
  monkeypatch.setattr(demo_tasks, "COMMON", 1)
  monkeypatch.setattr(demo_tasks, "AREA_WORD_MIN_COUNT", 3)
  labelled = [("email", "the mailbox the message"), ("email", "the mailbox message"),
              ("email", "mailbox message window"), ("gui", "the window the widget"),
              ("gui", "window widget widget"), ("gui", "the window message")]
  # the: commonest, left out; mailbox: email 3/3; message: email 3 of 4 (under
  # 0.8); window: gui 3 of 4; widget: gui 3/3.
  assert demo_tasks.area_words(labelled) == {"mailbox": "email", "widget": "gui"}
  monkeypatch.setattr(demo_tasks, "AREA_WORD_MIN_SHARE", 0.75)
  assert demo_tasks.area_words(labelled) == {"mailbox": "email", "message": "email",
                                             "window": "gui", "widget": "gui"}
  by_area = {"email": ["mailbox", "message"], "gui": ["window", "widget"], "gui2": []}
  rows = demo_tasks.related_pairs(by_area, 200, random.Random(0))
  of = {w: a for a, ws in by_area.items() for w in ws}
  assert [label for label, _, _ in rows] == ["same", "different"] * 100
  for label, a, b in rows:
    assert a != b and (of[a] == of[b]) == (label == "same")
  with pytest.raises(ValueError, match="related_words: too few area words"):
    demo_tasks.related_pairs({"email": ["mailbox"], "gui": ["widget"]}, 4, random.Random(0))


def test_related_words_dev_pairs_hold_only_words_no_training_pair_holds(small_demo, tmp_path):
  data_dir, areas, _, _ = small_demo
  dirs = demo_tasks.ensure_tasks(data_dir, log=lambda *a: None, areas=areas)
  rows = {split: _read_tsv(os.path.join(dirs["related_words"], f"{split}.tsv"))
          for split in ("train", "dev")}
  assert len(rows["train"]) == 40 and len(rows["dev"]) == 20
  held = {split: {w for _, a, b in r for w in (a, b)} for split, r in rows.items()}
  assert held["dev"] and not held["train"] & held["dev"]
  area_of = {w.lower(): a for s, a in areas.items() for w in demo_tasks.words(s)
             if w.lower().startswith(a)}
  for split in rows:
    for label, a, b in rows[split]:
      assert (area_of[a] == area_of[b]) == (label == "same")
  # The loader reads them as pairs; a bag of words trained on the training
  # pairs knows nothing of the dev words.
  tok = _tokenizer(tmp_path, {w.lower() for s in areas for w in demo_tasks.words(s)})
  config = ml_collections.ConfigDict({"data_dir": data_dir, "max_seq_length": 16})
  train, dev = (python_docs.load_related_words(split, tok, config) for split in ("train", "dev"))
  assert len(dev) == 20 and set(np.unique(dev.arrays["segment_ids"])) == {0, 1}
  assert dev.score(np.eye(2)[dev.arrays["labels"]])["accuracy"] == 1.0
  got = bag_of_words.fit_and_score("classification", 2, train, dev, tok.vocab_size,
                                   tok.special_ids.values())
  assert got["accuracy"] == 0.5  # The same prediction for every dev pair.


def _split(input_ids, labels, segment_ids=None, label_weights=None, kind="classification"):
  input_ids = np.asarray(input_ids, np.int32)
  arrays = {"input_ids": input_ids, "input_mask": (input_ids > 0).astype(np.int32),
            "segment_ids": (np.zeros_like(input_ids) if segment_ids is None
                            else np.asarray(segment_ids, np.int32)),
            "labels": np.asarray(labels, np.int32)}
  if kind == "token":
    arrays["label_weights"] = np.asarray(label_weights, np.float32)
    gold = arrays["labels"]
    score = lambda out: {"accuracy": float(
        (out.argmax(-1) == gold)[arrays["label_weights"] > 0].mean())}
  else:
    score = lambda out: {"accuracy": float((out.argmax(-1) == arrays["labels"]).mean())}
  return Split("s", arrays, score)


def test_bag_of_words_sees_which_words_occur_but_not_their_order():
  rng = np.random.default_rng(0)
  special = (0, 1, 2, 3, 4)  # [PAD], [UNK], [CLS], [SEP], [MASK].

  def rows(n):
    ids = rng.integers(10, 40, (n, 8))
    present = rng.integers(0, 2, n)
    ids[present == 1, 3] = 7  # Label 1: word 7 occurs.
    ids[:, 0], ids[:, -1] = 2, 3
    return ids, present

  (train, y), (dev, y_dev) = rows(400), rows(200)
  got = bag_of_words.fit_and_score("classification", 2, _split(train, y), _split(dev, y_dev),
                                   50, special)
  assert got["accuracy"] == 1.0
  # Label: whether two words were swapped. Each sentence's swapped copy holds
  # the same words, so no bag of words tells the two apart.
  order = np.concatenate([train, train[:, [0, 2, 1, *range(3, 8)]]])
  labels = np.repeat([0, 1], len(train))
  got = bag_of_words.fit_and_score("classification", 2, _split(order, labels),
                                   _split(order, labels), 50, special)
  assert got["accuracy"] == 0.5
  # A pair task's segments are counted apart: word 9 in segment B only.
  pair = rng.integers(10, 40, (400, 8))
  segments = np.tile([0, 0, 0, 0, 1, 1, 1, 1], (400, 1))
  side = rng.integers(0, 2, 400)
  pair[np.arange(400), 2 + 4 * side] = 9
  got = bag_of_words.fit_and_score("classification", 2, _split(pair, side, segments),
                                   _split(pair, side, segments), 50, special)
  assert got["accuracy"] == 1.0
  # Token tags told by the word itself: tag 1 on word 7, 0 elsewhere.
  tags = (train == 7).astype(np.int32)
  weights = (train >= 5).astype(np.float32)
  got = bag_of_words.fit_and_score(
      "token", 2, _split(train, tags, label_weights=weights, kind="token"),
      _split(train, tags, label_weights=weights, kind="token"), 50, special)
  assert got["accuracy"] == 1.0
  with pytest.raises(ValueError, match="no bag-of-words baseline for task kind 'span'"):
    bag_of_words.fit_and_score("span", 2, None, None, 50, special)


def _real_demo_text(data_dir):
  text = os.path.join(data_dir, "text")
  demo._write_demo_text({"train_text": os.path.join(text, "train.txt"),  # pylint: disable=protected-access
                         "eval_text": os.path.join(text, "eval.txt")}, 0.1, 12345,
                        lambda *a: None)


@pytest.mark.slow
def test_the_real_corpus_is_split_by_source_file_and_gives_every_task(tmp_path):
  """From the demo corpus built from this Python: no reference topic or library
  file has sentences on both sides of the split, every area has sentences in
  both splits, word_area tags hundreds of shared words, and related_words has
  its pairs, the dev words apart from the training words."""
  data_dir = str(tmp_path / "demo_data")
  _real_demo_text(data_dir)
  sources = demo_tasks.check_split_by_source(data_dir)
  of_sentence = demo_tasks.sentence_sources()
  seen = {}
  for split, name in (("train", "train.txt"), ("eval", "eval.txt")):
    docs = demo_tasks._documents(os.path.join(data_dir, "text", name))  # pylint: disable=protected-access
    seen[split] = {of_sentence[s] for d in docs for s in d if s in of_sentence}
    assert seen[split] <= set(sources[split]), split
  assert not seen["train"] & seen["eval"]
  assert len(seen["eval"]) > 20 and len(seen["train"]) > 5 * len(seen["eval"])
  assert any(s.startswith("reference:") for s in seen["eval"])
  dirs = demo_tasks.ensure_tasks(data_dir, log=lambda *a: None)
  for split in ("train", "dev"):
    rows = _read_tsv(os.path.join(dirs["doc_area"], f"{split}.tsv"))
    # Training has every area; dev, whose files are a tenth of the sources, most.
    assert {a for a, _ in rows} == set(_AREAS) or (
        split == "dev" and len({a for a, _ in rows}) >= len(_AREAS) - 2)
    assert all(sum(1 for x, _ in rows if x == a) <= demo_tasks.MAX_PER_AREA[split]
               for a in _AREAS)
    sentences = _read_tagged(os.path.join(dirs["word_area"], f"{split}.txt"))
    assert len(sentences) == demo_tasks.MAX_SENTENCES[split]
    assert len({w.lower() for s in sentences for w, t in s if t != "O"}) > 100
    rows = _read_tsv(os.path.join(dirs["related_words"], f"{split}.tsv"))
    assert len(rows) == demo_tasks.MAX_PAIRS[split]
    assert len({w for _, a, b in rows for w in (a, b)}) > 100
  train_words, dev_words = ({w for _, a, b in _read_tsv(os.path.join(
      dirs["related_words"], f"{split}.tsv")) for w in (a, b)} for split in ("train", "dev"))
  assert not train_words & dev_words


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
def test_suite_scores_random_initialisation_and_a_bag_of_words_on_the_real_tasks(tmp_path):
  """The transfer tasks built from this Python's corpus, fine-tuned from random
  initialisation: a score per task and their mean; a bag of words trained on the
  same rows is within 0.05 of chance on them, and well above it on doc_area."""
  from bertjax.text import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / "demo_data")
  _real_demo_text(data_dir)
  vocab_lib.build_wordpiece_vocab([os.path.join(data_dir, "text", "train.txt")],
                                  os.path.join(data_dir, "vocab.txt"), vocab_size=2000,
                                  do_lower_case=True)
  scores = suite.score("", data_dir, str(tmp_path / "suite"), tasks=suite.TRANSFER)
  assert set(scores) == {*suite.TRANSFER, suite.SUMMARY}
  assert all(0.0 <= scores[t] <= 1.0 for t in suite.TRANSFER)
  assert scores[suite.SUMMARY] == pytest.approx(
      (scores["same_document"] + scores["related_words"]) / 2)
  assert os.path.exists(tmp_path / "suite" / "related_words" / "results.json")
  bag = suite.bag_of_words(data_dir, tasks=(*suite.TRANSFER, "doc_area"))
  for task in suite.TRANSFER:
    assert abs(bag[task] - 0.5) <= 0.05, (task, bag[task])
  assert bag["doc_area"] > 0.4  # Nine areas: chance is about 0.11.
