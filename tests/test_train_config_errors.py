"""Config errors stop a pretraining run with the field's name before anything compiles.

The run config is tests/test_train.py's tiny one; each bad value is checked
by run_config.validate or by train_and_evaluate with state building
forbidden, so a check that came too late would fail the test.
"""

import os

import pytest

from bertjax.convert.weights import load_weights
from bertjax.model import kernel_evidence
from bertjax.train import loop
from bertjax.train import run_config
from bertjax.train import state as state_lib
from test_train import forbid_building_state, tiny_config


BAD_CONFIGS = {
    "phase_remat": ({"phases.seq32.remat_policy": "some"},
                    r"--config\.phases\.seq32\.remat_policy: 'some' is not one of"),
    "hidden_size": ({"model.hidden_size": 30}, r"--config\.model\.hidden_size: 30 is not "
                    r"divisible by model\.num_heads=4"),
    "micro_batches": ({"optimizer.grad_accum_steps": 3},
                      r"--config\.phases\.seq16\.global_batch_size: 8 is not divisible by "
                      r"optimizer\.grad_accum_steps=3"),
    "length": ({"phases.seq32.max_seq_length": 64},
               r"--config\.phases\.seq32\.max_seq_length: 64 exceeds "
               r"model\.max_position_embeddings=32"),
    "fractions": ({"phases.seq32.fraction": 0.4}, r"--config\.phases: fractions .* add up to "
                  r"0\.9, not 1"),
    "unknown": ({"optimizer.lr": 1e-3}, r"--config\.optimizer\.lr: unknown field"),
    "unknown_phase_field": ({"phases.seq16.batch_size": 8},
                            r"--config\.phases\.seq16\.batch_size: unknown field"),
    "data_order": ({"data.order": "random"}, r"--config\.data\.order: 'random' is not one of"),
    "optimizer": ({"optimizer.name": "sgd"}, r"--config\.optimizer\.name: 'sgd'"),
    "mesh": ({"mesh.fsdp": -1}, r"--config\.mesh: at most one"),
    "nonfinite": ({"optimizer.max_nonfinite_in_a_row": 0},
                  r"--config\.optimizer\.max_nonfinite_in_a_row: must be at least 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_config_errors_name_the_field_before_anything_compiles(case, tmp_path, monkeypatch):
  overrides, message = BAD_CONFIGS[case]
  forbid_building_state(monkeypatch)
  with pytest.raises(run_config.ConfigError, match=message):
    loop.train_and_evaluate(tiny_config(overrides), str(tmp_path))
  assert not os.path.exists(tmp_path / "checkpoints")


def test_batch_must_split_over_data_parallel_devices():
  config = tiny_config()
  run_config.validate(config, num_devices=8)  # 8 sequences on 8 devices.
  with pytest.raises(run_config.ConfigError,
                     match=r"--config\.phases\.seq16\.global_batch_size: 8 .* not divisible "
                           r"by the 16 data-parallel devices"):
    run_config.validate(config, num_devices=16)
  # Tensor parallelism does not split the batch.
  run_config.validate(tiny_config({"mesh.data": 8, "mesh.tensor": -1}), num_devices=16)
  with pytest.raises(run_config.ConfigError, match="global_batch_size: 8 is not divisible by "
                                                   "the 3 hosts"):
    run_config.validate(config, num_devices=8, process_count=3)


def test_splash_attention_is_refused_where_the_tensor_axis_does_not_divide_the_heads(
    monkeypatch):
  fix = r"set mesh\.tensor to a divisor of 4, or model\.attention_impl='xla'"
  no_dropout = {"model.attention_dropout_rate": 0.0}
  splash = dict(no_dropout, **{"model.attention_impl": "splash"})
  # 4 heads on 8 tensor shards (mesh.tensor -1 takes the 8 devices), on any platform.
  for platform in ("tpu", "cpu"):
    with pytest.raises(run_config.ConfigError, match=(
        r"--config\.model\.num_heads: 4 heads do not split over the mesh\.tensor=8 tensor "
        r"shards, so splash attention would compute every head on every tensor shard "
        rf"\(model\.attention_impl='splash'\): {fix}")):
      run_config.validate(tiny_config(dict(splash, **{"mesh.data": 1, "mesh.tensor": -1})),
                          num_devices=8, platform=platform)
  # A fixed mesh.tensor is checked without the device count; heads that split are fine.
  with pytest.raises(run_config.ConfigError, match=r"mesh\.tensor=3 tensor shards"):
    run_config.validate(tiny_config(dict(splash, **{"mesh.tensor": 3})))
  run_config.validate(tiny_config(dict(splash, **{"mesh.data": 4, "mesh.tensor": 2})),
                      num_devices=8)
  # auto: refused only where it picks splash or flash: nowhere while no
  # evidence proves them; with evidence on TPU (None checks as for TPU) at a
  # proven length: flash in training with attention dropout, splash in
  # training without it or in evaluation.
  at_128 = {"model.max_position_embeddings": 128, "phases.seq32.max_seq_length": 128,
            "mesh.data": 1, "mesh.tensor": 8}
  monkeypatch.setattr(kernel_evidence, "PROVEN", ())
  run_config.validate(tiny_config(at_128), num_devices=8, platform="tpu")
  proven = lambda kernel, dropout: kernel_evidence.Evidence(
      kernel=kernel, platform="tpu", dropout=dropout, seq_lens=(128,),
      jax_minors=(kernel_evidence.jax_minor(),), compiled="-", faster="-")
  monkeypatch.setattr(kernel_evidence, "PROVEN", (proven("flash", True),
                                                  proven("splash", False)))
  for overrides in (no_dropout, {"phases.seq32.eval_files": "/data/eval/*"}):
    config = tiny_config(dict(at_128, **overrides))
    for platform in ("tpu", None):
      with pytest.raises(run_config.ConfigError, match=(
          r"--config\.model\.num_heads: 4 heads do not split over the mesh\.tensor=8 .*"
          r"model\.attention_impl='auto' picks (splash|flash) on tpu for (training|evaluation) at "
          rf"phase seq32's length 128\): {fix}")):
        run_config.validate(config, num_devices=8, platform=platform)
    run_config.validate(config, num_devices=8, platform="cpu")
  # With attention dropout auto trains with flash, which runs per shard too.
  with pytest.raises(run_config.ConfigError, match=(
      r"so flash attention would compute every head on every tensor shard "
      r"\(model\.attention_impl='auto' picks flash on tpu for training")):
    run_config.validate(tiny_config(at_128), num_devices=8, platform="tpu")
  with pytest.raises(run_config.ConfigError, match=r"\(model\.attention_impl='flash'\)"):
    run_config.validate(tiny_config(dict(at_128, **{"model.attention_impl": "flash"})),
                        num_devices=8, platform="cpu")
  run_config.validate(tiny_config(dict(no_dropout, **{"mesh.data": 1, "mesh.tensor": 8})),
                      num_devices=8, platform="tpu")  # Lengths 16 and 32: XLA.


def test_init_from_a_path_without_weights_is_an_error_naming_the_flag(tmp_path, monkeypatch):
  def compiles(*args, **kwargs):
    raise AssertionError("the run initialised a state before reading init_from")
  monkeypatch.setattr(state_lib, "create_train_state", compiles)
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match=r"--config\.init_from=.*empty: neither a bertjax "
                                       r"checkpoint"):
    loop.train_and_evaluate(tiny_config({"init_from": str(empty)}), str(tmp_path / "run"),
                            weights_loader=load_weights)
