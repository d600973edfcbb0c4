"""Test-set prediction files from fine-tuned checkpoints: GLUE's test layouts (against the
original release's processors) and submission files, SQuAD, CoNLL-2003 and SWAG, each
equal to what the dev path's outputs give for the same inputs."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax import downstream
from bertjax.tasks import batches as batches_lib
from bertjax.tasks import conll
from bertjax.tasks import features
from bertjax.tasks import glue
from bertjax.tasks import loop
from bertjax.tasks import registry
from bertjax.tasks import step as step_lib
from bertjax.tasks import submissions
from bertjax.text import tokenization
from bertjax.train import sharding as sharding_lib

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(os.path.dirname(TESTS), "configs", "finetune"))
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import glue as glue_config  # pylint: disable=g-import-not-at-top,wrong-import-position
import ner as ner_config  # pylint: disable=g-import-not-at-top,wrong-import-position
import squad as squad_config  # pylint: disable=g-import-not-at-top,wrong-import-position
import squad_fixtures  # pylint: disable=g-import-not-at-top,wrong-import-position
import swag as swag_config  # pylint: disable=g-import-not-at-top,wrong-import-position

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
            max_position_embeddings=64, dtype="float32")
SUBMISSIONS = {"cola": ["CoLA.tsv"], "sst2": ["SST-2.tsv"], "mrpc": ["MRPC.tsv"],
               "stsb": ["STS-B.tsv"], "qqp": ["QQP.tsv"],
               "mnli": ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"], "qnli": ["QNLI.tsv"],
               "rte": ["RTE.tsv"], "wnli": ["WNLI.tsv"]}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return finetune_data.write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt"))


def _texts(n, seed):
  return [(a, b) for _, a, b in finetune_data.pair_rows(n, seed)]


def _glue_root(root, texts):
  for task_dir in finetune_data.GLUE_TEST_LAYOUTS:
    finetune_data.write_glue_test(str(root), task_dir, texts)
  return str(root)


@pytest.mark.parametrize("task", sorted(glue.TASKS))
def test_every_glue_test_layout_and_submission_file(task, vocab, tmp_path):
  texts = _texts(5, 3)
  root = _glue_root(tmp_path / "glue", texts)
  tokenizer = tokenization.load_tokenizer("wordpiece", vocab)
  t = glue.TASKS[task]
  splits = glue.load_test(t, tokenizer, 24, root)
  assert [t.test[s.name].submission for s in splits] == SUBMISSIONS[task]
  single = t.test[splits[0].name].text_b is None
  expected = features.encode_pairs(tokenizer, [a for a, _ in texts],
                                   None if single else [b for _, b in texts], 24)
  for split in splits:
    for key, value in expected.items():
      np.testing.assert_array_equal(split.arrays[key], value, err_msg=f"{split.name} {key}")
    outputs = np.random.default_rng(0).normal(size=(len(texts), max(len(t.labels), 1)))
    assert split.score(outputs, output_dir=str(tmp_path / "out")) == {"rows": len(texts)}
    name = t.test[split.name].submission
    with open(tmp_path / "out" / name, encoding="utf-8") as f:
      rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"]
    assert [r[0] for r in rows[1:]] == [str(100 + i) for i in range(len(texts))]
    if t.labels:
      assert [r[1] for r in rows[1:]] == [t.labels[i] for i in outputs.argmax(-1)]
    else:  # STS-B: the score itself.
      np.testing.assert_allclose([float(r[1]) for r in rows[1:]], outputs[:, 0], atol=5e-4)


def test_glue_without_the_diagnostic_set_writes_the_rest(vocab, tmp_path):
  finetune_data.write_glue_test(str(tmp_path), "MNLI", _texts(3, 0))
  splits = glue.load_test(glue.TASKS["mnli"], tokenization.load_tokenizer("wordpiece", vocab),
                          24, str(tmp_path / "MNLI"))
  assert [s.name for s in splits] == ["test_matched", "test_mismatched"]
  with pytest.raises(FileNotFoundError, match=r"no test.tsv for task rte"):
    glue.load_test(glue.TASKS["rte"], None, 24, str(tmp_path / "MNLI"))


@pytest.mark.slow
@pytest.mark.parametrize("task,task_dir", [("cola", "CoLA"), ("mrpc", "MRPC"),
                                           ("mnli", "MNLI")])
def test_glue_test_files_read_as_the_original_run_classifier(task, task_dir, vocab, tmp_path):
  """The release's processors' get_test_examples on the same files give the same inputs."""
  finetune_data.write_glue_test(str(tmp_path), task_dir, _texts(12, 5))
  data_dir = str(tmp_path / task_dir)
  split = glue.load_test(glue.TASKS[task], tokenization.load_tokenizer("wordpiece", vocab),
                         16, data_dir)[0]
  out = str(tmp_path / "original.npz")
  result = subprocess.run(
      [sys.executable, "original_release.py", "classify", task, data_dir, vocab, "16", out,
       "test"], cwd=TESTS, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  original = np.load(out)
  assert len(split) == len(original["input_ids"]) == 12
  for key in ("input_ids", "input_mask", "segment_ids"):
    np.testing.assert_array_equal(split.arrays[key], original[key], err_msg=key)


def _tiny(config, **changes):
  config.model.update(TINY)
  config.checkpoint.every_steps = 1000
  config.logging.every_steps = 100
  config.bucketing.min_length = 8  # Buckets 8, 16, 32: several shapes even here.
  config.update(changes)
  return config


def _dev_outputs(config, workdir, split_name="dev"):
  """The dev path's outputs (loop.predict on the task's dev split) with the run's
  final checkpoint."""
  task = registry.get_task(config.task)
  mesh, rules = sharding_lib.make_mesh(config.mesh), sharding_lib.rules(config.mesh)
  state, shardings, _, _ = submissions.restore_for_prediction(
      task, os.path.join(workdir, "checkpoints"), config.max_seq_length, mesh, rules)
  tokenizer = tokenization.load_tokenizer("wordpiece", config.vocab_file, config.do_lower_case)
  split = task.load(split_name, tokenizer, config)
  _, p_predict = step_lib.jit_steps(shardings, mesh, task.kind)
  with sharding_lib.mesh_context(mesh, rules):
    return split, loop.predict(p_predict, state, split, 4, sharding_lib.batch_sharding(mesh))


def _read_tsv(path):
  with open(path, encoding="utf-8") as f:
    return list(csv.reader(f, delimiter="\t"))


@pytest.mark.slow
def test_mrpc_train_and_predict_then_predict_mode(vocab, tmp_path):
  data_dir = finetune_data.write_mrpc(str(tmp_path / "MRPC"), num_train=32, num_dev=20)
  dev_texts = [(line[3], line[4]) for line in _read_tsv(os.path.join(data_dir, "dev.tsv"))[1:]]
  finetune_data.write_glue_test(str(tmp_path), "MRPC", dev_texts)  # Test = dev's texts.
  config = _tiny(glue_config.get_config(), task="MRPC", data_dir=data_dir, vocab_file=vocab,
                 max_seq_length=32, global_batch_size=8, eval_batch_size=4, num_epochs=1.0,
                 mode="train_and_predict")
  workdir = str(tmp_path / "run")
  result = downstream.finetune(config, workdir)
  assert result["test"]["test"] == {"test": {"rows": 20}} and result["test"]["step"] == 4
  rows = _read_tsv(os.path.join(workdir, "predictions", "MRPC.tsv"))
  assert rows[0] == ["index", "prediction"] and len(rows) == 21
  assert {r[1] for r in rows[1:]} <= {"0", "1"}
  split, dev = _dev_outputs(config, workdir)
  assert [r[1] for r in rows[1:]] == [str(i) for i in np.argmax(dev, -1)]
  lengths = batches_lib.example_lengths(split.arrays)
  assert lengths.min() <= 16 < lengths.max()  # Prediction used several buckets.
  # Predict mode on the finished run: the same file in another directory.
  again = _tiny(glue_config.get_config(), task="mrpc", data_dir=data_dir, vocab_file=vocab,
                max_seq_length=32, eval_batch_size=4, mode="predict",
                predict_dir=str(tmp_path / "again"))
  summary = downstream.finetune(again, workdir)
  assert summary["checkpoint"] == os.path.join(workdir, "checkpoints")
  assert _read_tsv(str(tmp_path / "again" / "MRPC.tsv")) == rows
  with open(tmp_path / "again" / submissions.SUMMARY, encoding="utf-8") as f:
    assert json.load(f)["test"] == {"test": {"rows": 20}}


def test_mnli_predicts_matched_mismatched_and_ax(vocab, tmp_path):
  data_dir = finetune_data.write_mnli(str(tmp_path / "MNLI"), num=16)
  texts = _texts(6, 9)
  for task_dir in ("MNLI", "diagnostic"):
    finetune_data.write_glue_test(str(tmp_path), task_dir, texts)
  config = _tiny(glue_config.get_config(), task="mnli", data_dir=data_dir, vocab_file=vocab,
                 max_seq_length=32, global_batch_size=8, eval_batch_size=4, num_epochs=1.0,
                 mode="train_and_predict")
  workdir = str(tmp_path / "run")
  downstream.finetune(config, workdir)
  written = {}
  for name in ("MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"):
    rows = _read_tsv(os.path.join(workdir, "predictions", name))
    assert rows[0] == ["index", "prediction"] and len(rows) == 7
    assert {r[1] for r in rows[1:]} <= set(finetune_data.MNLI_LABELS)
    written[name] = rows
  # The same texts in all three files: the same predictions.
  assert written["MNLI-m.tsv"] == written["MNLI-mm.tsv"] == written["AX.tsv"]
  with pytest.raises(ValueError, match=r"fine-tuned on task 'mnli', not 'rte'"):
    downstream.finetune(_tiny(glue_config.get_config(), task="rte", data_dir=data_dir,
                              vocab_file=vocab, mode="predict",
                              predict_from=os.path.join(workdir, "checkpoints")),
                        str(tmp_path / "other"))


@pytest.mark.parametrize("version", ["2.0"])
def test_squad_predicts_any_file_as_the_dev_path_does(version, tmp_path):
  data = squad_fixtures.squad_v2() if version == "2.0" else squad_fixtures.squad_v1()
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  for split in ("train", "dev"):
    squad_fixtures.write_json(str(data_dir / f"{split}-v{version}.json"), data)
  # The file to predict: the dev questions without their answers.
  questions = json.loads(json.dumps(data))
  for article in questions["data"]:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        qa.pop("answers", None)
        qa.pop("is_impossible", None)
  predict_file = squad_fixtures.write_json(str(tmp_path / "questions.json"), questions)
  config = _tiny(squad_config.get_config(), version=version, data_dir=str(data_dir),
                 vocab_file=squad_fixtures.write_vocab(str(tmp_path), data),
                 max_seq_length=48, doc_stride=16, max_query_length=12, eval_batch_size=8,
                 num_epochs=1.0, global_batch_size=4)
  workdir = str(tmp_path / "run")
  downstream.finetune(config, workdir)  # Scoring dev writes its prediction files here.
  config.update(mode="predict", predict_file=predict_file)
  summary = downstream.finetune(config, workdir)
  names = sorted(["nbest_predictions.json", "predictions.json"] + (
      ["null_odds.json"] if version == "2.0" else []))
  written = sorted(f for f in os.listdir(os.path.join(workdir, "predictions"))
                   if f != submissions.SUMMARY)
  assert written == names
  ids = {qa["id"] for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]}
  assert summary["test"]["predict"] == {"questions": len(ids)}
  for name in names:
    with open(os.path.join(workdir, "predictions", name), encoding="utf-8") as f:
      predicted = json.load(f)
    with open(os.path.join(workdir, name), encoding="utf-8") as f:
      dev = json.load(f)
    assert set(predicted) == ids
    assert predicted == pytest.approx(dev) if name == "null_odds.json" else predicted == dev


CONLL_TEST = """-DOCSTART- -X- -X- O

word1 NNP B-NP B-PER
cats NNP I-NP I-PER
runs VBZ B-VP O

dog NN B-NP B-ORG
sits VBZ B-VP O
word2 NN B-NP B-MISC
"""


@pytest.mark.slow
def test_conll_predictions_file(vocab, tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  for name in ("train.txt", "valid.txt"):
    (data / name).write_text(CONLL_TEST)
  # The words alone (no tags) as the input to predict.
  words_only = "\n".join(line.split()[0] if line.split() else "" for line in
                         CONLL_TEST.splitlines())
  (tmp_path / "words.txt").write_text(words_only)
  config = _tiny(ner_config.get_config(), data_dir=str(data), vocab_file=vocab,
                 max_seq_length=16, global_batch_size=2, eval_batch_size=2, num_epochs=2.0,
                 mode="train_and_predict", predict_file=str(tmp_path / "words.txt"))
  workdir = str(tmp_path / "run")
  result = downstream.finetune(config, workdir)
  assert result["test"]["test"] == {"test": {"sentences": 2}}
  with open(os.path.join(workdir, "predictions", conll.PREDICTIONS), encoding="utf-8") as f:
    sentences = [s.split("\n") for s in f.read().strip("\n").split("\n\n")]
  split, dev = _dev_outputs(config, workdir)
  words = conll.read_sentences(str(data / "valid.txt"))[0]
  first_positions = conll.encode(
      tokenization.load_tokenizer("wordpiece", vocab, False), words,
      [np.zeros(len(w), np.int32) for w in words], 16)[1]
  expected = conll.predicted_tags(first_positions, dev)
  assert [[line.split()[0] for line in s] for s in sentences] == words
  assert [[line.split()[1] for line in s] for s in sentences] == expected
  assert {t for s in expected for t in s} <= set(conll.LABELS)
  assert len(split) == 2


SWAG_TEST = """,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3
7,v1,1,x,the cat runs,the dog,gold,sits,runs,word1,word2
9,v2,2,x,a dog sits,the cat,gold,runs,sits,word3,word4
"""


@pytest.mark.slow
def test_swag_predictions_file(vocab, tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  labelled = SWAG_TEST.replace("ending3\n", "ending3,label\n").replace("word2\n", "word2,1\n")
  labelled = labelled.replace("word4\n", "word4,2\n")
  for name in ("train.csv", "val.csv"):
    (data / name).write_text(labelled)
  (data / "test.csv").write_text(SWAG_TEST)
  config = _tiny(swag_config.get_config(), data_dir=str(data), vocab_file=vocab,
                 max_seq_length=16, global_batch_size=2, eval_batch_size=2, num_epochs=2.0,
                 mode="train_and_predict")
  workdir = str(tmp_path / "run")
  downstream.finetune(config, workdir)
  with open(os.path.join(workdir, "predictions", "swag_predictions.csv"), encoding="utf-8") as f:
    rows = list(csv.reader(f))
  _, dev = _dev_outputs(config, workdir)
  assert rows == [["id", "label"], ["7", str(np.argmax(dev[0]))], ["9", str(np.argmax(dev[1]))]]


def test_predict_mode_errors_name_the_field(vocab, tmp_path):
  config = _tiny(glue_config.get_config(), vocab_file=vocab, mode="evaluate")
  with pytest.raises(ValueError, match=r"--config.mode='evaluate'"):
    downstream.finetune(config, str(tmp_path))
  config.mode = "predict"
  with pytest.raises(FileNotFoundError, match=r"--config.predict_from=.*no such checkpoint"):
    downstream.finetune(config, str(tmp_path))
