"""The recipe benchmarks' demo-scale configs."""

from bertjax.benchmarks import recipes


def test_demo_scale_keeps_the_recipes_learning_rate_ratio():
  paper = recipes.paper_config(100)
  modern = recipes.scaled_to_demo(recipes.config_module("modern").get_config(), 100)
  base = recipes.config_module("base").get_config().optimizer.learning_rate
  full = recipes.config_module("modern").get_config().optimizer.learning_rate
  assert abs(modern.optimizer.learning_rate / paper.optimizer.learning_rate - full / base) < 1e-9
  assert modern.model.hidden_size == paper.model.hidden_size
  assert list(modern.phases) == ["seq128"] and modern.total_steps == 100
