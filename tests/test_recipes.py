"""The recipe benchmarks' demo-scale configs."""

import pytest

from bertjax.benchmarks import downstream_budget
from bertjax.benchmarks import recipes


def test_demo_scale_keeps_the_recipes_learning_rate_ratio_at_equal_batch():
  paper = recipes.paper_config(100)
  modern = recipes.scaled_to_demo(recipes.config_module("modern").get_config(), 100)
  base = recipes.config_module("base").get_config()
  full = recipes.config_module("modern").get_config()
  # MosaicBERT's 5e-4 at batch 4,096 against the paper's 1e-4 at 256: 5x the
  # rate at 16x the batch, 1.25x at equal batch by the square-root rule.
  ratio = ((full.optimizer.learning_rate / base.optimizer.learning_rate)
           * (base.phases.seq128.global_batch_size
              / full.phases.seq128.global_batch_size) ** 0.5)
  assert abs(ratio - 1.25) < 1e-9
  assert abs(modern.optimizer.learning_rate / paper.optimizer.learning_rate - ratio) < 1e-9
  assert modern.phases.seq128.global_batch_size == paper.phases.seq128.global_batch_size
  assert modern.model.hidden_size == paper.model.hidden_size
  assert list(modern.phases) == ["seq128"] and modern.total_steps == 100


def test_downstream_budget_names_the_bad_flag(tmp_path):
  (tmp_path / "paper").mkdir()
  cases = {
      ("paper",): "--checkpoint='paper': expected NAME=PATH",
      ("paper=missing",): "missing is not a directory",
  }
  for specs, message in cases.items():
    with pytest.raises(SystemExit, match=message):
      downstream_budget._checkpoints(list(specs), str(tmp_path), random_init=False)
  with pytest.raises(SystemExit, match="at least one --checkpoint"):
    downstream_budget._checkpoints([], str(tmp_path), random_init=False)
  got = downstream_budget._checkpoints(["p=paper"], str(tmp_path), random_init=True)
  assert got == {"p": str(tmp_path / "paper"), "random init": ""}
