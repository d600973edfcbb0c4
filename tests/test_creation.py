"""End-to-end tests of pretraining data creation (creation.py, Beam, CLI)."""

import collections
import dataclasses
import filecmp
import gc
import multiprocessing
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from bertjax.create import creation
from bertjax.create import documents
from bertjax.create import records
from bertjax.create import tasks
from bertjax.records import schema
import data_utils

WORDS = ("the a of to and in is it that for on with as was by this be are "
         "from or at an not have which one has but all their they can more "
         "when there been were so some time into only other its new would "
         "two what first after also about these may most any than where "
         "many then them well over such should must value object function "
         "class module return list string number python code statement "
         "expression name variable type error exception loop method").split()
PIECES = ["##s", "##ed", "##ing", "##ly", "##er"]


def _write_vocab(path):
  chars = sorted(set("".join(WORDS)) | set(".,"))
  tokens = (list(schema.SPECIAL_TOKENS) + WORDS + PIECES + chars
            + ["##" + c for c in sorted(set("".join(WORDS)))])
  tokens = list(dict.fromkeys(tokens))
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  return path


def _sentence(rng):
  words = [rng.choice(WORDS) + (rng.choice(["s", "ed", "ing"])
                                if rng.random() < 0.2 else "")
           for _ in range(rng.randint(3, 18))]
  return " ".join(words).capitalize() + "."


def _write_corpus(directory, seed=0, num_files=3, docs_per_file=40):
  """Sentences-format files plus the awkward cases of bad input."""
  rng = random.Random(seed)
  os.makedirs(directory, exist_ok=True)
  for f in range(num_files):
    with open(os.path.join(directory, f"part{f}.txt"), "wb") as out:
      for d in range(docs_per_file):
        num = 1 if d % 13 == 0 else rng.randint(2, 20)  # Some 1-sentence docs.
        for _ in range(num):
          out.write(_sentence(rng).encode() + b"\n")
        out.write(b"\n")
      if f == 0:
        out.write(b"An invalid \xff\xfe byte sequence is repaired here.\n")
        out.write(" ".join([_sentence(rng)] * 40).encode() + b"\n\n\n")
  open(os.path.join(directory, "empty.txt"), "wb").close()
  return os.path.join(directory, "*.txt")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("creation")
  pattern = _write_corpus(str(root / "corpus"))
  vocab = _write_vocab(str(root / "vocab.txt"))
  spec = creation.TokenizerSpec("wordpiece", vocab, True)
  config = creation.CreationConfig(max_seq_length=64, max_predictions_per_seq=10,
                                   dupe_factor=3, num_output_shards=3,
                                   docs_per_chunk=16)
  shards = documents.list_input_shards(pattern)
  out1 = str(root / "w1")
  md = creation.create_pretraining_data(shards, spec, config, out1,
                                        num_workers=1, source="test",
                                        show_progress=False)
  return dict(root=root, pattern=pattern, spec=spec, config=config,
              shards=shards, out1=out1, metadata=md)


def _same_files(dir_a, dir_b):
  names = sorted(os.listdir(dir_a))
  assert names == sorted(os.listdir(dir_b))
  for name in names:
    assert filecmp.cmp(os.path.join(dir_a, name), os.path.join(dir_b, name),
                       shallow=False), name
  return names


def test_output_layout_and_metadata(setup):
  md, out = setup["metadata"], setup["out1"]
  names = sorted(os.listdir(out))
  S = setup["config"].num_output_shards
  assert names == sorted(["metadata.json"] + [
      records.shard_name(s, S) + ext for s in range(S) for ext in ("", ".index")])
  assert schema.read_metadata(out) == md
  assert md.max_seq_length == 64 and md.max_predictions_per_seq == 10
  assert md.masking["dupe_factor"] == 3 and md.masking["premasked"]
  assert md.special_ids["pad"] == 0 and set(md.special_ids) == {
      "pad", "unk", "cls", "sep", "mask"}
  assert md.num_instances == sum(f["num_instances"] for f in md.files) > 300
  for f in md.files:
    path = os.path.join(out, f["name"])
    assert data_utils.check_index(path) == f["num_instances"]
  # Bad input is counted, not dropped silently.
  assert md.report["invalid_utf8_lines_repaired"] == 1
  assert md.report["empty_input_files"] == 1
  assert md.report["sentences_longer_than_max_seq_length_truncated"] >= 1
  assert md.report["documents"] == 3 * 40 + 1


def test_records_parse_with_the_schema_in_tf_data(setup):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  md, out = setup["metadata"], setup["out1"]
  L, P = md.max_seq_length, md.max_predictions_per_seq
  spec = {}
  for name, (dtype, _) in schema.FEATURES.items():
    spec[name] = tf.io.FixedLenFeature(
        [schema.feature_length(name, L, P)],
        tf.float32 if dtype == "float32" else tf.int64)
  files = sorted(os.path.join(out, f["name"]) for f in md.files)
  ds = tf.data.TFRecordDataset(files).map(
      lambda x: tf.io.parse_single_example(x, spec))
  ids_special = md.special_ids
  count = tokens = random_next = 0
  for ex in ds.as_numpy_iterator():
    count += 1
    ids, mask, seg = ex["input_ids"], ex["input_mask"], ex["segment_ids"]
    n = int(mask.sum())
    tokens += n
    assert list(mask) == [1] * n + [0] * (L - n)
    assert not ids[n:].any() and not seg[n:].any()
    assert ids[0] == ids_special["cls"] and ids[n - 1] == ids_special["sep"]
    num_a = int((seg[:n] == 0).sum()) - 2
    assert ids[num_a + 1] == ids_special["sep"]
    assert list(seg[:n]) == [0] * (num_a + 2) + [1] * (n - num_a - 2)
    k = int(ex["masked_lm_weights"].sum())
    assert k == min(P, max(1, round(n * 0.15)))
    pos = ex["masked_lm_positions"][:k]
    assert list(pos) == sorted(set(pos.tolist()))
    assert not set(pos.tolist()) & {0, num_a + 1, n - 1}
    assert not ex["masked_lm_positions"][k:].any()
    assert not ex["masked_lm_ids"][k:].any()
    assert list(ex["masked_lm_weights"]) == [1.0] * k + [0.0] * (P - k)
    assert ids_special["pad"] not in ex["masked_lm_ids"][:k]
    random_next += int(ex["next_sentence_labels"][0])
  assert count == md.num_instances
  assert tokens == md.num_tokens
  assert 0.35 < random_next / count < 0.75


def test_one_and_two_workers_give_identical_bytes(setup, tmp_path):
  out2 = str(tmp_path / "w2")
  creation.create_pretraining_data(setup["shards"], setup["spec"],
                                   setup["config"], out2, num_workers=2,
                                   source="test", show_progress=True)
  _same_files(setup["out1"], out2)


def test_one_worker_runs_in_process_with_one_tokenizer(setup, tmp_path,
                                                       monkeypatch):
  """One worker: the tasks run here with the tokenizer the run loaded, under
  tasks.GC_THRESHOLD, and the caller's thresholds come back afterwards."""
  loads, seen = [], []
  load = creation.TokenizerSpec.load
  monkeypatch.setattr(creation.TokenizerSpec, "load",
                      lambda self: loads.append(1) or load(self))
  map_task = tasks.map_task
  monkeypatch.setattr(tasks, "map_task", lambda *a: seen.append(
      gc.get_threshold()) or map_task(*a))
  before = (1234, 11, 12)
  old = gc.get_threshold()
  gc.set_threshold(*before)
  try:
    creation.create_pretraining_data(
        setup["shards"], setup["spec"], setup["config"], str(tmp_path / "w"),
        num_workers=1, source="test", show_progress=False)
    after = gc.get_threshold()
  finally:
    gc.set_threshold(*old)
  assert len(loads) == 1
  assert seen and set(seen) == {tasks.GC_THRESHOLD}
  assert after == before
  _same_files(setup["out1"], str(tmp_path / "w"))


@pytest.mark.parametrize("spill_bytes", [5000, 60000])
def test_small_spills_give_identical_bytes(setup, tmp_path, spill_bytes):
  """Many spill runs (of one or of several buffered batches), merged in small
  blocks, give the bytes of one run per task."""
  out = str(tmp_path / "small_spills")
  config = dataclasses.replace(setup["config"], spill_bytes=spill_bytes)
  creation.create_pretraining_data(setup["shards"], setup["spec"], config, out,
                                   num_workers=1, source="test", show_progress=False)
  _same_files(setup["out1"], out)
  runs = [n for n in os.listdir(out) if n.endswith(".bin")]
  assert not runs  # The spill runs are removed with _work/.


@dataclasses.dataclass(frozen=True)
class _DyingSpec(creation.TokenizerSpec):
  """Loads the tokenizer here, but kills the worker process that loads it."""

  def load(self):
    if multiprocessing.parent_process() is not None:
      os._exit(3)  # pylint: disable=protected-access
    return super().load()


def test_a_dying_worker_stops_the_run_with_an_error(setup, tmp_path):
  spec = _DyingSpec("wordpiece", setup["spec"].path, True)
  with pytest.raises(RuntimeError, match="worker process stopped unexpectedly "
                     "while creating instances"):
    creation.create_pretraining_data(setup["shards"], spec, setup["config"],
                                     str(tmp_path / "dead"), num_workers=2,
                                     show_progress=False, log=lambda *a: None)


def test_beam_direct_runner_equals_worker_output(setup, tmp_path):
  from bertjax.create import beam_pipeline  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "beam")
  beam_pipeline.run_beam(setup["shards"], setup["spec"], setup["config"], out,
                         runner="DirectRunner", source="test")
  # The shards are byte-identical, not only equal as sets of records.
  _same_files(setup["out1"], out)


def test_rerun_skips_finished_shards(setup, tmp_path, monkeypatch):
  out = str(tmp_path / "resume")
  real_reduce = tasks.reduce_task
  calls = collections.Counter()

  def failing_reduce(shard_index, *args):
    if shard_index == 1:
      raise RuntimeError("interrupted")
    calls["reduce"] += 1
    return real_reduce(shard_index, *args)

  monkeypatch.setattr(tasks, "reduce_task", failing_reduce)
  with pytest.raises(RuntimeError, match="interrupted"):
    creation.create_pretraining_data(setup["shards"], setup["spec"],
                                     setup["config"], out, num_workers=1,
                                     source="test", show_progress=False)
  assert os.path.exists(os.path.join(out, records.shard_name(0, 3)))
  assert not os.path.exists(os.path.join(out, records.shard_name(1, 3)))
  assert schema.read_metadata(out) is None

  real_map = tasks.map_task

  def counting_map(*args):
    calls["map"] += 1
    return real_map(*args)

  def counting_reduce(*args):
    calls["reduce2"] += 1
    return real_reduce(*args)

  monkeypatch.setattr(tasks, "map_task", counting_map)
  monkeypatch.setattr(tasks, "reduce_task", counting_reduce)
  first = os.stat(os.path.join(out, records.shard_name(0, 3))).st_mtime_ns
  creation.create_pretraining_data(setup["shards"], setup["spec"],
                                   setup["config"], out, num_workers=1,
                                   source="test", show_progress=False)
  assert calls["map"] == 0  # Every input shard had been mapped.
  assert calls["reduce2"] == 2  # Shards 1 and 2 only.
  assert os.stat(os.path.join(out, records.shard_name(0, 3))).st_mtime_ns == first
  _same_files(setup["out1"], out)
  # A complete directory is left alone; other settings are refused.
  creation.create_pretraining_data(setup["shards"], setup["spec"],
                                   setup["config"], out, num_workers=1,
                                   source="test", show_progress=False)
  assert calls["map"] == 0 and calls["reduce2"] == 2
  other = creation.CreationConfig(**{**setup["config"].__dict__,
                                     "random_seed": 7})
  with pytest.raises(ValueError, match="random_seed"):
    creation.create_pretraining_data(setup["shards"], setup["spec"], other,
                                     out, num_workers=1, source="test",
                                     show_progress=False)


def test_bad_settings_and_paths_name_the_flag(setup, tmp_path):
  bad = {"max_seq_length": 4, "max_predictions_per_seq": 0,
         "masked_lm_prob": 1.5, "short_seq_prob": -0.1, "dupe_factor": 0,
         "num_output_shards": 0, "docs_per_chunk": 1}
  for name, value in bad.items():
    config = creation.CreationConfig(**{name: value})
    with pytest.raises(ValueError, match=f"--{name}="):
      config.validate()
  with pytest.raises(ValueError, match="--input_file.*matches no files"):
    documents.list_input_shards(str(tmp_path / "nothing*.txt"))
  with pytest.raises(ValueError, match="--input_format=xml"):
    documents.list_input_shards(setup["pattern"], "xml")
  no_specials = tmp_path / "vocab.txt"
  no_specials.write_text("the\na\nof\n")
  with pytest.raises(ValueError, match=str(no_specials)):
    creation.TokenizerSpec("wordpiece", str(no_specials)).load()
  with pytest.raises(ValueError, match="not a directory"):
    documents.list_input_shards(str(tmp_path / "missing"), "directory")


def test_directory_and_documents_formats(setup, tmp_path):
  rng = random.Random(3)
  d = tmp_path / "docs"
  d.mkdir()
  for i in range(12):
    (d / f"doc{i:02d}.txt").write_text(
        " ".join(_sentence(rng) for _ in range(rng.randint(3, 12))) + "\n")
  config = creation.CreationConfig(max_seq_length=32, max_predictions_per_seq=5,
                                   dupe_factor=2, num_output_shards=2)
  md = creation.create_pretraining_data(
      documents.list_input_shards(str(d), "directory"), setup["spec"], config,
      str(tmp_path / "out_dir"), num_workers=1, show_progress=False)
  assert md.report["documents"] == 12 and md.num_instances > 20
  raw = tmp_path / "raw.txt"
  raw.write_text("\n\n".join(" ".join(_sentence(rng) for _ in range(6))
                             for _ in range(10)) + "\n")
  md = creation.create_pretraining_data(
      documents.list_input_shards(str(raw), "documents"), setup["spec"], config,
      str(tmp_path / "out_docs"), num_workers=1, show_progress=False)
  assert md.report["documents"] == 10
  assert md.report["sentences"] > 40  # Split into sentences, not paragraphs.


def _create_data_command(setup, out, dupe_factor=3, num_output_shards=3):
  return [sys.executable, "-m", "bertjax.create_data",
          f"--input_file={setup['pattern']}",
          f"--vocab_file={setup['spec'].path}", f"--output_dir={out}",
          "--max_seq_length=64", "--max_predictions_per_seq=10",
          f"--dupe_factor={dupe_factor}",
          f"--num_output_shards={num_output_shards}", "--docs_per_chunk=16",
          "--num_workers=1", "--no_progress"]


def _run(cmd):
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  return subprocess.run(cmd, capture_output=True, text=True, env=env,
                        check=False)


def test_cli(setup, tmp_path):
  out = str(tmp_path / "cli")
  cmd = _create_data_command(setup, out)
  done = _run(cmd)
  assert done.returncode == 0, done.stderr
  assert "Wrote" in done.stdout and "report:" in done.stdout
  md = schema.read_metadata(out)
  assert md.num_instances == setup["metadata"].num_instances
  # Same records as the library call with the same settings.
  for f in md.files:
    assert filecmp.cmp(os.path.join(out, f["name"]),
                       os.path.join(setup["out1"], f["name"]), shallow=False)
  bad = _run(cmd[:-2] + ["--masked_lm_prob=2", "--output_dir=" + out + "2"])
  assert bad.returncode != 0 and "--masked_lm_prob=2" in bad.stderr


def test_random_next_segments_come_from_the_whole_corpus(tmp_path):
  # 4 files of 300 documents: B from A's own file for 299 of the 1199 other
  # documents, 24.9%, as the original script gives (test_original_release);
  # drawn within one file's chunk it was over 90%.
  paths, vocab = data_utils.write_files_corpus(str(tmp_path / "c4"), 4, 300)
  config = creation.CreationConfig(max_seq_length=64, max_predictions_per_seq=8,
                                   dupe_factor=2, num_output_shards=2)
  spec = creation.TokenizerSpec("wordpiece", vocab, True)
  out = str(tmp_path / "out4")
  creation.create_pretraining_data(
      documents.list_input_shards(",".join(paths)), spec, config, out,
      num_workers=1, show_progress=False, log=lambda *a: None)
  share, random_next = data_utils.own_file_share(data_utils.parse_dataset(out), vocab, 4)
  assert abs(share - 299 / 1199) < 0.05, share
  assert 0.4 < random_next < 0.7  # Over half: one-sentence chunks.
  # One document per file: B never comes from A's own file (its document).
  paths, vocab = data_utils.write_files_corpus(str(tmp_path / "c1"), 8, 1)
  for p in paths:  # A long document per file: many instances.
    with open(p, encoding="utf-8") as f:
      text = f.read().strip()
    with open(p, "w", encoding="utf-8") as f:
      f.write("\n".join([text] * 40) + "\n")
  out = str(tmp_path / "out1")
  creation.create_pretraining_data(
      documents.list_input_shards(",".join(paths)),
      creation.TokenizerSpec("wordpiece", vocab, True), config, out,
      num_workers=1, show_progress=False, log=lambda *a: None)
  share, random_next = data_utils.own_file_share(data_utils.parse_dataset(out), vocab, 8)
  assert share == 0.0 and 0.3 < random_next < 0.7


def test_output_does_not_depend_on_how_large_files_are_split(setup, tmp_path):
  big = tmp_path / "big.txt"
  with open(big, "wb") as out:
    for name in sorted(os.listdir(setup["root"] / "corpus")):
      out.write((setup["root"] / "corpus" / name).read_bytes())
    # Runs of blank and whitespace-only lines between documents.
    out.write(b"\n  \n\t\nLast document.\nIts end.\n\n\n")
  size = os.path.getsize(big)
  whole = documents.list_input_shards(str(big))
  assert len(whole) == 1 and not whole[0].byte_range

  def located(shards):
    report = collections.Counter()
    docs = [d[:3] for s in shards
            for d in documents.iter_located_documents(s, report)]
    return docs, report

  want = located(whole)
  for split in (1, 7, 100, 1000, size // 3, size - 1):
    shards = documents.list_input_shards(str(big), split_bytes=split)
    assert len(shards) == -(-size // split)
    assert located(shards) == want, split
  outs = {}
  for name, split, workers in (("whole", 1 << 30, 1), ("split", 997, 2)):
    outs[name] = str(tmp_path / name)
    creation.create_pretraining_data(
        documents.list_input_shards(str(big), split_bytes=split),
        setup["spec"], setup["config"], outs[name], num_workers=workers,
        show_progress=False, log=lambda *a: None)
  _same_files(outs["whole"], outs["split"])


def test_rerun_with_another_tokenizer_or_casing_is_refused(setup, tmp_path):
  out = setup["out1"]
  cased = creation.TokenizerSpec("wordpiece", setup["spec"].path, False)
  with pytest.raises(ValueError, match=r"different tokenizer\.do_lower_case "
                     r"\(True, now False\)"):
    creation.create_pretraining_data(setup["shards"], cased, setup["config"],
                                     out, num_workers=1, source="test",
                                     show_progress=False)
  other = tmp_path / "vocab.txt"
  with open(setup["spec"].path, encoding="utf-8") as f:
    other.write_text(f.read() + "zebra\n")
  with pytest.raises(ValueError, match="different vocab_hash"):
    creation.create_pretraining_data(
        setup["shards"], creation.TokenizerSpec("wordpiece", str(other), True),
        setup["config"], out, num_workers=1, source="test",
        show_progress=False)


def test_whole_word_masking_end_to_end(setup, tmp_path):
  config = dataclasses.replace(setup["config"], whole_word_mask=True,
                               dupe_factor=2)
  out = str(tmp_path / "wwm")
  md = creation.create_pretraining_data(setup["shards"], setup["spec"], config,
                                        out, num_workers=2, show_progress=False,
                                        log=lambda *a: None)
  assert md.masking["whole_word_mask"] and md.num_instances > 200
  ex = data_utils.parse_dataset(out)
  ids = data_utils.unmasked_ids(ex)
  starts = np.asarray(setup["spec"].load().is_word_start, bool)
  sep = md.special_ids["sep"]
  groups_split = multi_piece = 0
  for row in range(len(ids)):
    k = int(ex["masked_lm_weights"][row].sum())
    masked = set(ex["masked_lm_positions"][row, :k].tolist())
    n = int(ex["input_mask"][row].sum())
    word = []  # Positions of the current word.
    for pos in range(1, n + 1):
      if pos < n and ids[row, pos] != sep and word and not starts[ids[row, pos]]:
        word.append(pos)
        continue
      if word:
        hit = masked & set(word)
        groups_split += bool(hit) and hit != set(word)
        multi_piece += len(word) > 1 and hit == set(word)
      word = [pos] if pos < n and ids[row, pos] != sep else []
  assert groups_split == 0
  assert multi_piece > 50  # Words of several pieces were masked, whole.


def test_cli_tokenizer_compat_reaches_the_metadata(setup, tmp_path):
  out = str(tmp_path / "hf")
  cmd = _create_data_command(setup, out, dupe_factor=1, num_output_shards=1)
  done = _run(cmd + ["--tokenizer_compat=hf"])
  assert done.returncode == 0, done.stderr
  assert schema.read_metadata(out).tokenizer["compat"] == "hf"
  again = _run(cmd + ["--tokenizer_compat=original"])
  assert again.returncode != 0
  assert "different tokenizer.compat ('hf', now 'original')" in again.stderr
