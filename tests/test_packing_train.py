"""Packing end to end: train_and_evaluate packed and unpacked on the same
examples gives the same run, and packing settings that cannot work are refused
before anything compiles."""

import os

import numpy as np
import pytest

from bertjax.train import loop
from bertjax.train import run_config
from test_packing_pipeline import P, dataset  # pylint: disable=unused-import
from test_train import forbid_building_state, tiny_config

STEPS = 3


def config_on(directory, **overrides):
  config = tiny_config({"total_steps": STEPS, "data.source": "tfrecord",
                        "model.hidden_dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
                        "model.vocab_size": 200, "checkpoint.every_steps": 100,
                        "logging.eval_batches": 0, **overrides})
  config.phases = {"seq32": config.phases.seq32}
  config.phases.seq32.update(fraction=1.0, max_predictions_per_seq=P, global_batch_size=16,
                             train_files=os.path.join(directory, "part-*"),
                             eval_files=os.path.join(directory, "part-*"))
  return config


def test_packed_run_equals_the_unpacked_run(dataset, tmp_path):
  """Without dropout a packed step trains on the same examples with the same
  gradient: eval losses after 3 steps agree to 1e-4 (fp32)."""
  plain = loop.train_and_evaluate(config_on(dataset), str(tmp_path / "plain"))
  packed = loop.train_and_evaluate(config_on(dataset, **{"data.packing": True}),
                                   str(tmp_path / "packed"))
  a, b = plain["phases"]["seq32"]["eval"], packed["phases"]["seq32"]["eval"]
  for k in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
    np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-6, err_msg=k)
  assert packed["data"]["packing_overflow"] == 0


BAD = {
    "cudnn": ({"model.attention_impl": "cudnn", "model.dtype": "bfloat16"},
              r"--config\.model\.attention_impl: model\.attention_impl='cudnn' cannot keep "
              "packed examples apart"),
    "synthetic": ({"data.source": "synthetic"}, r"--config\.data\.packing: packs records"),
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
