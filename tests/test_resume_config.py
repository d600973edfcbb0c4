"""The resume check: a rerun with a changed config is refused, naming the fields,
unless the change is always safe or allowed by --config.allow_changes (logged).

End to end (a real rerun refused, then resumed with a safe change) in
test_faults.py; here the rules, on the recorded config alone.
"""

import json
import logging

import pytest

from bertjax.model.config import BertConfig
from bertjax.train import run_config
from bertjax.train import run_record
from test_train import tiny_config

pytestmark = pytest.mark.slow


def _record(config, process_count=1):
  return run_record.record(config, BertConfig.from_mapping(config.model), process_count)


@pytest.fixture
def workdir(tmp_path):
  run_record.write(str(tmp_path), _record(tiny_config()))
  assert json.loads((tmp_path / "config.json").read_text())["total_steps"] == 8
  return str(tmp_path)


def _check(workdir, overrides, process_count=1):
  config = tiny_config(overrides)
  run_record.check_resume(workdir, _record(config, process_count), config)


@pytest.mark.parametrize("overrides", [
    {"total_steps": 16},
    {"phases.seq16.fraction": 0.25, "phases.seq32.fraction": 0.75},
    {"phases.seq32.global_batch_size": 16},
    {"seed": 3},
    {"model.num_layers": 3},
    {"optimizer.learning_rate": 2e-3},
    {"data.order": "global"},
    {"data.shuffle_block": 4},
])
def test_a_change_to_what_the_run_computes_is_refused_naming_each_field(workdir, overrides):
  with pytest.raises(run_config.ConfigError) as e:
    _check(workdir, overrides)
  message = str(e.value)
  assert "differs from the one recorded in" in message
  for field in overrides:
    assert f"{field}: " in message
    assert field in message.split("--config.allow_changes=")[1]


def test_safe_changes_are_logged(workdir, caplog):
  caplog.set_level(logging.WARNING)
  _check(workdir, {"logging.every_steps": 5, "checkpoint.every_steps": 2,
                   "phases.seq32.eval_files": "/data/eval/*", "mesh.data": 2,
                   "optimizer.max_nonfinite_in_a_row": 3})
  text = caplog.text
  for line in ("logging.every_steps: 1 -> 5", "checkpoint.every_steps: 3 -> 2",
               "phases.seq32.eval_files: '' -> '/data/eval/*'", "mesh.data: -1 -> 2",
               "optimizer.max_nonfinite_in_a_row: 10 -> 3"):
    assert f"Config change on resume, always allowed: {line}" in text


def test_allow_changes_names_fields_patterns_or_groups(workdir, caplog):
  caplog.set_level(logging.WARNING)
  _check(workdir, {"optimizer.learning_rate": 2e-3, "optimizer.clip_norm": 0.5,
                   "phases.seq32.train_files": "/moved/*", "total_steps": 16,
                   "allow_changes": "optimizer, phases.*.train_files,total_steps"})
  for line in ("optimizer.learning_rate: 0.001 -> 0.002", "optimizer.clip_norm: 1.0 -> 0.5",
               "phases.seq32.train_files: '' -> '/moved/*'", "total_steps: 8 -> 16"):
    assert f"allowed by --config.allow_changes: {line}" in caplog.text
  with pytest.raises(run_config.ConfigError, match=r"seed: 0 -> 1\. "):
    _check(workdir, {"seed": 1, "total_steps": 16, "allow_changes": "total_steps"})


def test_the_number_of_hosts_counts_when_each_reads_its_own_files(tmp_path):
  config = tiny_config({"data.source": "tfrecord"})
  run_record.write(str(tmp_path), _record(config, process_count=2))
  with pytest.raises(run_config.ConfigError, match="process_count: 2 -> 4"):
    run_record.check_resume(str(tmp_path), _record(config, 4), config)
  # One order for any number of hosts: nothing to check.
  config = tiny_config({"data.source": "tfrecord", "data.order": "global"})
  run_record.write(str(tmp_path), _record(config, process_count=2))
  run_record.check_resume(str(tmp_path), _record(config, 4), config)


def test_a_run_resumes_on_another_number_of_slices_and_from_a_record_without_them(tmp_path):
  config = tiny_config({"data.source": "tfrecord", "data.order": "global"})
  old = _record(config, process_count=4)
  for field in ("dcn_data", "dcn_fsdp", "dcn_tensor"):  # A record written before they existed.
    del old["mesh"][field]
  run_record.write(str(tmp_path), old)
  run_record.check_resume(str(tmp_path), _record(config, 4), config)
  # Two slices of 4 hosts become four: the mesh and the host count change.
  run_record.write(str(tmp_path), _record(config, process_count=8))
  config.mesh.dcn_data = 4
  run_record.check_resume(str(tmp_path), _record(config, 16), config)


def test_an_allowed_change_may_not_move_the_resumed_step_to_other_data():
  meta = {"phase": "seq32", "data_step": 2}  # The checkpoint of step 6 of 8.
  longer = run_config.phases(tiny_config({"total_steps": 16}))  # seq32 now starts at 8.
  with pytest.raises(run_config.ConfigError,
                     match="step 6 is in phase seq16 at data step 6: the change moves"):
    run_record.check_position(longer, 6, meta)
  # Extending only the last phase keeps step 6 where it was.
  last_longer = run_config.phases(tiny_config(
      {"total_steps": 16, "phases.seq16.fraction": 0.25, "phases.seq32.fraction": 0.75}))
  run_record.check_position(last_longer, 6, meta)
