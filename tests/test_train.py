"""train_and_evaluate end to end on a tiny model and synthetic data.

Two phases (length 16, then 32) of 4 steps each. Runs go through child
processes (this file, run as a script; see jax_child.py), which can take a
SIGTERM, be handed a NaN batch, be SIGKILLed while a checkpoint is being
written or run out of file space in a save, and report which data each phase
read; losses come from the TensorBoard events that the run writes. Config
errors: tests/test_train_config_errors.py.
"""

import glob
import hashlib
import json
import os
import signal
import struct
import sys
import time

import jax
import ml_collections
import numpy as np
import pytest

import jax_child
from bertjax.convert.weights import load_weights
from bertjax.train import checkpoint as ckpt_lib
from bertjax.train import loop
from bertjax.train import run_config
from bertjax.model.config import BertConfig
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib
from bertjax.train.logger import MetricLogger
from bertjax.train.preemption import PreemptionGuard
from bertjax.train.step_metrics import NonFiniteError, StepMetrics

sys.path.insert(0, os.path.join(jax_child.REPO, "configs"))
import base  # pylint: disable=g-import-not-at-top,wrong-import-position

TOTAL_STEPS = 8  # Phase seq16: steps 1-4; phase seq32: steps 5-8.


def tiny_config(overrides=None) -> ml_collections.ConfigDict:
  """configs/base.py shrunk; `overrides` maps dotted field names to values."""
  config = base.get_config()
  config.total_steps = TOTAL_STEPS
  config.model.update(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=32, dtype="float32")
  config.data.source = "synthetic"
  short, long = config.phases.seq128, config.phases.seq512
  short.update(fraction=0.5, max_seq_length=16, max_predictions_per_seq=3, global_batch_size=8)
  long.update(fraction=0.5, max_seq_length=32, max_predictions_per_seq=5, global_batch_size=8)
  config.phases = ml_collections.ConfigDict({"seq16": short, "seq32": long})
  config.optimizer.update(learning_rate=1e-3, warmup_steps=2)
  config.checkpoint.update(every_steps=3, keep=5)
  config.logging.update(every_steps=1, eval_every_steps=0)
  for name, value in (overrides or {}).items():
    *groups, field = name.split(".")
    node = config
    for g in groups:
      node = node[g]
    node[field] = value
  return config


def _child(payload: dict) -> dict:
  """One train_and_evaluate run; reports what the test checks."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.INFO)  # The test reads the run's INFO lines.
  workdir = payload["workdir"]

  if payload.get("export_hf"):
    from bertjax.convert import hf_files  # pylint: disable=g-import-not-at-top
    from bertjax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
    src, out = payload["export_hf"]
    params = ocp.StandardCheckpointer().restore(os.path.join(src, "params"))
    model_config = BertConfig.from_mapping(tiny_config().model)
    hf_files.save_hf_checkpoint(jax.device_get(params), model_config, out)

  # Which phase read from which data step, at which length, and how many
  # batches (prefetched ones too) each phase's source gave; optional NaNs
  # in the batches of the steps listed in nan_at; optional counters of the
  # batches read.
  sources, batches_read = [], {}
  make_source = loop._train_source  # pylint: disable=protected-access

  def recording_source(config, phase, model_config):
    source = make_source(config, phase, model_config)
    iterate = source.iterate
    read = [0]
    if payload.get("source_stats"):  # Counters, as a TFRecord source keeps them.
      source.stats = lambda: {"batches_read": read[0]}

    def recorded(start):
      sources.append(dict(phase=phase.name, start=start))
      for i, batch in enumerate(iterate(start)):
        read[0] += 1
        batches_read[phase.name] = i + 1
        sources[-1].setdefault("length", int(batch["input_ids"].shape[1]))
        if phase.start + start + i + 1 in payload.get("nan_at", []):
          batch = dict(batch, masked_lm_weights=np.full_like(batch["masked_lm_weights"],
                                                             np.nan))
        yield batch
    source.iterate = recorded
    return source
  loop._train_source = recording_source  # pylint: disable=protected-access

  if payload.get("sigterm_at"):
    # The platform's preemption notice: a real SIGTERM after that step.
    log_train = loop.MetricLogger.log_train

    def log_then_signal(self, step, *args, **kwargs):
      out = log_train(self, step, *args, **kwargs)
      if step == payload["sigterm_at"]:
        signal.raise_signal(signal.SIGTERM)
      return out
    loop.MetricLogger.log_train = log_then_signal

  if payload.get("sigkill_in_save") or payload.get("file_limit_in_save"):
    _hook_saves(payload.get("sigkill_in_save"), payload.get("file_limit_in_save"))

  result = {"error": None, "summary": None}
  try:
    result["summary"] = loop.train_and_evaluate(tiny_config(payload.get("config")), workdir,
                                                weights_loader=load_weights)
  except (NonFiniteError, ckpt_lib.CheckpointSaveError, run_config.ConfigError) as e:
    result["error"] = f"{type(e).__name__}: {e}"
  result["sources"], result["batches_read"] = sources, batches_read

  # Every checkpoint left in the workdir: its meta, and its parameters'
  # digest (equal digests: bitwise equal parameters) and finiteness.
  checkpoints = {}
  for step_dir in sorted(glob.glob(os.path.join(workdir, "checkpoints", "*[0-9]"))):
    params = jax.device_get(ocp.StandardCheckpointer().restore(
        os.path.join(step_dir, "params")))
    leaves = [np.asarray(x) for x in jax.tree.leaves(params)]
    with open(os.path.join(step_dir, "meta", "metadata")) as f:
      meta = json.load(f)
    checkpoints[os.path.basename(step_dir)] = dict(
        phase=meta["phase"], data_step=meta["data_step"],
        finite=all(bool(np.isfinite(x).all()) for x in leaves),
        digest=hashlib.sha256(b"".join(x.tobytes() for x in leaves)).hexdigest())
  result["checkpoints"] = checkpoints
  return result


def _hook_saves(sigkill_step, file_limit):
  """Faults in the checkpoint save of one step, once it has started writing.

  sigkill_step: the process SIGKILLs itself while the (async) save of that
  step is under way. file_limit [step, bytes]: from the save of that step on,
  no file may grow past `bytes` (RLIMIT_FSIZE; writes past it fail with
  EFBIG, as they fail with ENOSPC on a full disk).
  """
  import resource  # pylint: disable=g-import-not-at-top
  save = ckpt_lib.Checkpointer.save

  def faulty_save(self, state, meta, **kwargs):
    step = int(jax.device_get(state.step))
    if file_limit and step == file_limit[0]:
      resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit[1], resource.RLIM_INFINITY))
    out = save(self, state, meta, **kwargs)
    if step == sigkill_step:
      assert glob.glob(os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp*"))
      os.kill(os.getpid(), signal.SIGKILL)
    return out
  ckpt_lib.Checkpointer.save = faulty_save


def run(tmp_path_factory, workdir, returncode=0, **payload):
  result, log = jax_child.run(os.path.abspath(__file__), dict(payload, workdir=str(workdir)),
                              cache=jax_child.cache_dir(tmp_path_factory),
                              returncode=returncode)
  return result, log


def losses(workdir, newest_only=False, tag="train/loss") -> dict[int, float]:
  """train/loss (or another scalar) by step from the run's TensorBoard event files."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  paths = sorted(glob.glob(os.path.join(str(workdir), "tensorboard", "events.*")),
                 key=os.path.getmtime)
  out = {}
  for path in paths[-1:] if newest_only else paths:
    with open(path, "rb") as f:
      data = f.read()
    i = 0
    while i < len(data):  # TFRecord framing: length, its CRC, data, data CRC.
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      for value in event.summary.value:
        if value.tag == tag:
          out[event.step] = value.simple_value
  return out


@pytest.mark.slow
def test_phase_switch_preemption_resume_and_rerun(tmp_path_factory):
  # Uninterrupted: both phases in one run, checkpoints every 3 steps, at the
  # phase boundary and at the end.
  ref_dir = tmp_path_factory.mktemp("reference")
  ref, _ = run(tmp_path_factory, ref_dir)
  assert ref["summary"]["step"] == TOTAL_STEPS
  assert sorted(ref["summary"]["phases"]) == ["seq16", "seq32"]
  assert ref["sources"] == [dict(phase="seq16", start=0, length=16),
                            dict(phase="seq32", start=0, length=32)]
  ref_losses = losses(ref_dir)
  assert sorted(ref_losses) == list(range(1, TOTAL_STEPS + 1))
  assert all(np.isfinite(list(ref_losses.values())))
  assert sorted(ref["checkpoints"], key=int) == ["3", "4", "6", "8"]
  assert (ref["checkpoints"]["4"]["phase"], ref["checkpoints"]["4"]["data_step"]) == ("seq32", 0)
  assert os.path.exists(os.path.join(ref_dir, "summary.json"))

  # SIGTERM after step 6 (phase two, and a periodic checkpoint step).
  workdir = tmp_path_factory.mktemp("preempted")
  first, _ = run(tmp_path_factory, workdir, sigterm_at=6)
  assert first["summary"] == {"preempted_at_step": 6}
  assert sorted(first["checkpoints"], key=int) == ["3", "4", "6"]
  assert (first["checkpoints"]["6"]["phase"], first["checkpoints"]["6"]["data_step"]) == (
      "seq32", 2)
  assert sorted(losses(workdir)) == [1, 2, 3, 4, 5, 6]

  # Resumed: phase one is not run again; phase two reads on from its third
  # batch, and the losses and final weights are those of the uninterrupted run.
  second, log = run(tmp_path_factory, workdir)
  assert "Resumed from the checkpoint at step 6 (phase seq32, data step 2)" in log
  assert second["sources"] == [dict(phase="seq32", start=2, length=32)]
  resumed = losses(workdir, newest_only=True)
  assert sorted(resumed) == [7, 8]
  all_losses = losses(workdir)
  np.testing.assert_allclose([all_losses[s] for s in range(1, TOTAL_STEPS + 1)],
                             [ref_losses[s] for s in range(1, TOTAL_STEPS + 1)], rtol=1e-5)
  assert second["checkpoints"]["8"]["digest"] == ref["checkpoints"]["8"]["digest"]
  assert second["summary"]["step"] == TOTAL_STEPS
  # Phase one's results come from the checkpoint.
  assert second["summary"]["phases"] == ref["summary"]["phases"]

  # A completed run is not trained again.
  events = lambda: sorted(glob.glob(os.path.join(str(workdir), "tensorboard", "events.*")))
  events_before = events()
  third, log = run(tmp_path_factory, workdir)
  assert "is complete (step 8 of 8); nothing to do" in log
  assert third["sources"] == []
  assert third["summary"] == second["summary"]
  assert events() == events_before


def test_init_from_checkpoint_or_hugging_face_directory_starts_at_step_zero(
    tmp_path_factory):
  # The weights: two steps of a run (the first step's learning rate is 0).
  source_dir = tmp_path_factory.mktemp("source")
  source, _ = run(tmp_path_factory, source_dir, sigterm_at=2)
  assert list(source["checkpoints"]) == ["2"]
  weights = source["checkpoints"]["2"]["digest"]
  hf_dir = str(tmp_path_factory.mktemp("hf_model"))
  starts = {
      "bertjax": (os.path.join(str(source_dir), "checkpoints"), {}),  # Its latest step.
      "hugging_face": (hf_dir, {"export_hf": [os.path.join(str(source_dir), "checkpoints",
                                                            "2"), hf_dir]}),
  }
  for name, (init_from, payload) in starts.items():
    workdir = tmp_path_factory.mktemp(f"init_from_{name}")
    # Another seed, so that a fresh initialisation would differ from the
    # weights. Stopped after one step, which at the warmup's learning rate
    # of 0 leaves the loaded weights exactly as they were.
    result, log = run(tmp_path_factory, workdir, sigterm_at=1,
                      config={"init_from": init_from, "seed": 1}, **payload)
    assert f"Started from the weights in {init_from} at step 0" in log, name
    assert result["summary"] == {"preempted_at_step": 1}, name
    assert result["sources"] == [dict(phase="seq16", start=0, length=16)], name
    assert list(result["checkpoints"]) == ["1"], name
    assert result["checkpoints"]["1"]["digest"] == weights, name


def test_step_metrics_are_read_back_together_and_count_nonfinite_steps_up_to_the_limit():
  buffer = StepMetrics(max_in_flight=1, on_nonfinite="Resume from DIR.",
                       max_nonfinite_in_a_row=3)
  ok = lambda loss: {"loss": jax.numpy.float32(loss), "finite": jax.numpy.bool_(True)}
  bad = {"loss": jax.numpy.float32(np.nan), "finite": jax.numpy.bool_(False)}
  buffer.add(1, ok(2.0))
  buffer.add(2, ok(1.5))
  assert [float(m["loss"]) for m in buffer.take_window()] == [2.0, 1.5]
  assert buffer.take_window() == []
  for step, m in [(3, bad), (4, bad), (5, ok(1.0)), (6, bad), (7, bad)]:
    buffer.add(step, m)
  assert len(buffer.take_window()) == 5
  assert buffer.counts() == {"skipped_steps": 4, "nonfinite_in_a_row": 2}
  buffer.add(8, bad)
  with pytest.raises(NonFiniteError, match=(
      r"in 3 steps in a row, 6-8 \(--config\.optimizer\.max_nonfinite_in_a_row=3\); their "
      r"updates were skipped, so the parameters are those of step 5\. Resume from DIR\.$")):
    buffer.drain()
  # Counts resumed from a checkpoint go on; 1 stops at the first non-finite step.
  buffer = StepMetrics(max_nonfinite_in_a_row=1, skipped=4, in_a_row=0)
  buffer.add(9, bad)
  with pytest.raises(NonFiniteError, match=r"gradient at step 9 \(--config\.optimizer\."
                                           r"max_nonfinite_in_a_row=1\); its update was "
                                           r"skipped, so the parameters are those of step 8\.$"):
    buffer.drain()
  assert buffer.counts() == {"skipped_steps": 5, "nonfinite_in_a_row": 1}
  # A state whose parameters are not finite is never saved.
  buffer = StepMetrics(max_nonfinite_in_a_row=10)
  buffer.add(1, dict(bad, param_norm=jax.numpy.float32(np.inf)))
  with pytest.raises(NonFiniteError, match=r"parameters at step 1 are not finite \(param_norm "
                                           r"inf\): not checkpointing them"):
    buffer.drain_for_save(1)


def test_the_step_that_makes_too_many_nonfinite_in_a_row_stops_when_it_finishes():
  # Not at the next drain (log line or checkpoint): `add` reads the finite
  # flag of each step it waits for, max_in_flight steps behind.
  buffer = StepMetrics(max_in_flight=1, max_nonfinite_in_a_row=2)
  ok = {"loss": jax.numpy.float32(1.0), "finite": jax.numpy.bool_(True)}
  bad = {"loss": jax.numpy.float32(np.nan), "finite": jax.numpy.bool_(False)}
  buffer.add(1, ok)
  buffer.add(2, bad)
  buffer.add(3, bad)  # Step 2 counted: 1 in a row.
  assert buffer.counts() == {"skipped_steps": 1, "nonfinite_in_a_row": 1}
  with pytest.raises(NonFiniteError, match=r"in 2 steps in a row, 2-3 "):
    buffer.add(4, ok)  # Step 3 finishes: 2 in a row.
  # Steps counted in `add` are not counted again when drained.
  buffer = StepMetrics(max_in_flight=1, max_nonfinite_in_a_row=5)
  for step, m in [(1, bad), (2, bad), (3, ok)]:
    buffer.add(step, m)
  assert buffer.counts() == {"skipped_steps": 2, "nonfinite_in_a_row": 2}
  assert len(buffer.take_window()) == 3
  assert buffer.counts() == {"skipped_steps": 2, "nonfinite_in_a_row": 0}


def test_a_nonfinite_step_keeps_the_parameters_and_optimizer_state():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  # SGD with momentum: its trace is optimizer state that a skipped step must keep.
  tx = optax.sgd(1e38, momentum=0.9)
  state = state_lib.TrainState(step=jnp.zeros([], jnp.int32), params=params,
                               opt_state=tx.init(params), apply_fn=None, tx=tx)
  before = jax.device_get((state.params, state.opt_state))
  cases = {"loss": (jnp.float32(np.nan), 1.0), "gradient": (jnp.float32(1.0), np.inf)}
  for name, (loss, g) in cases.items():
    grads = {"w": jnp.full(3, g, jnp.float32)}
    new_state, metrics = step_lib.apply_gradients(state, grads, {"loss": loss})
    assert not bool(metrics["finite"]), name
    assert int(new_state.step) == 1, name
    jax.tree.map(np.testing.assert_array_equal,
                 jax.device_get((new_state.params, new_state.opt_state)), before)
    np.testing.assert_allclose(metrics["param_norm"], np.sqrt(14.0), rtol=1e-6)
  # A finite step updates both.
  new_state, metrics = step_lib.apply_gradients(
      state, {"w": jnp.full(3, 1e-37, jnp.float32)}, {"loss": jnp.float32(1.0)})
  assert bool(metrics["finite"])
  np.testing.assert_allclose(new_state.params["w"], [-9.0, -12.0, -7.0], rtol=1e-5)
  assert any(not np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(jax.device_get(new_state.opt_state)), jax.tree.leaves(before[1])))
  # At a learning rate of 1e38 a gradient of 100 takes the parameters past
  # float32's range: the loss and gradient are finite, so the update is
  # applied, and param_norm shows what it did (StepMetrics stops the run).
  new_state, metrics = step_lib.apply_gradients(
      state, {"w": jnp.full(3, 100.0, jnp.float32)}, {"loss": jnp.float32(1.0)})
  assert bool(metrics["finite"]) and not np.isfinite(float(metrics["param_norm"]))
  buffer = StepMetrics(max_in_flight=1, max_nonfinite_in_a_row=5)
  buffer.add(1, metrics)
  with pytest.raises(NonFiniteError, match=r"the update of step 1 made the parameters "
                     r"non-finite .* from a finite loss and gradient"):
    buffer.drain()


def test_one_process_preemption_guard_takes_a_real_sigterm_and_restores_the_handler():
  before = signal.getsignal(signal.SIGTERM)
  with PreemptionGuard() as guard:
    assert not guard.reached(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.reached(2) and guard.reached(3)
  assert signal.getsignal(signal.SIGTERM) is before


def test_throughput_leaves_out_checkpoint_and_eval_time(tmp_path):
  model_config = BertConfig.from_mapping(tiny_config().model)
  phase = run_config.phases(tiny_config())[0]
  with MetricLogger(str(tmp_path), model_config, TOTAL_STEPS) as logger:
    logger.start_window(0)
    time.sleep(0.05)  # Training steps.
    with logger.clock.measure("checkpoint"):
      time.sleep(0.3)
    with logger.clock.measure("eval"):
      time.sleep(0.2)
    m = logger.log_train(2, phase, [{"loss": 1.0, "mlm_accuracy": 0.5, "nsp_accuracy": 0.5,
                                     "finite": True}] * 2, 1e-3)
  assert 0.02 < m["step_time"] < 0.15, m  # 2 steps in about 0.05 s, not 0.55 s.
  summary = logger.clock.summary()
  assert summary["checkpoint_seconds"] >= 0.3 and summary["eval_seconds"] >= 0.2
  assert summary["goodput"] == pytest.approx(
      summary["step_seconds"] / summary["wall_seconds"], rel=0.05)
  assert summary["goodput"] < 0.3


def forbid_building_state(monkeypatch):
  """Makes building a train state or jitting the step fail the test."""
  def compiles(*args, **kwargs):
    raise AssertionError("the run started building its state before the config was checked")
  monkeypatch.setattr(state_lib, "abstract_train_state", compiles)
  monkeypatch.setattr(state_lib, "create_train_state", compiles)
  monkeypatch.setattr(step_lib, "jit_train_step", compiles)


@pytest.mark.slow
def test_profile_steps_write_one_trace_and_mfu_and_hfu_are_logged_every_window(tmp_path):
  # Unscanned layers and no dropout (whose random bits are loops on CPU): XLA
  # counts the whole step.
  config = tiny_config({"logging.profile_steps": (2, 2), "logging.peak_tflops": 1.0,
                        "model.scan_layers": False, "model.hidden_dropout_rate": 0.0,
                        "model.attention_dropout_rate": 0.0, "checkpoint.every_steps": 100})
  workdir = str(tmp_path / "run")
  summary = loop.train_and_evaluate(config, workdir)
  traces = glob.glob(os.path.join(workdir, "tensorboard", "plugins", "profile", "*", "*.xplane.pb"))
  assert len(traces) == 1, traces
  # MFU from the analytic model FLOPs; HFU from XLA's count of the unscanned step,
  # which has everything the model count has and more (softmax, LayerNorm, the optimizer).
  mfu, hfu = (losses(workdir, tag=f"train/{name}") for name in ("mfu", "hfu"))
  assert sorted(mfu) == sorted(hfu) == list(range(1, TOTAL_STEPS + 1))
  assert all(0 < mfu[s] < hfu[s] < 1 for s in mfu), (mfu, hfu)
  assert summary["skipped_steps"] == 0 and summary["nonfinite_in_a_row"] == 0
  assert losses(workdir, tag="train/skipped_steps") == dict.fromkeys(mfu, 0.0)


def test_nll_and_hit_match_optax_cross_entropy_and_argmax():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from bertjax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(4, 7, 50)) * 5, jnp.float32)
  labels = jnp.asarray(rng.integers(0, 50, (4, 7)))
  labels = labels.at[0].set(jnp.argmax(logits[0], -1))  # A row of hits.
  nll, hit = step_lib.nll_and_hit(logits, labels)
  np.testing.assert_allclose(
      nll, optax.softmax_cross_entropy_with_integer_labels(logits, labels), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(hit, jnp.argmax(logits, -1) == labels)
  assert bool(hit[0].all())
  grad = jax.grad(lambda l: step_lib.nll_and_hit(l, labels)[0].sum())(logits)
  ref = jax.grad(lambda l: optax.softmax_cross_entropy_with_integer_labels(l, labels).sum())(
      logits)
  np.testing.assert_allclose(grad, ref, atol=1e-6)


if __name__ == "__main__":
  print(json.dumps(_child(json.loads(sys.argv[1]))))


def test_a_phase_trains_with_its_own_remat_policy(tmp_path, monkeypatch):
  """phases.<name>.remat_policy: the phase's model recomputes what it says, on
  the same parameters, and the run goes on across the switch."""
  from bertjax.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  config = tiny_config({"phases.seq32.remat_policy": "full"})
  plan = run_config.phases(config)
  model = run_config.validate(config)
  assert [p.model_config(model).remat_policy for p in plan] == ["none", "full"]
  seen = []
  original = trainer_lib.Trainer._use_model_of

  def record(self, phase):
    original(self, phase)
    seen.append((phase.name, self.state.apply_fn.__self__.config.remat_policy))
  monkeypatch.setattr(trainer_lib.Trainer, "_use_model_of", record)
  loop.train_and_evaluate(config, str(tmp_path))
  assert seen == [("seq16", "none"), ("seq32", "full")]
