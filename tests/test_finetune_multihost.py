"""Fine-tuning's dev scores and prediction files on a mesh that interleaves the hosts.

A host's rows of a global batch sit where that host's devices sit in the
mesh, and a TPU mesh, laid out by the chips' physical positions, need not
put one host's chips together. Evaluation batches carry each row's example
id, the predict step returns the ids with its outputs, and the outputs are
put with their examples by id (batches.in_example_order).

The known-good twin: one process on 4 CPU devices fine-tunes SST-2 (a
token-presence task) and SQuAD v2.0 briefly and, from each run's last
checkpoint, scores dev (metrics, outputs, SQuAD's dev files) and writes the
test prediction files. Two processes of 2 CPU devices each (jax.distributed
on 127.0.0.1, gloo collectives) then do the same from those checkpoints on a
mesh whose data axis runs over [p0d0, p1d0, p0d1, p1d1], so each host's rows
of a batch lie apart; everything must equal the twin's. This file run as a
script is one process of either run.
"""

import collections
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from bertjax.tasks import batches

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(os.path.dirname(TESTS), "configs", "finetune"))
import finetune_data  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax_child  # pylint: disable=g-import-not-at-top,wrong-import-position
import squad_fixtures  # pylint: disable=g-import-not-at-top,wrong-import-position

TASKS = ("sst2", "squad")
TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
            max_position_embeddings=64, dtype="float32")


def _interleaved_rows(per_host: list[list[dict]], devices_per_host: int) -> list[dict]:
  """Each step's host batches as a mesh [h0d0, h1d0, h0d1, h1d1, ...] holds them:
  device d of every host in turn, each device a block of its host's rows in order."""
  out = []
  for step in zip(*per_host):
    blocks = [{k: np.array_split(v, devices_per_host)[d] for k, v in host.items()}
              for d in range(devices_per_host) for host in step]
    out.append({k: np.concatenate([b[k] for b in blocks]) for k in step[0]})
  return out


def test_eval_batches_carry_each_rows_example_id_and_minus_one_for_padding():
  arrays = {"x": np.arange(37) * 10, "input_mask": np.ones((37, 4), np.int32),
            "input_ids": np.ones((37, 4), np.int32)}
  for hosts in (1, 2):
    per_host = [list(batches.eval_batches(arrays, 8, process_index=h, process_count=hosts))
                for h in range(hosts)]
    for host in per_host:
      for b in host:
        ids = b[batches.EXAMPLE_ID_KEY]
        assert ids.dtype == np.int32
        np.testing.assert_array_equal(ids >= 0, b[batches.WEIGHT_KEY] > 0)
        np.testing.assert_array_equal(b["x"][ids >= 0], ids[ids >= 0] * 10)


def test_outputs_go_to_their_examples_by_id_wherever_the_mesh_puts_each_hosts_rows():
  n = 37
  lengths = np.random.default_rng(0).integers(1, 5, n)  # Bucketed: visited by length.
  arrays = {"x": np.arange(n, dtype=np.float32), "input_ids": np.ones((n, 4), np.int32),
            "input_mask": (np.arange(4) < lengths[:, None]).astype(np.int32)}
  per_host = [list(batches.eval_batches(arrays, 8, buckets=(2, 4), process_index=h,
                                        process_count=2)) for h in range(2)]
  global_batches = _interleaved_rows(per_host, devices_per_host=2)
  # What a predict step returns: outputs of every row (a pair, as span heads give), ids.
  outputs = [(b["x"] * 2, np.stack([b["x"], -b["x"]], -1)) for b in global_batches]
  ids = [b[batches.EXAMPLE_ID_KEY] for b in global_batches]
  doubled, pairs = batches.in_example_order(outputs, ids, n)
  np.testing.assert_array_equal(doubled, np.arange(n) * 2)
  np.testing.assert_array_equal(pairs, np.stack([np.arange(n), -np.arange(n)], -1))
  # By position, the interleaved rows would be out of order (and padding kept).
  positional = np.concatenate([o[0] for o in outputs])[:n]
  assert not np.array_equal(positional, np.arange(n) * 2)
  with pytest.raises(ValueError, match=r"37 examples came back with 36 real rows: "
                     r"examples \[\d+\] missing"):
    batches.in_example_order([o[0][:-1] if k == 0 else o[0] for k, o in enumerate(outputs)],
                             [i[:-1] if k == 0 else i for k, i in enumerate(ids)], n)


# The two runs.


def _write_data(root: str) -> dict:
  sst2 = finetune_data.write_sst2_token_presence(os.path.join(root, "SST-2"), num_dev=22)
  with open(os.path.join(sst2, "dev.tsv"), encoding="utf-8") as f:
    dev_texts = [(line.split("\t")[0], "") for line in f.readlines()[1:]]
  finetune_data.write_glue_test(root, "SST-2", dev_texts)  # Test: dev's sentences.
  squad = os.path.join(root, "squad")
  os.makedirs(squad)
  data = squad_fixtures.squad_v2()
  for split in ("train", "dev"):
    squad_fixtures.write_json(os.path.join(squad, f"{split}-v2.0.json"), data)
  return {"sst2": sst2, "vocab": finetune_data.write_vocab(os.path.join(root, "vocab.txt")),
          "squad": squad, "squad_vocab": squad_fixtures.write_vocab(squad, data),
          "squad_questions": os.path.join(squad, "dev-v2.0.json")}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_two_processes(payload: dict, cache: str, logs: str) -> list[dict]:
  """Each process's result; their logs go to files in `logs` (a full pipe would stop
  one process while the other waits for it in a collective)."""
  port = _free_port()
  env = dict(os.environ, **jax_child.child_env(2, cache))
  paths = [os.path.join(logs, f"process{i}.log") for i in range(2)]
  procs = []
  for i, path in enumerate(paths):
    with open(path, "w", encoding="utf-8") as log:
      procs.append(subprocess.Popen(
          [sys.executable, __file__, json.dumps(dict(
              payload, distributed={"coordinator": f"127.0.0.1:{port}", "num_processes": 2,
                                    "process_id": i}))],
          env=env, stdout=subprocess.PIPE, stderr=log, text=True))
  results = []
  try:
    for p, path in zip(procs, paths):
      out, _ = p.communicate(timeout=600)
      assert p.returncode == 0, _read(path)[-6000:]
      results.append(json.loads(out.strip().splitlines()[-1]))
  finally:
    for p in procs:
      p.kill()
  return results


def _read(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f) if path.endswith(".json") else f.read()


def _assert_same_scores(got: dict, want: dict):
  """{split: metrics} equal to float32 rounding."""
  assert sorted(got) == sorted(want)
  for split, metrics in want.items():
    assert got[split] == pytest.approx(metrics, rel=1e-5, abs=1e-6), split


@pytest.mark.slow
def test_interleaved_hosts_score_and_predict_as_one_process(tmp_path, tmp_path_factory):
  cache = jax_child.cache_dir(tmp_path_factory)
  data = _write_data(str(tmp_path / "data"))
  runs = str(tmp_path / "runs")
  twin_out, multi_out = str(tmp_path / "twin"), str(tmp_path / "interleaved")
  twin, _ = jax_child.run(__file__, {"data": data, "runs": runs, "out": twin_out,
                                     "train": True}, cache=cache, devices=4, timeout=600)
  multi = _run_two_processes({"data": data, "runs": runs, "out": multi_out, "train": False},
                             cache, str(tmp_path))
  for task in TASKS:
    assert twin[task]["mesh_processes"] == [0, 0, 0, 0]
    # Each host's devices alternate along the batch axis.
    assert all(m[task]["mesh_processes"] == [0, 1, 0, 1] for m in multi)
    # The twin's scores from its checkpoint are those its run reported.
    _assert_same_scores(twin[task]["dev"], twin[task]["run_dev"])
    for m in multi:
      _assert_same_scores(m[task]["dev"], twin[task]["dev"])
      assert m[task]["test"] == twin[task]["test"]
    one, two = (np.load(os.path.join(d, task, "dev_outputs.npz")) for d in (twin_out, multi_out))
    assert sorted(one.files) == sorted(two.files)
    for name in one.files:
      assert len(np.unique(one[name].reshape(len(one[name]), -1), axis=0)) > 1
      np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-5, err_msg=task)
  submission = _read(os.path.join(twin_out, "sst2", "test", "SST-2.tsv"))
  assert _read(os.path.join(multi_out, "sst2", "test", "SST-2.tsv")) == submission
  assert {"0", "1"} <= {line.split("\t")[-1] for line in submission.splitlines()[1:]}
  for where in ("dev", "test"):
    for name in ("predictions.json", "nbest_predictions.json", "null_odds.json"):
      a, b = (_read(os.path.join(d, "squad", where, name)) for d in (twin_out, multi_out))
      assert b == (pytest.approx(a) if name == "null_odds.json" else a), (where, name)
  # The files are not trivially alike: the questions' null odds differ.
  assert len(set(_read(os.path.join(twin_out, "squad", "dev", "null_odds.json")).values())) > 1


# One process of a run (this file as a script).


def _configs(data: dict) -> dict:
  import glue as glue_config  # pylint: disable=g-import-not-at-top
  import squad as squad_config  # pylint: disable=g-import-not-at-top

  def tiny(config, **changes):
    config.model.update(TINY)
    config.checkpoint.update(every_steps=1000, async_save=False)
    config.logging.every_steps = 100
    config.bucketing.min_length = 8  # Buckets 8, 16, 32 (, 48): several shapes.
    config.optimizer.learning_rate = 2e-3  # A tiny model takes a larger step.
    config.update(changes)
    return config
  return {
      "sst2": tiny(glue_config.get_config(), task="sst2", data_dir=data["sst2"],
                   vocab_file=data["vocab"], max_seq_length=16, global_batch_size=16,
                   eval_batch_size=8, num_epochs=5.0),  # 80 steps: it learns the task.
      "squad": tiny(squad_config.get_config(), version="2.0", data_dir=data["squad"],
                    vocab_file=data["squad_vocab"], max_seq_length=48, doc_stride=16,
                    max_query_length=12, global_batch_size=4, eval_batch_size=8,
                    num_epochs=1.0, predict_file=data["squad_questions"])}


def _interleave_hosts_in_meshes():
  """make_mesh over the devices taken one per process in turn: [p0d0, p1d0, p0d1, ...]."""
  import jax  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  make_mesh = sharding_lib.make_mesh

  def interleaved(mesh_config, devices=None, **kwargs):
    devices = list(jax.devices() if devices is None else devices)
    seen = collections.Counter()
    rank = {}
    for d in devices:
      rank[d] = (seen[d.process_index], d.process_index)
      seen[d.process_index] += 1
    return make_mesh(mesh_config, sorted(devices, key=rank.__getitem__), **kwargs)
  sharding_lib.make_mesh = interleaved


def _from_checkpoint(config, checkpoint: str, out: str) -> dict:
  """Dev metrics (and SQuAD's dev files in out/dev), the dev outputs (out/
  dev_outputs.npz) and the test prediction files (out/test) of `checkpoint`."""
  import jax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import loop, submissions, registry  # pylint: disable=g-import-not-at-top
  from bertjax.tasks import step as step_lib  # pylint: disable=g-import-not-at-top
  from bertjax.text import tokenization  # pylint: disable=g-import-not-at-top
  from bertjax.train import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  predict = ml_collections.ConfigDict(dict(
      config.to_dict(), mode="predict", predict_from=checkpoint,
      predict_dir=os.path.join(out, "test")))
  test = submissions.predict_test(predict, out)["test"]
  task = registry.get_task(config.task)
  mesh, rules = sharding_lib.make_mesh(config.mesh), sharding_lib.rules(config.mesh)
  state, shardings, _, _ = submissions.restore_for_prediction(
      task, checkpoint, config.max_seq_length, mesh, rules)
  tokenizer = tokenization.load_tokenizer("wordpiece", config.vocab_file, config.do_lower_case)
  dev = [task.load(name, tokenizer, config) for name in task.dev_splits]
  _, p_predict = step_lib.jit_steps(shardings, mesh, task.kind)
  sharding, buckets = sharding_lib.batch_sharding(mesh), batches.buckets_of(config)
  with sharding_lib.mesh_context(mesh, rules):
    metrics = loop.evaluate(p_predict, state, dev, config.eval_batch_size, sharding,
                            os.path.join(out, "dev"), buckets)
    outputs = loop.predict(p_predict, state, dev[0], config.eval_batch_size, sharding, buckets)
  if jax.process_index() == 0:
    np.savez(os.path.join(out, "dev_outputs.npz"), *jax.tree.leaves(outputs))
  return {"dev": metrics, "test": test,
          "mesh_processes": [d.process_index for d in mesh.devices.ravel()]}


def _worker(payload: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  if payload.get("distributed"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    where = payload["distributed"]
    jax.distributed.initialize(coordinator_address=where["coordinator"],
                               num_processes=where["num_processes"],
                               process_id=where["process_id"])
    _interleave_hosts_in_meshes()
  from bertjax.tasks import loop  # pylint: disable=g-import-not-at-top
  result = {}
  for task, config in _configs(payload["data"]).items():
    run = os.path.join(payload["runs"], task)
    out = os.path.join(payload["out"], task)
    os.makedirs(out, exist_ok=True)
    run_dev = loop.finetune_and_evaluate(config, run)["dev"] if payload["train"] else None
    result[task] = dict(_from_checkpoint(config, os.path.join(run, "checkpoints"), out),
                        run_dev=run_dev)
  return result


if __name__ == "__main__":
  print(json.dumps(_worker(json.loads(sys.argv[1]))))
