"""Tests of the demo data (bertjax/create/demo.py)."""

import glob
import os

import numpy as np
import pytest

from bertjax.create import demo
from bertjax.create import tasks
from bertjax.records import schema
import data_utils


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("demo") / "demo_data")
  return demo.ensure_demo_data(data_dir, log=lambda *a: None)


def _documents(path):
  with open(path, encoding="utf-8") as f:
    return [tuple(d.split("\n")) for d in f.read().strip().split("\n\n")]


@pytest.mark.slow
def test_paths_and_layout(built):
  assert set(built) == {"data_dir", "vocab", "train_text", "eval_text", "train",
                        "eval"}
  assert sorted(built["train"]) == sorted(built["eval"]) == [128, 512]
  for split in ("train", "eval"):
    for length, pattern in built[split].items():
      assert pattern == os.path.join(built["data_dir"], f"{split}_{length}",
                                     "part-*.tfrecord")
      files = sorted(glob.glob(pattern))
      md = schema.read_metadata(os.path.dirname(pattern))
      assert md.max_seq_length == length
      assert md.max_predictions_per_seq == demo.PHASES[length]
      assert [os.path.basename(f) for f in files] == [f["name"] for f in md.files]
      assert sum(data_utils.check_index(f) for f in files) == md.num_instances
  train_128 = schema.read_metadata(os.path.dirname(built["train"][128]))
  assert train_128.num_instances >= 3000
  assert schema.read_metadata(os.path.dirname(built["eval"][128])).num_instances >= 200
  assert schema.read_metadata(os.path.dirname(built["eval"][512])).num_instances >= 100


def test_train_and_eval_documents_are_disjoint_real_text(built):
  train, held_out = _documents(built["train_text"]), _documents(built["eval_text"])
  assert len(train) >= 100 and len(held_out) >= 10
  assert 0.05 <= len(held_out) / (len(train) + len(held_out)) <= 0.15
  assert not set(train) & set(held_out)
  long_train = {s for d in train for s in d if len(s.split()) >= 5}
  assert not long_train & {s for d in held_out for s in d}
  sentences = [s for d in train for s in d]
  assert all(len(d) >= 2 for d in train + held_out)
  # Real sentences: mostly words, ending like sentences, no code samples.
  ends = sum(s.rstrip()[-1:] in ".:?!)\"" for s in sentences) / len(sentences)
  assert ends > 0.8
  assert not any(">>>" in s or "::=" in s for s in sentences)


def test_vocab_and_tokens_are_sensible(built):
  with open(built["vocab"], encoding="utf-8") as f:
    tokens = [line.rstrip("\n") for line in f]
  assert 3000 <= len(tokens) <= 8000
  assert set(schema.SPECIAL_TOKENS) <= set(tokens)
  md = schema.read_metadata(os.path.dirname(built["train"][128]))
  assert md.vocab_size == len(tokens) and md.vocab_hash == schema.vocab_hash(tokens)
  unk = md.special_ids["unk"]
  path = sorted(glob.glob(built["train"][128]))[0]
  ids = []
  nsp = []
  for data in list(data_utils.iter_records(path))[:500]:
    ex = data_utils.decode_example(data)
    n = int(ex["input_mask"].sum())
    ids.extend(ex["input_ids"][:n].tolist())
    nsp.append(int(ex["next_sentence_labels"][0]))
  assert np.mean(np.asarray(ids) == unk) < 0.01
  assert 0.35 < np.mean(nsp) < 0.7


def test_idempotent(built):
  data_dir = built["data_dir"]
  stamp = {p: os.stat(p).st_mtime_ns
           for p in glob.glob(os.path.join(data_dir, "**", "*"), recursive=True)}
  assert demo.ensure_demo_data(data_dir, log=lambda *a: None) == built
  for p, t in stamp.items():
    assert os.stat(p).st_mtime_ns == t, p


def test_resumes_after_an_interruption(built, tmp_path, monkeypatch):
  real_reduce = tasks.reduce_task

  def interrupted(shard_index, output_dir, *args):
    if output_dir.endswith("train_512") and shard_index == 2:
      raise KeyboardInterrupt
    return real_reduce(shard_index, output_dir, *args)

  # The same text and vocab (vocab training need not be deterministic); the
  # records are then a function of them and the settings.
  data_dir = str(tmp_path / "demo_data")
  os.makedirs(os.path.join(data_dir, "text"))
  for key in ("vocab", "train_text", "eval_text"):
    with open(built[key], "rb") as f:
      data = f.read()
    with open(built[key].replace(built["data_dir"], data_dir), "wb") as f:
      f.write(data)
  monkeypatch.setattr(tasks, "reduce_task", interrupted)
  with pytest.raises(KeyboardInterrupt):
    demo.ensure_demo_data(data_dir, log=lambda *a: None)
  assert schema.read_metadata(os.path.join(data_dir, "train_512")) is None
  monkeypatch.setattr(tasks, "reduce_task", real_reduce)
  paths = demo.ensure_demo_data(data_dir, log=lambda *a: None)
  for split in ("train", "eval"):
    for length in (128, 512):
      mine = os.path.dirname(paths[split][length])
      ref = os.path.dirname(built[split][length])
      assert sorted(os.listdir(mine)) == sorted(os.listdir(ref))
      for name in os.listdir(ref):
        if name.endswith((".tfrecord", ".index")):
          with open(os.path.join(mine, name), "rb") as a, open(
              os.path.join(ref, name), "rb") as b:
            assert a.read() == b.read(), name
