"""Task data: GLUE TSVs and TFDS glue/* to features, checked against the original
release's run_classifier; label errors, unknown tasks, batches and metrics."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from bertjax.tasks import batches
from bertjax.tasks import glue
from bertjax.tasks import metrics
from bertjax.tasks import registry
from bertjax.tasks.split import LabelError
from bertjax.text import tokenization

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position

WRITERS = {"mrpc": finetune_data.write_mrpc, "cola": finetune_data.write_cola,
           "mnli": finetune_data.write_mnli}
FIRST_DEV = {"mrpc": "dev", "cola": "dev", "mnli": "dev_matched"}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return finetune_data.write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt"))


def _original(task, data_dir, vocab, max_seq, tmp_path):
  out = str(tmp_path / "original.npz")
  result = subprocess.run(
      [sys.executable, "original_release.py", "classify", task, data_dir, vocab,
       str(max_seq), out], cwd=TESTS, capture_output=True, text=True, timeout=300,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return dict(np.load(out))


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(WRITERS))
def test_features_equal_the_original_run_classifier(task, vocab, tmp_path):
  data_dir = WRITERS[task](str(tmp_path / task))
  max_seq = 16  # Short enough that many pairs are truncated.
  tokenizer = tokenization.load_tokenizer("wordpiece", vocab)
  split = glue.load(glue.TASKS[task], FIRST_DEV[task], tokenizer, max_seq, data_dir)
  original = _original(task, data_dir, vocab, max_seq, tmp_path)
  assert len(split) == len(original["label_id"]) > 0
  for key in ("input_ids", "input_mask", "segment_ids"):
    np.testing.assert_array_equal(split.arrays[key], original[key], err_msg=key)
  np.testing.assert_array_equal(split.arrays["labels"], original["label_id"])
  assert (split.arrays["input_mask"].sum(1) == max_seq).any()  # Some were truncated.


def _write(path, lines):
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


TSV_ROWS = {
    # task: (header, a row whose label is valid, column count)
    "sst2": ("sentence\tlabel", "word1 word2\t1"),
    "stsb": ("\t".join(f"c{i}" for i in range(10)), "\t".join(
        ["0", "x", "x", "x", "x", "x", "x", "word1 word2", "word3", "3.8"])),
    "qqp": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            "0\t1\t2\tword1 word2\tword2 word3\t1"),
    "qnli": ("index\tquestion\tsentence\tlabel", "0\tword1\tword2\tnot_entailment"),
    "rte": ("index\tsentence1\tsentence2\tlabel", "0\tword1\tword2\tentailment"),
    "wnli": ("index\tsentence1\tsentence2\tlabel", "0\tword1\tword2\t1"),
}


@pytest.mark.parametrize("task", sorted(TSV_ROWS))
def test_each_glue_tsv_layout(task, vocab, tmp_path):
  header, row = TSV_ROWS[task]
  _write(str(tmp_path / "train.tsv"), [header, row, row])
  split = glue.load(glue.TASKS[task], "train", tokenization.load_tokenizer("wordpiece", vocab),
                    16, str(tmp_path))
  assert len(split) == 2
  expected = 3.8 if task == "stsb" else glue.TASKS[task].labels.index(row.split("\t")[-1])
  assert split.arrays["labels"][0] == pytest.approx(expected)
  assert split.arrays["input_ids"][0, 0] == 2 and 3 in split.arrays["input_ids"][0]


def test_a_label_outside_the_label_set_names_file_and_line(vocab, tmp_path):
  path = str(tmp_path / "train.tsv")
  _write(path, ["index\tsentence1\tsentence2\tlabel", "0\tword1\tword2\tentailment",
                "1\tword1\tword2\tmaybe"])
  with pytest.raises(LabelError) as e:
    glue.load(glue.TASKS["rte"], "train", tokenization.load_tokenizer("wordpiece", vocab),
              16, str(tmp_path))
  assert f"{path}:3" in str(e.value) and "'maybe'" in str(e.value)
  assert "not_entailment" in str(e.value)


def test_unknown_task_lists_the_tasks():
  with pytest.raises(ValueError) as e:
    registry.get_task("mrcp")
  for name in ("cola", "mnli", "mrpc", "stsb", "wnli"):
    assert name in str(e.value)


def test_task_names_as_people_write_them():
  for written, name in (("SST-2", "sst2"), ("STS-B", "stsb"), ("MNLI", "mnli"),
                        ("CoLA", "cola"), ("CoNLL-2003", "conll2003"), ("SQuAD", "squad"),
                        ("mrpc", "mrpc")):
    assert registry.get_task(written).name == name, written


def test_data_dir_may_be_the_glue_root(vocab, tmp_path):
  """The GLUE distribution's root, with MRPC/ and SST-2/ inside, reads as the task's dir."""
  tokenizer = tokenization.load_tokenizer("wordpiece", vocab)
  task_dir = WRITERS["mrpc"](str(tmp_path / "glue_data" / glue.GLUE_DIRS["mrpc"]))
  direct = glue.load(glue.TASKS["mrpc"], "dev", tokenizer, 16, task_dir)
  from_root = glue.load(glue.TASKS["mrpc"], "dev", tokenizer, 16, str(tmp_path / "glue_data"))
  assert len(from_root.arrays["labels"]) == len(direct.arrays["labels"]) > 0
  for k, v in direct.arrays.items():
    np.testing.assert_array_equal(from_root.arrays[k], v, err_msg=k)
  assert set(glue.GLUE_DIRS) == set(glue.TASKS)


def test_missing_tsv_names_the_flag(vocab, tmp_path):
  with pytest.raises(FileNotFoundError, match="--config.data_dir"):
    glue.load(glue.TASKS["mrpc"], "dev", tokenization.load_tokenizer("wordpiece", vocab),
              16, str(tmp_path))


@pytest.mark.parametrize("task,split", [("mrpc", "dev"), ("mnli", "dev_mismatched"),
                                        ("stsb", "dev")])
def test_tfds_glue_gives_tsv_label_strings(task, split, vocab):
  tfds = pytest.importorskip("tensorflow_datasets")
  spec = glue.TASKS[task]
  with tfds.testing.mock_data(num_examples=6):
    rows = glue.read_tfds(spec, spec.dev[split][1], "")
    loaded = glue.load(spec, split, tokenization.load_tokenizer("wordpiece", vocab), 16)
  assert len(rows.text_a) == len(loaded) == 6
  assert rows.text_b is not None and len(rows.text_b) == 6
  if spec.labels:
    assert set(rows.labels) <= set(spec.labels)
  else:
    assert all(isinstance(x, float) for x in rows.labels)


@pytest.mark.parametrize("hosts", [1, 2, 4])
def test_eval_batches_hold_every_example_once(hosts):
  n, batch = 37, 8
  arrays = {"x": np.arange(n) * 10}
  seen = []
  per_host = [list(batches.eval_batches(arrays, batch, process_index=h, process_count=hosts))
              for h in range(hosts)]
  for step in range(batches.num_eval_batches(n, batch)):
    rows = np.concatenate([per_host[h][step]["x"] for h in range(hosts)])
    weights = np.concatenate([per_host[h][step]["weights"] for h in range(hosts)])
    seen.extend(rows[weights > 0])
    assert len(rows) == batch
  assert sorted(seen) == list(arrays["x"])


def test_batches_refuse_a_process_past_the_count_or_an_uneven_batch():
  arrays = {"x": np.arange(10)}
  with pytest.raises(ValueError, match=r"process_index 2 is not in \[0, 2\)"):
    next(batches.eval_batches(arrays, 4, process_index=2, process_count=2))
  with pytest.raises(ValueError, match="global batch size 5 is not a positive multiple of "
                     "the 2 processes"):
    next(batches.train_batches(arrays, 5, seed=0, num_steps=1, process_index=0,
                               process_count=2))


def test_train_batches_cover_each_epoch_and_resume():
  arrays = {"x": np.arange(10)}
  full = list(batches.train_batches(arrays, 4, seed=3, num_steps=5, process_index=0,
                                    process_count=1))
  stream = np.concatenate([b["x"] for b in full])
  assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:20]) == list(range(10))
  resumed = list(batches.train_batches(arrays, 4, seed=3, start_step=3, num_steps=5,
                                       process_index=0, process_count=1))
  np.testing.assert_array_equal(np.concatenate([b["x"] for b in resumed]), stream[12:])
  two = [list(batches.train_batches(arrays, 4, seed=3, num_steps=5, process_index=h,
                                    process_count=2)) for h in range(2)]
  np.testing.assert_array_equal(
      np.concatenate([np.concatenate([two[0][s]["x"], two[1][s]["x"]]) for s in range(5)]),
      stream)


def test_metrics_by_their_definitions():
  labels = np.array([1, 0, 1, 1, 0, 0, 1, 0])
  logits = np.eye(2)[[1, 0, 0, 1, 1, 0, 1, 0]]
  m = metrics.classification(("accuracy", "f1", "matthews"), labels, logits)
  tp, tn, fp, fn = 3, 3, 1, 1
  assert m["accuracy"] == pytest.approx(6 / 8)
  assert m["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
  assert m["matthews"] == pytest.approx(
      (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
  scores = np.array([[0.1], [0.4], [0.2], [0.9]])
  r = metrics.regression(("pearson", "spearman"), np.array([0.0, 2.0, 1.0, 3.0]), scores)
  assert r["spearman"] == pytest.approx(1.0)
  assert r["pearson"] == pytest.approx(np.corrcoef([0, 2, 1, 3], [0.1, 0.4, 0.2, 0.9])[0, 1])
  ner = metrics.span_f1([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "O"]])
  assert ner["precision"] == 1.0 and ner["recall"] == 0.5
  assert ner["f1"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("task", ["stsb", "rte", "sst2"])
def test_a_row_without_its_label_column_names_file_and_line(task, vocab, tmp_path):
  header, row = TSV_ROWS[task]
  path = str(tmp_path / "train.tsv")
  _write(path, [header, row, row.rsplit("\t", 1)[0]])  # Line 3 lacks its label.
  # Not read with a text as its label: refused for the missing column.
  with pytest.raises(ValueError, match=re.escape(f"{path}:3: ") + r"\d+ columns, .*label"):
    glue.load(glue.TASKS[task], "train", tokenization.load_tokenizer("wordpiece", vocab),
              16, str(tmp_path))
