"""Tests of corpus reading (corpus.py), TFDS ingestion and vocab building."""

import collections
import gzip
import os
import random
import subprocess
import sys

import pytest

from bertjax.create import creation
from bertjax.create import documents
from bertjax.records import schema
from bertjax.text import corpus
from bertjax.text import tokenization
from bertjax.text import vocab as vocab_lib

_WORDS = ("the of and to in is was for on that with as by at from his her "
          "city river house garden music school market winter summer train "
          "station church village museum bridge forest valley mountain "
          "café naïve über façade résumé").split()


def _sentence(rng):
  words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
  return " ".join(words).capitalize() + rng.choice([".", ".", "!", "?"])


def _sentences_file(path, rng, num_docs=30, opener=open):
  with opener(path, "wb") as f:
    for _ in range(num_docs):
      for _ in range(rng.randint(2, 12)):
        f.write(_sentence(rng).encode("utf-8") + b"\n")
      f.write(b"\n")
    f.write(b"A line with invalid \xff\xfe bytes is repaired.\n")
  return path


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  root = tmp_path_factory.mktemp("vocab")
  text = _sentences_file(str(root / "text.txt"), random.Random(1), 200)
  path = str(root / "vocab.txt")
  vocab_lib.build_wordpiece_vocab([text], path, vocab_size=400)
  return path


def test_split_sentences_on_real_text():
  text = ("Mr. Smith went to Washington. He arrived at 3 p.m. on Friday! "
          "Did he stay? Yes, for two days (until Sunday). The U.S. economy "
          "grew 2.5% in 2019, e.g. in exports.")
  assert corpus.split_sentences(text) == [
      "Mr. Smith went to Washington.", "He arrived at 3 p.m. on Friday!",
      "Did he stay?", "Yes, for two days (until Sunday).",
      "The U.S. economy grew 2.5% in 2019, e.g. in exports."]
  assert corpus.split_sentences('Dr. Jones said: "It works." Then she '
                                "left.\nA line break ends one") == [
                                    'Dr. Jones said: "It works."',
                                    "Then she left.", "A line break ends one"]
  assert corpus.split_sentences(" \n\t ") == []
  assert corpus.split_sentences("NUL\x00inside. Kept.") == ["NUL inside.",
                                                            "Kept."]


def _docs(shards):
  report = collections.Counter()
  docs = [d for s in shards for d, _ in documents.iter_documents(s, report)]
  return docs, report


def test_gzip_input_reads_and_creates_the_same_as_plain(tmp_path, vocab_file):
  plain_dir, gz_dir = tmp_path / "plain", tmp_path / "gz"
  plain_dir.mkdir()
  gz_dir.mkdir()
  for i in range(2):
    _sentences_file(str(plain_dir / f"p{i}.txt"), random.Random(i))
    _sentences_file(str(gz_dir / f"p{i}.txt.gz"), random.Random(i),
                    opener=gzip.open)
  plain = documents.list_input_shards(str(plain_dir / "*.txt"))
  packed = documents.list_input_shards(str(gz_dir / "*.gz"))
  assert [s.size_bytes for s in packed] == [
      os.path.getsize(p) for p in sorted(gz_dir.glob("*.gz"))]
  assert sum(s.size_bytes for s in packed) < sum(s.size_bytes for s in plain)
  docs, report = _docs(packed)
  assert (docs, report) == _docs(plain)
  assert len(docs) == 2 * 31 and report["invalid_utf8_lines_repaired"] == 2
  # Progress is counted in stored (compressed) bytes.
  last = list(documents.iter_documents(packed[0], report))[-1][1]
  assert last == packed[0].size_bytes

  spec = creation.TokenizerSpec("wordpiece", vocab_file)
  config = creation.CreationConfig(max_seq_length=48, max_predictions_per_seq=8,
                                   dupe_factor=2, num_output_shards=2)
  out = {}
  for name, shards in (("plain", plain), ("gz", packed)):
    out[name] = str(tmp_path / f"out_{name}")
    creation.create_pretraining_data(shards, spec, config, out[name],
                                     num_workers=1, show_progress=False,
                                     log=lambda *a: None)
  md = schema.read_metadata(out["gz"])
  assert md.num_instances > 50
  for f in md.files:
    with open(os.path.join(out["gz"], f["name"]), "rb") as a, open(
        os.path.join(out["plain"], f["name"]), "rb") as b:
      assert a.read() == b.read()

  bad = tmp_path / "bad.txt.gz"
  bad.write_bytes(gzip.compress(b"One sentence.\n" * 100)[:-30])
  with pytest.raises(ValueError, match=r"bad\.txt\.gz: not a valid gzip"):
    _docs(documents.list_input_shards(str(bad)))


def test_remote_paths_go_through_gfile(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  root = "ram://bertjax_corpus_test"
  tf.io.gfile.makedirs(root + "/docs")
  text = b"First sentence.\nSecond sentence.\n\nOther document.\nEnd.\n"
  with tf.io.gfile.GFile(root + "/a.txt", "wb") as f:
    f.write(text)
  with tf.io.gfile.GFile(root + "/b.txt.gz", "wb") as f:
    f.write(gzip.compress(text))
  for i in range(3):
    with tf.io.gfile.GFile(f"{root}/docs/d{i}.txt", "wb") as f:
      f.write(b"A whole document. It has two sentences.\n")
  shards = documents.list_input_shards(f"{root}/*.txt,{root}/*.gz")
  assert [s.paths[0] for s in shards] == [root + "/a.txt", root + "/b.txt.gz"]
  assert shards[0].size_bytes == len(text)
  docs, _ = _docs(shards)
  assert docs == [["First sentence.", "Second sentence."],
                  ["Other document.", "End."]] * 2
  docs, _ = _docs(documents.list_input_shards(root + "/docs", "directory"))
  assert docs == [["A whole document.", "It has two sentences."]] * 3
  with pytest.raises(ValueError, match="matches no files"):
    documents.list_input_shards(root + "/nothing*.txt")


def test_tfds_ingestion_offline(tmp_path, vocab_file):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  rng = random.Random(5)
  texts = [" ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))
           + "\n" + _sentence(rng) for _ in range(24)]
  texts[3] = "  \n "  # An empty document.

  def as_dataset(self, split, *args, **kwargs):
    del self, args, kwargs
    # Honour even splits (a string would have to be a valid split spec).
    if isinstance(split, str):
      tfds.core.ReadInstruction.from_spec(split)
      part = texts
    else:
      n = len(texts)
      part = texts[split.index * n // split.count:
                   (split.index + 1) * n // split.count]
    return tf.data.Dataset.from_tensor_slices({"text": part})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    shards = documents.list_input_shards("", "tfds", tfds_name="lm1b",
                                        tfds_split="train", num_tfds_shards=3)
    assert len(shards) == 3
    docs, report = _docs(shards)
    assert len(docs) == 23 and report["empty_documents_skipped"] == 1
    assert [" ".join(d) for d in docs] == [
        " ".join(t.split()) for t in texts if t.strip()]
    assert sum(len(d) for d in docs) > 23 * 2  # Split into sentences.
    with pytest.raises(ValueError, match="--tfds_feature=body"):
      _docs(documents.list_input_shards("", "tfds", tfds_name="lm1b",
                                       tfds_feature="body",
                                       num_tfds_shards=1))
    config = creation.CreationConfig(max_seq_length=32,
                                     max_predictions_per_seq=5,
                                     dupe_factor=2, num_output_shards=2)
    md = creation.create_pretraining_data(
        shards, creation.TokenizerSpec("wordpiece", vocab_file), config,
        str(tmp_path / "out"), num_workers=1, show_progress=False,
        source=documents.describe_source("tfds", tfds_name="lm1b",
                                        tfds_split="train"),
        log=lambda *a: None)
  assert md.source == "tfds:lm1b/train"
  assert md.report["documents"] == 23 and md.num_instances > 40


def test_wordpiece_vocab_builder(tmp_path, vocab_file):
  tokens = vocab_lib.build_wordpiece_vocab(
      [_sentences_file(str(tmp_path / "t.txt"), random.Random(2), 100)],
      str(tmp_path / "v.txt"), vocab_size=300, num_unused=3)
  with open(tmp_path / "v.txt", encoding="utf-8") as f:
    assert f.read().split("\n")[:-1] == tokens
  assert tokens[:8] == list(schema.SPECIAL_TOKENS) + [
      "[unused0]", "[unused1]", "[unused2]"]
  assert len(tokens) == len(set(tokens)) <= 300
  chars = {t[-1] for t in tokens if len(t.lstrip("#")) == 1}
  assert all(c in tokens and "##" + c in tokens for c in chars)
  assert "é" not in chars and "e" in chars  # Uncased: accents stripped.
  assert any(t.startswith("##") and len(t) > 3 for t in tokens)

  # The module fixture's vocab covers its corpus with few [UNK]s.
  tok = tokenization.load_tokenizer("wordpiece", vocab_file)
  rng = random.Random(9)
  ids = [i for x in tok.encode_batch([_sentence(rng) for _ in range(300)])
         for i in x]
  assert len(ids) > 2000
  assert ids.count(tok.special_ids["unk"]) / len(ids) < 0.01
  # A word of known characters never becomes [UNK].
  assert tok.special_ids["unk"] not in tok.encode("rivermusicgardenhouse")

  with pytest.raises(ValueError, match="--vocab_size=5: must exceed"):
    vocab_lib.build_wordpiece_vocab([vocab_file], str(tmp_path / "x.txt"),
                                    vocab_size=5)
  with pytest.raises(ValueError, match="--input_file: .*nope.txt does not"):
    vocab_lib.build_wordpiece_vocab([str(tmp_path / "nope.txt")],
                                    str(tmp_path / "x.txt"))


def test_vocab_command_line(tmp_path):
  text = _sentences_file(str(tmp_path / "t.txt.gz"), random.Random(3), 200,
                         opener=gzip.open)
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  base = [sys.executable, "-m", "bertjax.text.vocab", f"--input_file={text}"]
  done = subprocess.run(base + [f"--output={tmp_path / 'vocab.txt'}",
                                "--vocab_size=250"],
                        capture_output=True, text=True, env=env, check=False)
  assert done.returncode == 0, done.stderr
  tok = tokenization.load_tokenizer("wordpiece", str(tmp_path / "vocab.txt"))
  assert 100 < tok.vocab_size <= 250
  done = subprocess.run(base + [f"--output={tmp_path / 'sp.model'}",
                                "--vocab_size=150", "--tokenizer=sentencepiece",
                                "--model_type=bpe"],
                        capture_output=True, text=True, env=env, check=False)
  assert done.returncode == 0, done.stderr
  sp = tokenization.load_tokenizer("sentencepiece", str(tmp_path / "sp.model"))
  assert sp.vocab_size == 150 and sp.tokens[:5] == schema.SPECIAL_TOKENS
  assert os.path.exists(tmp_path / "sp.vocab")
  bad = subprocess.run(base[:-1] + [f"--input_file={tmp_path}/none*.txt",
                                    f"--output={tmp_path / 'v2.txt'}"],
                       capture_output=True, text=True, env=env, check=False)
  assert bad.returncode != 0 and "--input_file" in bad.stderr
