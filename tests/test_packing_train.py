"""Packing end to end: train_and_evaluate packed and unpacked on the same
examples gives the same run, and packing settings that cannot work are refused
before anything compiles."""

import os

from absl import app
import jax
import numpy as np
import pytest

from bertjax.benchmarks import step_bench
from bertjax.records import schema
from bertjax.train import flops
from bertjax.train import loop
from bertjax.train import run_config
from bertjax.train import step_setup
from test_packing_pipeline import P, dataset  # pylint: disable=unused-import
from test_train import forbid_building_state, losses, tiny_config

pytestmark = pytest.mark.slow

STEPS = 3


def config_on(directory, **overrides):
  config = tiny_config({"total_steps": STEPS, "data.source": "tfrecord",
                        "model.hidden_dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
                        "model.vocab_size": 200, "checkpoint.every_steps": 100,
                        "logging.eval_batches": 0, "data.packing_factor": 2.0, **overrides})
  config.phases = {"seq32": config.phases.seq32}
  config.phases.seq32.update(fraction=1.0, max_predictions_per_seq=P, global_batch_size=16,
                             train_files=os.path.join(directory, "part-*"),
                             eval_files=os.path.join(directory, "part-*"))
  return config


def test_packed_run_equals_the_unpacked_run(dataset, tmp_path):
  """Without dropout a packed step trains on the same examples with the same
  gradient: eval losses after 3 steps agree to 1e-4 (fp32)."""
  plain = loop.train_and_evaluate(config_on(dataset), str(tmp_path / "plain"))
  # One step per chunk: each packed step holds exactly its unpacked step's examples.
  packed = loop.train_and_evaluate(
      config_on(dataset, **{"data.packing": True, "data.packing_chunk_steps": 1}),
      str(tmp_path / "packed"))
  a, b = plain["phases"]["seq32"]["eval"], packed["phases"]["seq32"]["eval"]
  for k in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
    np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
  assert packed["data"]["packing_overflow"] == 0


def _fed_real_tokens(monkeypatch) -> list[int]:
  """The sum of input_mask of each host batch the training source hands out, in order."""
  fed, make_source = [], loop._train_source  # pylint: disable=protected-access

  def recording(config, phase, model_config):
    source = make_source(config, phase, model_config)
    iterate = source.iterate

    def recorded(start):
      for batch in iterate(start):
        fed.append(int(batch["input_mask"].sum()))
        yield batch
    source.iterate = recorded
    return source
  monkeypatch.setattr(loop, "_train_source", recording)
  return fed


def test_logged_real_tokens_are_the_fed_batches_input_mask(dataset, tmp_path, monkeypatch):
  """train/real_tokens is each step's sum of input_mask; in the same 8 rows of 32
  tokens, packed steps (16 examples, factor 2) hold more of them than unpacked
  steps (8 examples), while tokens_per_second counts the slots of 16 and 8 rows.
  MFU counts the FLOPs of the rows computed: 8 either way, packed ones with 3
  [CLS] and P + 3 masked-LM slots."""
  real, slots = {}, {}
  for name, overrides in (("plain", {}), ("packed", {"data.packing": True})):
    fed = _fed_real_tokens(monkeypatch)
    config = config_on(dataset, **{"logging.every_steps": 1, "logging.peak_tflops": 1.0,
                                   **overrides})
    config.phases.seq32.update(eval_files="",
                               global_batch_size=16 if overrides else 8)
    loop.train_and_evaluate(config, str(tmp_path / name))
    real[name] = losses(tmp_path / name, tag="train/real_tokens")
    tokens = losses(tmp_path / name, tag="train/tokens_per_second")
    step_time = losses(tmp_path / name, tag="train/step_time")
    slots[name] = {s: tokens[s] * step_time[s] for s in tokens}
    # The source reads ahead of the steps (prefetch): its first batches are theirs.
    assert real[name] == {s: float(fed[s - 1]) for s in range(1, STEPS + 1)}, name
    rate = losses(tmp_path / name, tag="train/real_tokens_per_second")
    # One step a window: the rate over the window is the step's tokens over its time.
    assert {s: rate[s] * step_time[s] for s in rate} == pytest.approx(real[name], rel=1e-5)
    model_flops = 8 * flops.train_flops_per_sequence(
        run_config.validate(config), 32, *((P + 3, 3) if overrides else (P, 1)))
    mfu = losses(tmp_path / name, tag="train/mfu")
    assert {s: mfu[s] * step_time[s] * 1e12 for s in mfu} == pytest.approx(
        dict.fromkeys(range(1, STEPS + 1), model_flops), rel=1e-5)
  assert all(real["packed"][s] > real["plain"][s] for s in range(1, STEPS + 1)), real
  assert all(real["packed"][s] <= 8 * 32 for s in real["packed"])
  for s in range(1, STEPS + 1):
    assert slots["plain"][s] == pytest.approx(8 * 32, rel=1e-4)
    assert slots["packed"][s] == pytest.approx(16 * 32, rel=1e-4)


@pytest.mark.parametrize("packed", [True, False])
def test_benchmark_compiles_for_the_batch_the_pipeline_yields(dataset, packed):
  """The abstract batch that the fit check compiles for (step_setup.batch_specs) has the
  fields, shapes and dtypes of the training pipeline's batch: with packing 16 examples /
  1.6 = 10 rows."""
  overrides = {"data.packing": True, "data.packing_factor": 1.6} if packed else {}
  config = config_on(dataset, **overrides)
  model_config = run_config.validate(config)
  phase = run_config.phases(config)[0]
  batch = next(loop._train_source(config, phase, model_config).iterate(0))  # pylint: disable=protected-access
  specs = step_setup.batch_specs(config, phase, None)
  assert ({k: (v.shape, np.dtype(v.dtype)) for k, v in specs.items()}
          == {k: (v.shape, v.dtype) for k, v in batch.items()})
  assert specs["input_ids"].shape == ((10, 32) if packed else (16, 32))
  assert set(schema.PACKED_KEYS) & set(specs) == (set(schema.PACKED_KEYS) if packed else set())
  # The benchmark reads no records: it compiles for packed shapes on synthetic
  # data, which a training run refuses.
  step_setup.build(config.copy_and_resolve_references(), jax.devices(), compile_only=True)
  if packed:
    with pytest.raises(run_config.ConfigError, match=r"--config\.data\.packing: packs records"):
      step_setup.build(config.copy_and_resolve_references(), jax.devices())
    # The timed run has unpacked synthetic batches only.
    with pytest.raises(app.UsageError, match=r"--config\.data\.packing=True: the timed run"):
      step_bench.run_benchmark(config)


BAD = {
    "cudnn": ({"model.attention_impl": "cudnn", "model.dtype": "bfloat16"},
              r"--config\.model\.attention_impl: model\.attention_impl='cudnn' does not take "
              "packed rows"),
    "synthetic": ({"data.source": "synthetic"}, r"--config\.data\.packing: packs records"),
    "chunk": ({"data.packing_chunk_steps": 0},
              r"--config\.data\.packing_chunk_steps: must be at least 1"),
    "factor": ({"data.packing_factor": 3.0}, r"--config\.data\.packing_factor: 16 examples "
               r"of phase seq32 over packing_factor=3\.0 is 5\.33333 rows"),
    "factor_range": ({"data.packing_factor": 4.0}, r"--config\.data\.packing_factor: must be "
                     r"in \[1, data\.packing_max_examples_per_row=3\]"),
    "predictions": ({"data.packing_max_predictions_per_row": 4},
                    r"--config\.data\.packing_max_predictions_per_row=4 is below the records' "
                    r"max_predictions_per_seq=5"),
    "predictions_length": ({"data.packing_max_predictions_per_row": 40},
                           r"packing_max_predictions_per_row=40 exceeds max_seq_length=32"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_packing_config_errors_name_the_field_before_anything_compiles(case, dataset, tmp_path,
                                                                       monkeypatch):
  overrides, message = BAD[case]
  forbid_building_state(monkeypatch)
  with pytest.raises(run_config.ConfigError, match=message):
    loop.train_and_evaluate(config_on(dataset, **{"data.packing": True, **overrides}),
                            str(tmp_path))
