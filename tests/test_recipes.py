"""The pieces of the recipe benchmarks that decide how runs share the machine."""

import os

from bertjax.benchmarks import recipes


def test_cpu_shares_are_disjoint_and_cover_every_cpu():
  cpus = sorted(os.sched_getaffinity(0))
  for n in range(1, len(cpus) + 1):
    shares = recipes.cpu_shares(n)
    assert len(shares) == n
    flat = [c for share in shares for c in share]
    assert sorted(flat) == cpus  # every CPU once, none twice
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_cpu_shares_pin_nothing_when_runs_outnumber_cpus():
  n = len(os.sched_getaffinity(0)) + 1
  assert recipes.cpu_shares(n) == [None] * n


def test_demo_scale_keeps_the_recipes_learning_rate_ratio():
  paper = recipes.paper_config(100)
  modern = recipes.scaled_to_demo(recipes.config_module("modern").get_config(), 100)
  base = recipes.config_module("base").get_config().optimizer.learning_rate
  full = recipes.config_module("modern").get_config().optimizer.learning_rate
  assert abs(modern.optimizer.learning_rate / paper.optimizer.learning_rate - full / base) < 1e-9
  assert modern.model.hidden_size == paper.model.hidden_size
  assert list(modern.phases) == ["seq128"] and modern.total_steps == 100
