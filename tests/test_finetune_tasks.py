"""CoNLL-2003 (BIO text and TFDS) and SWAG data, and the losses of every kind of task."""

import os
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax.tasks import conll
from bertjax.tasks import step as step_lib
from bertjax.tasks import swag
from bertjax.tasks.split import LabelError
from bertjax.text import tokenization

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return tokenization.load_tokenizer(
      "wordpiece", finetune_data.write_vocab(str(tmp_path_factory.mktemp("v") / "vocab.txt")))


def _config(data_dir, max_seq_length=16):
  return ml_collections.ConfigDict({"data_dir": str(data_dir), "tfds_data_dir": "",
                                    "max_seq_length": max_seq_length})


CONLL = """-DOCSTART- -X- -X- O

word1 NNP B-NP B-PER
cats NNP I-NP I-PER
runs VBZ B-VP O
cat NN B-NP B-LOC
.  . O O

dog NN B-NP B-ORG
sits VBZ B-VP O
"""


def test_conll_labels_the_first_sub_token_only(tokenizer, tmp_path):
  (tmp_path / "valid.txt").write_text(CONLL)
  split = conll.load("dev", tokenizer, _config(tmp_path))
  assert len(split) == 2
  a = split.arrays
  tokens = tokenizer.convert_ids_to_tokens(a["input_ids"][0][a["input_mask"][0] > 0])
  assert tokens == ["[CLS]", "word1", "cat", "##s", "runs", "cat", ".", "[SEP]"]
  np.testing.assert_array_equal(a["label_weights"][0, :8], [0, 1, 1, 0, 1, 1, 1, 0])
  labelled = a["labels"][0][a["label_weights"][0] > 0]
  assert [conll.LABELS[i] for i in labelled] == ["B-PER", "I-PER", "O", "B-LOC", "O"]
  # Perfect logits score 1.0; missing cat's B-LOC loses one of the three entities.
  logits = np.eye(len(conll.LABELS))[a["labels"]] * a["label_weights"][..., None]
  assert split.score(logits)["f1"] == 1.0
  logits[0, 5] = np.eye(len(conll.LABELS))[0]
  assert split.score(logits)["recall"] == pytest.approx(2 / 3)


def test_conll_truncated_words_are_predicted_o_and_still_counted(tokenizer, tmp_path):
  (tmp_path / "valid.txt").write_text(CONLL)
  split = conll.load("dev", tokenizer, _config(tmp_path, max_seq_length=5))
  assert split.arrays["label_weights"][0].sum() == 2  # word1 and cats (2 pieces) fill it.
  logits = np.eye(len(conll.LABELS))[split.arrays["labels"]]
  assert split.score(logits)["recall"] == pytest.approx(2 / 3)  # cat's B-LOC is lost.


def test_conll_unknown_tag_names_file_and_line(tokenizer, tmp_path):
  (tmp_path / "train.txt").write_text(CONLL.replace("B-ORG", "B-ANIMAL"))
  with pytest.raises(LabelError, match=r"train.txt:9: label 'B-ANIMAL'"):
    conll.load("train", tokenizer, _config(tmp_path))


# Both CoNLL-2003 sources are written from these (word, tag) sentences; every tag occurs.
SENTENCES = [
    [("word1", "B-PER"), ("cats", "I-PER"), ("runs", "O"), ("cat", "B-LOC"), ("dog", "I-LOC")],
    [("dog", "B-ORG"), ("sits", "I-ORG"), ("word2", "B-MISC"), ("word3", "I-MISC"), (".", "O")],
]


def _write_bio(path, sentences):
  lines = ["-DOCSTART- -X- -X- O", ""]
  for sentence in sentences:
    lines += [f"{word} NN B-NP {tag}" for word, tag in sentence] + [""]
  path.write_text("\n".join(lines))


def _mock_tfds_conll2003(sentences):
  """tfds.testing.mock_data serving `sentences` as the conll2003 builder's examples,
  with `ner` as ids into the builder's own tag names."""
  tfds = pytest.importorskip("tensorflow_datasets")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def as_dataset(builder, *args, **kwargs):
    del args, kwargs
    names = builder.info.features["ner"].feature.names

    def examples():
      for sentence in sentences:
        zeros = [0] * len(sentence)
        yield {"tokens": [w for w, _ in sentence], "pos": zeros, "chunks": zeros,
               "ner": [names.index(t) for _, t in sentence]}
    signature = {k: tf.TensorSpec([None], tf.string if k == "tokens" else tf.int64)
                 for k in builder.info.features}
    return tf.data.Dataset.from_generator(examples, output_signature=signature)
  return tfds.testing.mock_data(as_dataset_fn=as_dataset)


@pytest.mark.parametrize("order", ["tfds", "reversed"])
def test_conll_from_tfds_equals_the_bio_file(order, tokenizer, tmp_path, monkeypatch):
  if order == "reversed":  # Ids follow the task's labels by name, not TFDS's order.
    monkeypatch.setattr(conll, "LABELS", conll.LABELS[::-1])
  _write_bio(tmp_path / "valid.txt", SENTENCES)
  from_file = conll.load("dev", tokenizer, _config(tmp_path))
  with _mock_tfds_conll2003(SENTENCES):
    from_tfds = conll.load("dev", tokenizer, _config(""))
  assert len(from_tfds) == len(from_file) == 2
  assert sorted(from_tfds.arrays) == sorted(from_file.arrays)
  for key, value in from_file.arrays.items():
    np.testing.assert_array_equal(from_tfds.arrays[key], value, err_msg=key)
  a = from_tfds.arrays
  for i, sentence in enumerate(SENTENCES):
    labelled = a["labels"][i][a["label_weights"][i] > 0]
    assert list(labelled) == [conll.LABELS.index(t) for _, t in sentence]
  logits = np.eye(len(conll.LABELS))[a["labels"]]
  logits[1, 3] = np.eye(len(conll.LABELS))[conll.LABELS.index("O")]  # Misses B-MISC.
  assert from_tfds.score(logits) == from_file.score(logits)
  assert from_tfds.score(logits)["recall"] == pytest.approx(3 / 4)


def test_conll_tfds_tag_outside_the_labels_names_it(tokenizer, monkeypatch):
  monkeypatch.setattr(conll, "LABELS", tuple(t for t in conll.LABELS if t != "I-MISC"))
  with _mock_tfds_conll2003(SENTENCES), pytest.raises(
      LabelError, match=r"tfds conll2003\[dev\] example 1 word 3: label 'I-MISC'"):
    conll.load("dev", tokenizer, _config(""))


SWAG = """,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label
0,v1,1,x,the cat runs,the dog,gold,sits,runs,word1,word2,1
1,v2,2,x,a dog sits,the cat,gold,runs,sits,word3,word4,{label}
"""


def test_swag_makes_four_pairs_per_example(tokenizer, tmp_path):
  (tmp_path / "val.csv").write_text(SWAG.format(label=3))
  split = swag.load("dev", tokenizer, _config(tmp_path))
  assert split.arrays["input_ids"].shape == (2, 4, 16)
  np.testing.assert_array_equal(split.arrays["labels"], [1, 3])
  ids = split.arrays["input_ids"][0, 2]
  tokens = tokenizer.convert_ids_to_tokens(ids[split.arrays["input_mask"][0, 2] > 0])
  assert tokens == ["[CLS]", "the", "cat", "runs", "[SEP]", "the", "dog", "word1", "[SEP]"]
  assert split.score(np.eye(4)[[1, 0]])["accuracy"] == 0.5


def test_swag_label_outside_the_choices_names_the_line(tokenizer, tmp_path):
  (tmp_path / "val.csv").write_text(SWAG.format(label=4))
  with pytest.raises(LabelError, match=r"val.csv:3: label '4'"):
    swag.load("dev", tokenizer, _config(tmp_path))


def test_losses_of_every_kind():
  w = jnp.array([1.0, 1.0, 0.0])  # The third row is padding.
  logits = jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.75], [0.9, 0.1]]))
  batch = {"weights": w, "labels": jnp.array([0, 1, 0])}
  loss, hits, weight = step_lib.loss_and_hits("classification", logits, batch)
  assert float(loss) == pytest.approx(-np.log(0.5) - np.log(0.75), rel=1e-6)
  assert float(hits) == 2.0 and float(weight) == 2.0
  reg = {"weights": w, "labels": jnp.array([1.0, 2.0, 9.0])}
  loss, _, _ = step_lib.loss_and_hits("regression", jnp.array([[1.5], [2.0], [0.0]]), reg)
  assert float(loss) == pytest.approx(0.25)
  token = {"weights": w, "labels": jnp.array([[0, 1], [1, 1], [0, 0]]),
           "label_weights": jnp.array([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])}
  token_logits = jnp.stack([logits] * 2, axis=1)
  loss, _, weight = step_lib.loss_and_hits("token", token_logits, token)
  assert float(weight) == 3.0
  assert float(loss) == pytest.approx(-np.log(0.5) - 2 * np.log(0.75), rel=1e-6)
  span = {"weights": w, "start_positions": jnp.array([0, 1, 0]),
          "end_positions": jnp.array([1, 1, 0])}
  loss, hits, _ = step_lib.loss_and_hits("span", (logits, logits), span)
  assert float(loss) == pytest.approx((-2 * np.log(0.5) - 2 * np.log(0.75)) / 2, rel=1e-6)
  assert float(hits) == 1.0


@pytest.mark.parametrize("task", ["swag", "conll2003"])
def test_token_and_multiple_choice_tasks_run_end_to_end(task, tmp_path):
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), "configs", "finetune"))
  import ner  # pylint: disable=g-import-not-at-top
  import swag as swag_config  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import loop  # pylint: disable=g-import-not-at-top
  data = tmp_path / "data"
  data.mkdir()
  if task == "swag":
    config = swag_config.get_config()
    for name in ("train.csv", "val.csv"):
      (data / name).write_text(SWAG.format(label=2))
  else:
    config = ner.get_config()
    for name in ("train.txt", "valid.txt"):
      (data / name).write_text(CONLL)
  config.data_dir = str(data)
  config.vocab_file = finetune_data.write_vocab(str(tmp_path / "vocab.txt"))
  config.model.update(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                      dtype="float32")
  config.max_seq_length, config.global_batch_size, config.eval_batch_size = 16, 2, 2
  config.num_epochs = 2.0
  results = loop.finetune_and_evaluate(config, str(tmp_path / "run"))
  dev = results["dev"]["dev"]
  assert results["steps"] == 2 and dev["num_examples"] == 2
  key = "accuracy" if task == "swag" else "f1"
  assert 0.0 <= dev[key] <= 1.0


def test_swag_without_data_dir_says_tfds_has_no_swag():
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import swag  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"data_dir": "", "max_seq_length": 16})
  with pytest.raises(FileNotFoundError, match="TFDS has no SWAG dataset"):
    swag.load("train", None, config)
