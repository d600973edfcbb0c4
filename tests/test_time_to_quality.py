"""The arithmetic of bertjax/studies/time_to_quality.py and recipes.py: model
FLOPs to a step, the projection to BERT-BASE and the median (range) cells."""

import pytest

from bertjax.studies import recipes
from bertjax.studies import time_to_quality
from bertjax.model.config import BertConfig
from bertjax.train import flops


def test_flops_and_projection_count_each_phase_at_its_own_length():
  config = recipes.paper_config(1000)  # seq128 for 970 steps at batch 8, then seq512 at 4.
  model = BertConfig(vocab_size=6000, hidden_size=128, num_layers=2, num_heads=2,
                     intermediate_size=512)
  assert recipes.phase_steps(config, 980) == {"seq128": 970, "seq512": 10}
  assert recipes.phase_steps(config, 500) == {"seq128": 500, "seq512": 0}
  expected = (970 * 8 * flops.train_flops_per_sequence(model, 128, 20)
              + 10 * 4 * flops.train_flops_per_sequence(model, 512, 80))
  assert recipes.train_flops(config, model, 980) == pytest.approx(expected)
  ms = time_to_quality.BASE_STEP_MS
  hours = time_to_quality.projected_hours("paper", config, 980, ms)
  assert hours == pytest.approx((970 * ms[("paper", "seq128")][0]
                                 + 10 * ms[("paper", "seq512")][0]) / 3.6e6)
  modern = recipes.modern(1000)
  assert recipes.phase_steps(modern, 600) == {"seq128": 600}
  assert time_to_quality.projected_hours("modern", modern, 600, ms) == pytest.approx(
      600 * ms[("modern", "seq128")][0] / 3.6e6)


def test_base_step_ms_flag_replaces_named_entries_and_names_bad_ones():
  got = time_to_quality.parse_step_ms("modern.seq128=70,paper.seq128=90.5")
  assert got[("modern", "seq128")] == (70.0, "given with --base_step_ms")
  assert got[("paper", "seq128")][0] == 90.5
  assert got[("paper", "seq512")] == time_to_quality.BASE_STEP_MS[("paper", "seq512")]
  for bad in ("modern.seq512=70", "modern=70", "paper.seq128=-1", "paper.seq128=fast"):
    with pytest.raises(SystemExit, match="--base_step_ms"):
      time_to_quality.parse_step_ms(bad)


def test_cells_give_median_and_range_and_count_seeds_that_never_reach():
  assert recipes.cell([3, 1, 2], "{:.0f}") == "2 (1-3)"
  assert recipes.cell([5], "{:.1f}") == "5.0"
  assert recipes.cell([None, 4, 2], "{:.0f}") == "3 (2-4), 1 of 3 seeds not reached"
  assert recipes.cell([None], "{:.0f}") == "not reached"
  assert time_to_quality._first([0.1, None, 0.3, 0.5], 0.3) == 2  # pylint: disable=protected-access
  assert time_to_quality._first([0.1], 0.3) is None  # pylint: disable=protected-access


def test_run_names_carry_recipe_and_seed():
  name = time_to_quality._run_name("modern", 12)  # pylint: disable=protected-access
  assert time_to_quality._parse_run_name(name) == ("modern", 12)  # pylint: disable=protected-access


def test_grid_searches_one_setting_at_a_time_from_the_first_values():
  from bertjax.studies import recipe_grid  # pylint: disable=g-import-not-at-top
  scored = []

  def score(point):
    scored.append(point)
    lr, warmup, mask = point
    return -abs(lr - 2) - abs(warmup - 2) - abs(mask - 0.15)

  assert recipe_grid.coordinate_search(score, [1.25, 2, 3], [6, 2], [0.3, 0.15]) == (2, 2, 0.15)
  assert set(scored) == {(1.25, 6, 0.3), (2, 6, 0.3), (3, 6, 0.3), (2, 2, 0.3), (2, 2, 0.15)}


def test_step_cost_variants_change_one_ingredient_each(tmp_path):
  from bertjax.studies import recipe_step_cost as cost  # pylint: disable=g-import-not-at-top
  paper = cost.variant_config("paper128", 1000, str(tmp_path))
  assert list(paper.phases) == ["seq128"] and paper.phases.seq128.fraction == 1.0
  assert paper.objective == "mlm+nsp" and paper.phases.seq128.max_predictions_per_seq == 20
  modern = cost.variant_config("modern", 1000, str(tmp_path))
  assert modern.data.dynamic_masking and modern.phases.seq128.max_predictions_per_seq == 40
  both = cost.variant_config("modern_static_slots20", 1000, str(tmp_path))
  assert not both.data.dynamic_masking and both.phases.seq128.max_predictions_per_seq == 20
  assert both.optimizer.to_dict() == cost.variant_config(
      "modern_slots20", 1000, str(tmp_path)).optimizer.to_dict()
  assert both.data.demo_dir.endswith("data_mlm_20") and modern.data.demo_dir.endswith(
      "data_mlm_40")
  log = "step 100 ... 50.0 seq/s ...\nstep 200 ... 101.5 seq/s\nstep 300 ... 99 seq/s\n"
  assert cost.window_rates(log) == [101.5, 99.0]
