"""The device suite (bertjax/benchmarks/device_suite.py) end to end on the CPU with
--tiny, and its pieces: rows stopped by their time boxes, the report's peer
figures and ratios, the variants, and the choice of gradient accumulation
from memory figures (the profile table's categoriser: tests/test_trace_summary.py). The peer's rows run where tests/torch_env/make.sh has made
.venv-torch (or BERTJAX_TORCH_PYTHON names a Python with torch and
transformers 5), as for tests/test_export_torch.py."""

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time

import numpy as np
import pytest

from bertjax.benchmarks import device_report
from bertjax.benchmarks import device_row
from bertjax.benchmarks import device_suite
from bertjax.benchmarks import row_process
from bertjax.benchmarks import trace_summary as ts
from bertjax.input import packing
from bertjax.records import masking
from bertjax.train import run_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# XLA's CPU backend compiles about twice as fast without LLVM's expensive
# passes; the suite's figures are not under test here.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

class _Mem:
  def __init__(self, arguments, temporaries):
    self.argument_size_in_bytes, self.temp_size_in_bytes = arguments, temporaries
    self.output_size_in_bytes = self.alias_size_in_bytes = 0


class _Compiled:
  def __init__(self, mem):
    self.mem = mem

  def memory_analysis(self):
    return self.mem


GIB = 2**30


def test_accumulation_from_memory_analysis():
  # 10 GiB of arguments and 50 of activations at k=1 on a 40 GiB device: k=2
  # is predicted to fit (10 + 25 <= 38).
  assert device_row.next_accumulation(60 * GIB, 10 * GIB, 40 * GIB, 1, 256) == 2
  assert device_row.next_accumulation(60 * GIB, 10 * GIB, 20 * GIB, 1, 256) == 8
  assert device_row.next_accumulation(60 * GIB, 10 * GIB, 20 * GIB, 1, 4) is None
  assert device_row.next_accumulation(60 * GIB, 39 * GIB, 40 * GIB, 1, 256) is None
  compiles = []

  def compile_at(k):  # 2 GiB that does not shrink with the micro-batch.
    compiles.append(k)
    return _Compiled(_Mem(10 * GIB, 50 * GIB // k + 2 * GIB))

  _, k, tries = device_row.fit_accumulation(compile_at, rows_per_device=256,
                                            bytes_limit=40 * GIB)
  assert (k, compiles) == (2, [1, 2])
  assert [t["grad_accum_steps"] for t in tries] == [1, 2]
  assert tries[1]["needed_gib"] == pytest.approx(37)
  _, k, _ = device_row.fit_accumulation(compile_at, rows_per_device=256, bytes_limit=None)
  assert k == 1
  _, k, _ = device_row.fit_accumulation(compile_at, rows_per_device=256, bytes_limit=None,
                                        start=4)
  assert k == 4
  with pytest.raises(device_row.DoesNotFit, match="no accumulation"):
    device_row.fit_accumulation(compile_at, rows_per_device=256, bytes_limit=11 * GIB)


def test_packed_pair_holds_the_same_examples_in_half_the_rows():
  config = row_process.load_config("configs/base.py", {
      "data.packing": True, "data.packing_factor": 2.0,
      "phases.seq512.global_batch_size": "64"})  # A string is read as a literal.
  phase = next(p for p in run_config.phases(config) if p.name == "seq512")
  unpacked, packed, left_out = device_row.packed_pair(config, phase, vocab_size=1000)
  assert left_out == 0
  assert packed["input_ids"].shape == (32, 512) and unpacked["input_ids"].shape == (64, 512)
  for name in ("input_mask", "masked_lm_weights", "example_weights"):
    assert packed[name].sum() == unpacked[name].sum(), name
  tokens = unpacked["input_mask"].sum(1)
  assert tokens.min() >= 32 and tokens.max() <= 320
  assert 0.25 < packing.real_token_share(unpacked) < 0.45
  predictions = (unpacked["masked_lm_weights"] > 0).sum(1)
  assert (predictions <= masking.num_predictions(tokens, 0.15, 80)).all()
  positions = np.where(unpacked["masked_lm_weights"] > 0, unpacked["masked_lm_positions"], 0)
  assert (positions < (tokens - 1)[:, None]).all()
  packing.example_sizes(unpacked)  # Right padding, or it raises.
  with pytest.raises(KeyError, match="no field model.no_such_field"):
    row_process.load_config("configs/base.py", {"model.no_such_field": 1})


def _suite(tmp_path, *flags, timeout=900):
  out = tmp_path / "out"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=FAST_COMPILE)
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.benchmarks.device_suite", f"--out_dir={out}", *flags],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(out / "device_suite.json", encoding="utf-8") as f:
    report = json.load(f)
  return out, {r["row"]: r for r in report["rows"]}


@pytest.mark.slow
def test_suite_end_to_end_tiny(tmp_path):
  out, rows = _suite(tmp_path, "--tiny", "--rows=large128,packed512", "--budget_s=900")
  assert list(rows) == ["large128", "packed512"] + [
      r for r in device_suite.ROWS if r not in ("large128", "packed512")]
  one, five = rows["large128"], rows["packed512"]
  assert (one["status"], five["status"]) == ("ok", "ok"), (one, five)
  for m in (one, five["unpacked"], five["packed"]):
    assert m["sequences_per_s"] > 0 and m["real_tokens_per_s"] > 0
    assert 0 < m["step_ms"]["min"] <= m["step_ms"]["median"] <= m["step_ms"]["max"]
    assert m["attention_kernel"] == "xla"
  assert (one["examples"], one["seq_len"], one["grad_accum_steps"]) == (8, 128, 1)
  assert one["model"]["attention_impl"] == "xla" and one["model_flops_per_sequence"] > 0
  assert "does not run on cpu" in one["attention_choices"]["cudnn"]["error"]
  assert (five["packed"]["rows"], five["unpacked"]["rows"]) == (4, 8)
  assert five["packed"]["real_tokens"] == five["unpacked"]["real_tokens"]
  assert five["packing"]["examples_left_out"] == 0
  assert five["packed_over_unpacked"] > 0
  for r in set(rows) - {"large128", "packed512"}:
    assert rows[r]["status"] == "skipped" and "not in --rows" in rows[r]["reason"]
  profile = one["profile"]
  assert {c["category"] for c in profile["categories"]} == set(ts.CATEGORIES)
  assert sum(c["ms"] for c in profile["categories"]) == pytest.approx(profile["step_ms"],
                                                                       rel=1e-6)
  assert profile["steps"] == 2 and profile["explained_ops"] > 0
  by_cat = {c["category"]: c["ms"] for c in profile["categories"]}
  assert by_cat[ts.MATMUL] > 0 and by_cat[ts.DROPOUT] > 0 and by_cat[ts.OPTIMIZER] > 0
  table = (out / "device_suite.md").read_text()
  assert "| large128 | bertjax | configs/large.py | seq128 | 8 | ok |" in table
  assert ("| packed512 packed | bertjax | configs/base.py | seq512 | 8 in 4 packed rows | ok |"
          in table)
  assert "`python -m bertjax.benchmarks.device_suite --rows=packed512 --tiny`" in table
  assert "| matmul |" in (out / "profile_summary.md").read_text()
  # What a device run hands back: a few files, no folders.
  assert sorted(os.listdir(out)) == ["device_suite.json", "device_suite.md",
                                     "profile_summary.md", "rows.log", "traces.tar.gz"]
  with tarfile.open(out / "traces.tar.gz") as tar:
    assert sorted(tar.getnames()) == ["large128.hlo.txt.gz", "large128.perfetto_trace.json.gz"]
  log = (out / "rows.log").read_text()
  assert "===== large128: " in log and "phase compile (packed)" in log


def test_failed_rows_are_reported_and_the_suite_goes_on(tmp_path):
  out, rows = _suite(tmp_path, "--tiny", "--rows=modern128,base128", "--set=model.num_heads=3")
  for r in ("modern128", "base128"):
    assert rows[r]["status"] == "failed"
    assert "model.num_heads=3" in rows[r]["error"]
  assert "| modern128 | bertjax | configs/modern.py | seq128 | 8 | failed: ConfigError" in (
      out / "device_suite.md").read_text()


def test_rows_past_the_budget_are_skipped_with_the_reason(tmp_path):
  out, rows = _suite(tmp_path, "--tiny", "--budget_s=1")
  for r in rows.values():
    assert r["status"] == "skipped"
    assert "of --budget_s=1 left, and the row takes about" in r["reason"]
  assert (out / "device_suite.md").read_text().count("| skipped: ") == len(device_suite.ROWS)


def test_suite_imports_without_tensorflow_and_leaves_jax_to_the_rows():
  """The suite's own process never starts JAX (so it holds no accelerator memory
  while a row runs), and no part of it imports TensorFlow."""
  code = ("import sys; import bertjax.benchmarks.device_suite; jax = 'jax' in sys.modules; "
          "import bertjax.benchmarks.device_row; print(jax, 'tensorflow' in sys.modules)")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        check=True)
  assert proc.stdout.strip() == "False False"


# A row's process as the suite starts it, for the tests of time boxes: it
# records the suite's entry for it as it starts, then hangs in compile (row
# large128) or writes a result (any other row).
FAKE_ROW = textwrap.dedent("""
    import json, os, sys, time
    from bertjax.benchmarks import row_process
    spec = json.load(open(sys.argv[1]))
    phases = row_process.Phases(spec)
    with open(os.path.join(os.environ["SUITE_OUT"], "device_suite.json")) as f:
      entry = [r for r in json.load(f)["rows"] if r["row"] == spec["row"]][0]
    with open(os.path.join(os.environ["SUITE_OUT"], "seen_" + spec["row"] + ".json"), "w") as f:
      json.dump(entry, f)
    phases.enter("build")
    phases.enter("compile")
    def compile_forever():
      time.sleep(600)
    if spec["row"] == "large128":
      compile_forever()
    phases.enter("steps")
    step_ms = {"median": 10.0, "min": 9.0, "max": 11.0}
    row_process.write_json(spec["result"], {
        "status": "ok", "rows": 8, "examples": 8, "step_ms": step_ms, "sequences_per_s": 800.0,
        "real_tokens_per_s": 1e5, "attention_kernel": "xla"})
    """)


def test_a_row_that_hangs_is_stopped_by_its_compile_box_with_its_phase(tmp_path, monkeypatch):
  out = tmp_path / "out"
  out.mkdir()
  fake = tmp_path / "fake_row.py"
  fake.write_text(FAKE_ROW)
  monkeypatch.setenv("SUITE_OUT", str(out))
  monkeypatch.setenv("PYTHONPATH", REPO)
  settings = device_suite.make_settings(
      str(out), tiny=True, budget_s=120, compile_box_s=3, steps_box_s=3,
      commands={"bertjax": [sys.executable, str(fake)], "peer": [sys.executable, str(fake)]})
  start = time.monotonic()
  done = device_suite.run_rows(settings, [("large128", device_suite.ROWS["large128"]),
                                          ("base128", device_suite.ROWS["base128"])])
  assert time.monotonic() - start < 3 + row_process.GRACE_S + 20
  # Before each row's process started, the report held it as running.
  for row in ("large128", "base128"):
    seen = json.loads((out / f"seen_{row}.json").read_text())
    assert (seen["status"], seen["process_phase"], seen["row"]) == ("running", "start", row)
  hung = done["large128"]
  assert (hung["status"], hung["process_phase"]) == ("stopped", "compile"), hung
  assert hung["error"].startswith("stopped in compile after ")
  assert hung["error"].endswith("s: its compile time box, 3 s")
  assert hung["innermost"][0].endswith("compile_forever")  # From its own stack dump.
  assert done["base128"]["status"] == "ok"  # The suite went on.
  report = json.loads((out / "device_suite.json").read_text())
  assert [(r["row"], r["status"]) for r in report["rows"]] == [("large128", "stopped"),
                                                               ("base128", "ok")]
  table = (out / "device_suite.md").read_text()
  assert ("| large128 | bertjax | configs/large.py | seq128 | 8 | stopped: stopped in compile "
          "after ") in table
  assert "large128: stopped; innermost frames: " in table
  log = (out / "rows.log").read_text()
  assert "===== large128: " in log and "phase compile" in log and "Timeout (" in log


def test_a_process_past_its_box_that_does_not_stop_is_killed(tmp_path):
  """A process that never arms its own stack dump (it writes its status by
  hand) is killed by the parent once its box and the grace are over; the
  parent reports each phase the process entered."""
  child = textwrap.dedent("""
      import sys, time, json
      from bertjax.benchmarks import row_process
      spec = json.load(open(sys.argv[1]))
      now = time.time()
      row_process.write_json(spec["status"], {"phase": "compile", "detail": "x", "since": now,
                                              "box": "compile", "box_since": now})
      time.sleep(600)
      """)
  spec = {"result": str(tmp_path / "row.json"), "status": str(tmp_path / "status.json"),
          "boxes": {"compile": 1.0, "steps": 1.0}, "deadline": time.time() + 60}
  phases = []
  result = row_process.run([sys.executable, "-c", child], spec, str(tmp_path / "row.log"),
                           on_phase=lambda s: phases.append(s.get("phase")), grace_s=0.5,
                           env=dict(os.environ, PYTHONPATH=REPO))
  assert result["status"] == "stopped" and result["process_phase"] == "compile"
  assert result["error"].startswith("stopped in compile (x) after ")
  assert result["error"].endswith(": its compile time box, 1 s; killed")
  assert phases[0] == "start" and phases[-1] == "compile"
  assert result["wall_s"] < 20


def _row(row_id, side, config, phase, batch, **figures):
  return {"row": row_id, "title": row_id, "side": side, "config": config, "phase": phase,
          "batch": batch, "status": "ok", "command": f"run {row_id}", **figures}


def _figures(examples, sequences_per_s, kernel="xla"):
  ms = 1e3 * examples / sequences_per_s
  return {"rows": examples, "examples": examples, "sequences_per_s": sequences_per_s,
          "real_tokens_per_s": 100 * sequences_per_s, "attention_kernel": kernel,
          "step_ms": {"median": ms, "min": ms, "max": ms}}


def test_ratios_to_the_peer_and_its_mfu_from_bertjax_flops():
  flops_per_sequence = 1e9
  base = _row("base128", "bertjax", "configs/base.py", "seq128", 256, **_figures(256, 400.0),
              mfu=0.2, peak_tflops=1000.0, model_flops_per_sequence=flops_per_sequence,
              devices=1, device_kind="NVIDIA H200", platform="gpu", jax_version="0.11.2")
  peer = _row("peer_base128", "peer", "configs/base.py", "seq128", 256,
              parts=["eager", "compiled"], eager=_figures(256, 100.0, "sdpa"),
              compiled=_figures(256, 200.0, "sdpa"))
  # At 512 the peer ran at 32 and bertjax at 64: no ratio.
  large = _row("large512", "bertjax", "configs/large.py", "seq512", 64, **_figures(64, 80.0),
               model_flops_per_sequence=4e9, peak_tflops=1000.0)
  peer_large = _row("peer_large512", "peer", "configs/large.py", "seq512", 32,
                    parts=["eager", "compiled"], eager=_figures(32, 20.0, "sdpa"),
                    compiled=_figures(32, 40.0, "sdpa"))
  rows = device_report.with_peer_figures([base, peer, large, peer_large])
  assert rows[0]["over_peer"] == {"eager": 4.0, "compiled": 2.0}
  assert "over_peer" not in rows[2]
  assert rows[1]["compiled"]["mfu"] == pytest.approx(flops_per_sequence * 200 / 1e15)
  assert rows[3]["eager"]["mfu"] == pytest.approx(4e9 * 20 / 1e15)
  table = device_report.markdown(rows, budget_s=370, elapsed_s=300, tiny=False, variants="")
  lines = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
  assert lines["base128"].endswith("| 20.0% | xla | 2.00 | 4.00 | `run base128` |")
  assert lines["peer_base128 compiled"].startswith(
      "| peer_base128 compiled | peer compiled | configs/base.py | seq128 | 256 | ok | 200 |")
  assert "| 0.0% | sdpa |  |  |" in lines["peer_base128 eager"]
  assert "scores every position (labels -100 elsewhere)" in table


def test_a_part_measured_before_a_stop_is_kept():
  peer = _row("peer_large128", "peer", "configs/large.py", "seq128", 256,
              parts=["eager", "compiled"], eager=_figures(256, 100.0, "sdpa"))
  peer.update(status="stopped", error="stopped in compile after 151 s: its compile time box")
  table = device_report.markdown([peer], budget_s=370, elapsed_s=300, tiny=False, variants="")
  assert "| peer_large128 eager | peer eager | configs/large.py | seq128 | 256 | ok | 100 |" in table
  assert ("| peer_large128 (rest) | peer (rest) | configs/large.py | seq128 | 256 | stopped: "
          "stopped in compile after 151 s") in table


def test_variants_skip_the_rows_own_values_and_kernels_that_cannot_run(tmp_path):
  settings = device_suite.make_settings(str(tmp_path), variants="base128")
  row = device_suite.ROWS["base128"]
  done = {"base128": {
      "status": "ok", "model": {"hidden_dropout_rate": 0.1, "attention_dropout_rate": 0.1,
                                "remat_policy": "none", "scan_layers": True,
                                "attention_impl": "xla"},
      "attention_choices": {"xla": {"kernel": "xla"}, "flash": {"kernel": "flash"},
                            "cudnn": {"error": "cudnn has no attention dropout"},
                            "splash": {"error": "splash does not run on gpu"}}}}
  runs = device_suite.variant_rows("base128", row, done, settings)
  assert [r for r, _ in runs] == ["base128-hidden_dropout_0", "base128-attention_dropout_0",
                                  "base128-scan_layers_off", "base128-flash_attention"]
  flash = dict(runs)["base128-flash_attention"]
  assert flash.overrides["model.attention_impl"] == "flash" and flash.batch == 256
  assert done["base128-remat_none"]["reason"] == "the row has model.remat_policy='none' already"
  assert done["base128-cudnn_attention"]["reason"] == "cudnn has no attention dropout"
  assert done["base128-flash_attention"]["status"] == "queued"
  assert done["base128-scan_layers_off"]["command"] == (
      "python -m bertjax.benchmarks.device_suite --rows=base128 --set=model.scan_layers=False")


def test_variants_table_gives_each_ones_step_time_against_the_rows():
  base = _row("base128", "bertjax", "configs/base.py", "seq128", 256, **_figures(256, 256.0))
  faster = _row("base128-hidden_dropout_0", "bertjax", "configs/base.py", "seq128", 256,
                variant="hidden dropout 0", change="model.hidden_dropout_rate=0.0",
                **_figures(256, 320.0))
  cannot = {**_row("base128-cudnn_attention", "bertjax", "configs/base.py", "seq128", 256),
            "status": "skipped", "reason": "cudnn has no attention dropout",
            "variant": "cuDNN attention", "change": "model.attention_impl='cudnn'"}
  table = device_report.markdown([base, faster, cannot], budget_s=370, elapsed_s=300,
                                 tiny=False, variants="base128")
  assert "| the row |  | ok | 256 | 1000.0 (1000.0-1000.0) | n/a | xla |  |  |" in table
  assert ("| hidden dropout 0 | `model.hidden_dropout_rate=0.0` | ok | 320 | 800.0 "
          "(800.0-800.0) | n/a | xla | -200.0 | 0.800 |") in table
  assert ("| cuDNN attention | `model.attention_impl='cudnn'` | skipped: cudnn has no attention "
          "dropout |") in table


def test_the_peer_takes_its_sizes_and_batch_from_the_rows():
  settings = device_suite.make_settings("/tmp/unused")
  rows = device_suite.ROWS
  spec = device_suite.peer_spec(rows["peer_large128"], settings, 256)
  assert spec["model"] == {
      "vocab_size": 30522, "hidden_size": 1024, "num_layers": 24, "num_heads": 16,
      "intermediate_size": 4096, "hidden_dropout_rate": 0.1, "attention_dropout_rate": 0.1,
      "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
      "initializer_range": 0.02, "dtype": "bfloat16"}
  assert (spec["learning_rate"], spec["weight_decay"]) == (1e-4, 0.01)
  assert (spec["seq_len"], spec["predictions"], spec["batches"]) == (128, 20, [256])
  spec = device_suite.peer_spec(rows["peer_large512"], settings, 64)
  assert (spec["seq_len"], spec["predictions"], spec["batches"]) == (512, 80, [64, 32])
  tiny = device_suite.peer_spec(rows["peer_base128"], device_suite.make_settings(
      "/tmp/unused", tiny=True), 8)
  assert (tiny["model"]["hidden_size"], tiny["model"]["dtype"], tiny["batches"]) == (
      32, "float32", [8])
  # BERT-LARGE at 512 runs at the batch that fitted the peer.
  assert device_suite.row_batch(rows["large512"], {}, tiny=False) == 64
  assert device_suite.row_batch(rows["large512"], {"peer_large512": {"batch": 32}},
                                tiny=False) == 32


def test_variants_of_a_peer_row_are_a_usage_error(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "bertjax.benchmarks.device_suite",
                         f"--out_dir={tmp_path}", "--variants=peer_base128"], cwd=REPO,
                        capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode != 0
  assert "--variants=peer_base128: name one of the unpacked bertjax rows" in (
      proc.stdout + proc.stderr)


@pytest.mark.slow
def test_variants_end_to_end_tiny(tmp_path):
  out, rows = _suite(tmp_path, "--tiny", "--variants=base128", "--budget_s=900")
  assert rows["base128"]["status"] == "ok"
  for label in ("hidden_dropout_0", "attention_dropout_0", "scan_layers_off",
                "flash_attention"):
    assert rows[f"base128-{label}"]["status"] == "ok", rows[f"base128-{label}"]
  assert rows["base128-flash_attention"]["attention_kernel"] == "flash"
  assert rows["base128-attention_dropout_0"]["model"]["attention_dropout_rate"] == 0.0
  for label in ("remat_none", "xla_attention", "cudnn_attention", "splash_attention"):
    assert rows[f"base128-{label}"]["status"] == "skipped"
  assert "does not run on cpu" in rows["base128-cudnn_attention"]["reason"]
  table = (out / "device_suite.md").read_text()
  assert "## Variants of base128" in table
  base_ms = rows["base128"]["step_ms"]["median"]
  flash_ms = rows["base128-flash_attention"]["step_ms"]["median"]
  assert f"| {flash_ms - base_ms:+.1f} | {flash_ms / base_ms:.3f} |" in table


@pytest.mark.slow
def test_peer_row_against_bertjax_tiny(tmp_path):
  """The peer's process in the PyTorch environment, eager and compiled, beside
  bertjax's row of the same config: ratios, and MFU from bertjax's FLOPs."""
  # The PyTorch environment as tests/test_export_torch.py finds it (skipped
  # without it, failed under CI).
  from test_export_torch import torch_python  # pylint: disable=g-import-not-at-top
  out, rows = _suite(tmp_path, "--tiny", "--rows=base128,peer_base128",
                     f"--peer_python={torch_python()}", "--peak_tflops=1")
  bertjax, peer = rows["base128"], rows["peer_base128"]
  assert (bertjax["status"], peer["status"]) == ("ok", "ok"), peer
  assert peer["batch"] == 8 and peer["attention"] == "sdpa" and peer["platform"] == "cpu"
  for part in ("eager", "compiled"):
    m = peer[part]
    assert (m["examples"], m["seq_len"]) == (8, 128) and m["sequences_per_s"] > 0
    assert m["real_tokens"] == bertjax["real_tokens"]  # The same synthetic batch.
    assert m["mfu"] == pytest.approx(
        bertjax["model_flops_per_sequence"] * m["sequences_per_s"] / 1e12)
    assert bertjax["over_peer"][part] == pytest.approx(
        bertjax["sequences_per_s"] / m["sequences_per_s"])
  assert peer["compiled"]["compile_s"] > 0
  table = (out / "device_suite.md").read_text()
  assert "| peer_base128 compiled | peer compiled | configs/base.py | seq128 | 8 | ok |" in table
  log = (out / "rows.log").read_text()
  assert "phase eager (batch 8)" in log and "phase compile (batch 8)" in log
