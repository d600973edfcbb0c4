"""The recipe studies' demo-scale configs."""

import pytest

from bertjax.studies import downstream_budget
from bertjax.studies import recipes

pytestmark = pytest.mark.slow


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
      downstream_budget._checkpoints(list(specs), str(tmp_path), random_init=False,
                                     segment_b_inits=[])
  with pytest.raises(SystemExit, match="at least one --checkpoint"):
    downstream_budget._checkpoints([], str(tmp_path), random_init=False, segment_b_inits=[])
  got = downstream_budget._checkpoints(["p=paper"], str(tmp_path), random_init=True,
                                       segment_b_inits=[])
  assert got == {"p": (str(tmp_path / "paper"), None), "random init": ("", None)}
  got = downstream_budget._checkpoints(["p=paper"], str(tmp_path), random_init=False,
                                       segment_b_inits=["keep", "copy_a"])
  assert got == {"p [keep]": (str(tmp_path / "paper"), "keep"),
                 "p [copy_a]": (str(tmp_path / "paper"), "copy_a")}


def test_time_to_quality_modern_settings_change_the_modern_recipe_only():
  from bertjax.studies import time_to_quality  # pylint: disable=import-outside-toplevel
  tiny = recipes.paper_config(1000)
  modern = time_to_quality.recipe_config("modern", 1000, lr_scale=2.0, warmup_pct=2,
                                         mask_rate=0.15, seed=3)
  assert abs(modern.optimizer.learning_rate - 2.0 * tiny.optimizer.learning_rate) < 1e-12
  assert modern.optimizer.warmup_steps == 20 and modern.seed == 3
  assert modern.data.masked_lm_prob == 0.15
  assert modern.phases.seq128.max_predictions_per_seq == 20  # 15% of 128, to a multiple of 4.
  assert recipes.modern(1000, mask_rate=0.4).phases.seq128.max_predictions_per_seq == 52
  default = time_to_quality.recipe_config("modern", 1000)
  assert abs(default.optimizer.learning_rate - 1.25 * tiny.optimizer.learning_rate) < 1e-12
  assert default.optimizer.warmup_steps == 60  # configs/modern.py's 6%.
  assert default.phases.seq128.max_predictions_per_seq == 40
  paper = time_to_quality.recipe_config("paper", 1000)
  assert paper.optimizer.learning_rate == tiny.optimizer.learning_rate
  assert paper.to_dict() == tiny.to_dict()


_FAKE_RECIPE = '''
import json, os, sys, time
name = sys.argv[1].split("=", 1)[1]
root, wait_for = sys.argv[2], [n for n in sys.argv[3].split(",") if n]
start = time.time()
open(os.path.join(root, name + ".started"), "w").close()
deadline = time.time() + 60  # Wait (up to 60 s) until these recipes have started too.
while not all(os.path.exists(os.path.join(root, n + ".started")) for n in wait_for):
  if time.time() > deadline:
    sys.exit(4)
  time.sleep(0.01)
time.sleep(0.3)  # Long enough for a recipe started at once to start meanwhile.
if name == "bad":
  sys.exit(3)
with open(os.path.join(root, name, "curve.json"), "w") as f:
  json.dump({"name": name, "workdir": root, "steps": [1], "seconds": [start, time.time()]}, f)
'''


@pytest.mark.parametrize("side_by_side", [False, True])
def test_pretrain_in_processes_runs_one_after_another_or_at_once(tmp_path, monkeypatch,
                                                                  side_by_side):
  (tmp_path / "fake_recipe.py").write_text(_FAKE_RECIPE)
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))
  # Side by side each fake recipe waits for both to have started (exit 4
  # after 60 s without it); one after another, none waits.
  wait_for = "a,b" if side_by_side else ""
  curves = recipes.pretrain_in_processes("fake_recipe", ["a", "b"], str(tmp_path),
                                         [str(tmp_path), wait_for], side_by_side=side_by_side)
  (a_start, a_end), (b_start, b_end) = curves["a"].seconds, curves["b"].seconds
  if side_by_side:
    assert b_start < a_end and a_start < b_end  # The runs overlap.
  else:
    assert a_end <= b_start  # b starts after a has finished.
  assert (tmp_path / "a" / "pretrain.log").exists()


def test_a_rerun_keeps_finished_runs_and_refuses_other_arguments(tmp_path, monkeypatch):
  (tmp_path / "fake_recipe.py").write_text(_FAKE_RECIPE)
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))
  argv = [str(tmp_path), ""]
  first = recipes.pretrain_in_processes("fake_recipe", ["a"], str(tmp_path), argv,
                                        side_by_side=False)
  (tmp_path / "a.started").unlink()
  # Finished: not run again (no new .started file), the same curve.
  again = recipes.pretrain_in_processes("fake_recipe", ["a", "b"], str(tmp_path), argv,
                                        side_by_side=False)
  assert again["a"] == first["a"] and not (tmp_path / "a.started").exists()
  assert (tmp_path / "b.started").exists()
  with pytest.raises(SystemExit, match=r"/a: a finished run of .*, not .* a; use another"):
    recipes.pretrain_in_processes("fake_recipe", ["a"], str(tmp_path), [str(tmp_path), "a"],
                                  side_by_side=True)


def test_pretrain_in_processes_names_the_failed_recipe_and_stops(tmp_path, monkeypatch):
  (tmp_path / "fake_recipe.py").write_text(_FAKE_RECIPE)
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))
  with pytest.raises(SystemExit, match=r"bad \(exit 3; see .*bad/pretrain.log\)"):
    recipes.pretrain_in_processes("fake_recipe", ["bad", "b"], str(tmp_path),
                                  [str(tmp_path), ""], side_by_side=False)
  assert not (tmp_path / "b").exists()  # One after another: b never started.


def test_ablation_orders_only_the_scores_that_the_dev_set_tells_apart():
  from bertjax.studies import ablation  # pylint: disable=g-import-not-at-top
  margin = ablation.noise_margin(1000)
  assert abs(margin - 0.0316) < 1e-3
  # The published run: 0.6010, 0.5000, 0.5010.
  line = ablation.order_line({"mlm+nsp": 0.6010, "mlm": 0.5000, "ltr": 0.5010}, margin)
  assert line.startswith("Demo downstream order: BERT-BASE (mlm+nsp) > LTR & No NSP (ltr) ~ "
                         "No NSP (mlm) ('~': within 0.032")
  line = ablation.order_line({"mlm+nsp": 0.70, "mlm": 0.62, "ltr": 0.55}, margin)
  assert "BERT-BASE (mlm+nsp) > No NSP (mlm) > LTR & No NSP (ltr) (" in line
