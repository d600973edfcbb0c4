"""Per-chip efficiency of the train step on one accelerator, in one command.

  python -m bertjax.benchmarks.device_suite --out_dir=DIR [--rows=1,2,3,4,5,6]
      [--budget_s=450] [--tiny] [--set=FIELD=VALUE ...]

measures these rows (synthetic data, global batch 256; the paper's dropout
is hidden and attention dropout 0.1):

  1  configs/large.py at 128, the paper's dropout; profiled
  2  configs/base.py at 128, the paper's dropout; profiled
  3  configs/large.py at 512, the paper's dropout
  4  configs/modern.py at 128 (its attention dropout 0)
  5  configs/base.py at 512, the paper's dropout: the same examples unpacked
     and packed two to a row (data.packing_factor 2), real tokens/s of each
  6  row 1 with model.attention_impl='xla', the baseline of the fused kernel

and writes DIR/device_suite.json (everything measured), DIR/device_suite.md
(a table: sequences/s, real tokens/s, step time median and range, MFU
against the chip's peak, the attention kernel that model.attention_impl
picks, the command of the row), DIR/profile_summary.md (where each
millisecond of a profiled step goes, by category) and DIR/trace/ (each
profiled row's trace and compiled program, gzipped). DIR defaults to $OUT.

Each row runs in a process of its own (bertjax/benchmarks/device_row.py),
in the order --rows gives. A row whose step needs more memory than the
device lets a program use is compiled again with gradient accumulation
(the fewest micro-batches predicted to fit). A row that fails (out of
memory, a compile error) is reported with its error and the suite goes on.
The rows share --budget_s: a row is skipped, with the reason, when less
is left than it is expected to take (ROWS' estimate, or the time an earlier
row of the same config and phase took), and stopped when the budget runs
out. MFU is the analytic model FLOPs (bertjax/train/flops.py) over the
peak bf16 TFLOP/s of the device kind (flops.PEAK_TFLOPS; --peak_tflops
overrides it).

--tiny runs the same rows with a tiny model (hidden 32, 2 layers, fp32, vocab
512), global batch 8 and a few steps, on any backend (the CPU included).
bertjax/benchmarks/device_suite.sh runs the suite on a GPU machine whose
Python lacks ml_collections (docs/benchmarks.md).
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from bertjax.benchmarks import trace_summary

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPER_DROPOUT = {"model.hidden_dropout_rate": 0.1, "model.attention_dropout_rate": 0.1}
TINY = {"model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2,
        "model.intermediate_size": 64, "model.vocab_size": 512, "model.dtype": "float32"}
TINY_BATCH = 8
TINY_ESTIMATE_S = 40.0  # A tiny row on a loaded 2-core CPU: start, compiles, steps.


@dataclasses.dataclass(frozen=True)
class Row:
  title: str
  config: str  # Relative to the repository.
  phase: str
  overrides: dict
  estimate_s: float  # Seconds on one H100, a guess (not measured): start, compiles, steps, profile.
  packing_factor: float = 0.0  # Non-zero: unpacked against packed rows.
  batch: int = 256


ROWS = {
    "1": Row("BERT-LARGE, 128, paper dropout", "configs/large.py", "seq128", PAPER_DROPOUT, 100),
    "2": Row("BERT-BASE, 128, paper dropout", "configs/base.py", "seq128", PAPER_DROPOUT, 70),
    "3": Row("BERT-LARGE, 512, paper dropout", "configs/large.py", "seq512", PAPER_DROPOUT, 130),
    "4": Row("modern (BASE dims), 128", "configs/modern.py", "seq128", {}, 50),
    "5": Row("BERT-BASE, 512, paper dropout, packed x2 vs unpacked", "configs/base.py",
             "seq512", PAPER_DROPOUT, 100, packing_factor=2.0),
    "6": Row("row 1 with XLA attention", "configs/large.py", "seq128",
             {**PAPER_DROPOUT, "model.attention_impl": "xla"}, 80),
}

_ROWS = flags.DEFINE_list("rows", list(ROWS), f"Rows to run, in this order; of {list(ROWS)}.")
_BUDGET = flags.DEFINE_float("budget_s", 450.0, "Seconds for all the rows together.")
_OUT_DIR = flags.DEFINE_string("out_dir", "", "Where the reports go (default: $OUT).")
_TINY = flags.DEFINE_bool("tiny", False, "A tiny model, batch 8 and a few steps (any backend).")
_STEPS = flags.DEFINE_integer("steps", 0, "Timed steps per row (0: 10, with --tiny 3).")
_WARMUP = flags.DEFINE_integer("warmup", 0, "Untimed steps after compiling (0: 3, with --tiny 1).")
_PROFILE_ROWS = flags.DEFINE_list("profile_rows", ["1", "2"], "Rows to profile.")
_PROFILE_STEPS = flags.DEFINE_integer("profile_steps", 3, "Steps traced per profiled row.")
_PEAK = flags.DEFINE_float("peak_tflops", 0.0, "Peak bf16 TFLOP/s per chip for MFU (0: "
                           "bertjax.train.flops.PEAK_TFLOPS by device kind).")
_BYTES_LIMIT = flags.DEFINE_float("bytes_limit_gib", 0.0, "Memory a program may use per "
                                  "device, for the fit check (0: what the device reports).")
_SET = flags.DEFINE_multi_string("set", [], "FIELD=VALUE set in every row's config after the "
                                 "row's own, e.g. --set=model.remat_policy=full.")


def parse_sets(sets: list[str]) -> dict:
  """{field: value} of --set=FIELD=VALUE flags (values as given: the row reads literals)."""
  out = {}
  for item in sets:
    field, eq, value = item.partition("=")
    if not eq or not field:
      raise app.UsageError(f"--set={item}: expected FIELD=VALUE, e.g. model.remat_policy=full")
    out[field.strip()] = value.strip()
  return out


def estimate_s(row_id: str, done: dict, tiny: bool) -> float:
  """Seconds a row is expected to take: an earlier row's of the same config and
  phase where one ran, else the row's estimate (TINY_ESTIMATE_S with --tiny)."""
  row = ROWS[row_id]
  same = [r["wall_s"] for r in done.values()
          if r.get("status") == "ok" and (r["config"], r["phase"]) == (row.config, row.phase)
          and not r.get("packing")]
  if same:
    return max(same)
  return TINY_ESTIMATE_S if tiny else row.estimate_s


def row_command(row_id: str, argv_flags: list[str]) -> str:
  return " ".join(["python -m bertjax.benchmarks.device_suite", f"--rows={row_id}"] + argv_flags)


def row_spec(row_id: str, settings: dict, workdir: str, deadline: float) -> dict:
  row = ROWS[row_id]
  tiny = settings["tiny"]
  overrides = {**row.overrides, **(TINY if tiny else {}), **settings["sets"]}
  return {"row": row_id, "config": row.config, "phase": row.phase,
          "batch": TINY_BATCH if tiny else row.batch, "overrides": overrides,
          "packing_factor": row.packing_factor,
          "profile": row_id in settings["profile_rows"] and not row.packing_factor,
          "trace_prefix": os.path.join(settings["out_dir"], "trace", f"row{row_id}"),
          "steps": settings["steps"], "warmup": settings["warmup"],
          "profile_steps": settings["profile_steps"], "peak_tflops": settings["peak_tflops"],
          "bytes_limit": int(settings["bytes_limit_gib"] * 2**30),
          "deadline": deadline, "result": os.path.join(workdir, f"row{row_id}.json")}


def run_child(spec: dict, timeout: float, workdir: str) -> dict:
  """Runs one row in its own process; its result, or the failure of the process."""
  spec_path = os.path.join(workdir, f"row{spec['row']}.spec.json")
  log_path = os.path.join(workdir, f"row{spec['row']}.log")
  with open(spec_path, "w", encoding="utf-8") as f:
    json.dump(spec, f)
  start = time.monotonic()
  error = None
  with open(log_path, "w", encoding="utf-8") as log:
    try:
      code = subprocess.run([sys.executable, "-m", "bertjax.benchmarks.device_row", spec_path],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), check=False).returncode
    except subprocess.TimeoutExpired:
      code, error = None, f"stopped after {timeout:.0f} s: the suite's --budget_s ran out"
  with open(log_path, encoding="utf-8", errors="replace") as f:
    text = f.read()
  print(f"----- row {spec['row']} (log) -----\n{text}----- row {spec['row']} end -----",
        flush=True)
  result = None
  if error is None and os.path.exists(spec["result"]):
    with open(spec["result"], encoding="utf-8") as f:
      result = json.load(f)
  if result is None:
    tail = "\n".join(text.strip().splitlines()[-3:])
    result = {"status": "failed",
              "error": error or f"the row's process exited with {code} and no result: {tail}"}
  result["wall_s"] = time.monotonic() - start
  return result


def skipped(reason: str) -> dict:
  return {"status": "skipped", "reason": reason}


def run_rows(settings: dict) -> list[dict]:
  """Every row of ROWS: run (in --rows order, within the budget) or skipped."""
  deadline = time.monotonic() + settings["budget_s"]
  done = {}
  with tempfile.TemporaryDirectory() as workdir:
    for row_id in settings["rows"]:
      left = deadline - time.monotonic()
      need = estimate_s(row_id, done, settings["tiny"])
      if left < need:
        done[row_id] = skipped(f"{max(left, 0):.0f} s of --budget_s={settings['budget_s']:g} "
                               f"left, and the row takes about {need:.0f} s")
      else:
        spec = row_spec(row_id, settings, workdir, time.time() + left)
        done[row_id] = run_child(spec, left, workdir)
      done[row_id].update(describe(row_id, settings))
      write_reports(settings, done)
  for row_id in ROWS:
    if row_id not in done:
      done[row_id] = {**skipped(f"not in --rows={','.join(settings['rows'])}"),
                      **describe(row_id, settings)}
  write_reports(settings, done)
  return [done[r] for r in ROWS]


def describe(row_id: str, settings: dict) -> dict:
  row = ROWS[row_id]
  return {"row": row_id, "title": row.title, "config": row.config, "phase": row.phase,
          "batch": TINY_BATCH if settings["tiny"] else row.batch,
          "overrides": {**row.overrides, **settings["sets"]},
          "command": row_command(row_id, settings["argv_flags"])}


def _fmt(x, spec=",.0f", none="n/a"):
  return none if x is None else format(x, spec)


def _measured_line(r: dict, m: dict, label: str) -> str:
  batch = f"{m['examples']}"
  if m["rows"] != m["examples"]:
    batch += f" in {m['rows']} packed rows"
  if m["grad_accum_steps"] > 1:
    batch += f", {m['grad_accum_steps']} micro-batches"
  step = m["step_ms"]
  mfu = None if m.get("mfu") is None else 100 * m["mfu"]
  return (f"| {label} | {r['config']} | {r['phase']} | {batch} | ok | "
          f"{_fmt(m['sequences_per_s'])} | {_fmt(m['real_tokens_per_s'])} | "
          f"{step['median']:.1f} ({step['min']:.1f}-{step['max']:.1f}) | "
          f"{_fmt(mfu, '.1f')}{'%' if mfu is not None else ''} | {m['attention_kernel']} | "
          f"`{r['command']}` |")


def markdown(rows: list[dict], settings: dict, elapsed: float) -> str:
  ok = [r for r in rows if r["status"] == "ok"]
  device = (f"{ok[0]['devices']} x {ok[0]['device_kind']} ({ok[0]['platform']}), "
            f"jax {ok[0]['jax_version']}" if ok else "no row ran")
  lines = ["# Device suite", "",
           f"Device: {device}. Budget {settings['budget_s']:g} s; the rows took "
           f"{elapsed:.0f} s.{' Tiny model (--tiny).' if settings['tiny'] else ''}", "",
           "| row | config | phase | batch (examples) | status | sequences/s | real tokens/s "
           "| step ms, median (range) | MFU | attention kernel | command |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  notes = []
  for r in rows:
    if r["status"] != "ok":
      why = (r.get("reason") or r.get("error") or "no reason recorded").strip().split("\n")[0]
      lines.append(f"| {r['row']} | {r['config']} | {r['phase']} | {r['batch']} | "
                   f"{r['status']}: {why.replace('|', '/')} | | | | | | `{r['command']}` |")
    elif "packing" in r:
      for name in ("unpacked", "packed"):
        lines.append(_measured_line(r, r[name], f"{r['row']} {name}"))
      p = r["packing"]
      notes.append(f"Row {r['row']}: packed / unpacked real tokens/s "
                   f"{r['packed_over_unpacked']:.2f}; real tokens "
                   f"{100 * p['real_token_share']['unpacked']:.0f}% of the slots unpacked, "
                   f"{100 * p['real_token_share']['packed']:.0f}% packed; "
                   f"{p['examples_left_out']} examples fit in no packed row.")
    else:
      lines.append(_measured_line(r, r, r["row"]))
  peaks = sorted({m["peak_tflops"] for r in ok for m in ([r[k] for k in ("unpacked", "packed")]
                                                          if "packing" in r else [r])
                  if m.get("peak_tflops")})
  lines += [""] + notes + [
      "", f"MFU: analytic model FLOPs over {', '.join(f'{p:g}' for p in peaks) or 'no known'} "
      "TFLOP/s per chip (bf16 peak of the device kind, or --peak_tflops). Step times are "
      "per step, each step waited for; sequences/s and tokens/s use the median. The "
      "attention column is what model.attention_impl resolves to for training on this "
      "device (bertjax/model/attention.py: choose)."]
  return "\n".join(lines) + "\n"


def profile_markdown(rows: list[dict]) -> str:
  parts = ["# Profile summary", "",
           "Milliseconds per traced step by category (bertjax/benchmarks/trace_summary.py); "
           "'busy' adds up each op's own time, which exceeds the wall time where ops run at "
           "once.", ""]
  for r in rows:
    if r.get("profile"):
      title = f"Row {r['row']}: {r['title']} (timed median {r['step_ms']['median']:.2f} ms)"
      parts.append(trace_summary.markdown(r["profile"], title))
    elif r.get("profile_skipped") or r.get("profile_error"):
      why = r.get("profile_skipped") or r["profile_error"]
      parts.append(f"### Row {r['row']}: no profile ({why})\n")
  return "\n".join(parts)


def write_reports(settings: dict, done: dict):
  rows = [done[r] for r in ROWS if r in done]
  elapsed = time.monotonic() - settings["started"]
  out = settings["out_dir"]
  report = {"suite": "bertjax.benchmarks.device_suite", "argv": settings["argv"],
            "budget_s": settings["budget_s"], "elapsed_s": elapsed, "tiny": settings["tiny"],
            "rows": rows}
  with open(os.path.join(out, "device_suite.json"), "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1, default=float)
  with open(os.path.join(out, "device_suite.md"), "w", encoding="utf-8") as f:
    f.write(markdown(rows, settings, elapsed))
  with open(os.path.join(out, "profile_summary.md"), "w", encoding="utf-8") as f:
    f.write(profile_markdown(rows))


def settings_from_flags(argv: list[str]) -> dict:
  unknown = [r for r in _ROWS.value if r not in ROWS]
  if unknown or not _ROWS.value:
    raise app.UsageError(f"--rows={','.join(_ROWS.value)}: rows are {','.join(ROWS)}")
  if _BUDGET.value <= 0:
    raise app.UsageError(f"--budget_s={_BUDGET.value:g}: must be positive")
  out_dir = _OUT_DIR.value or os.environ.get("OUT", "")
  if not out_dir:
    raise app.UsageError("--out_dir is required where OUT is not set")
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  tiny = _TINY.value
  # The flags that make a row's command: all as given but the suite's own.
  passed = [a for a in sys.argv[1:] if not a.startswith(("--rows", "--out_dir", "--budget_s"))]
  return {"rows": list(dict.fromkeys(_ROWS.value)), "budget_s": _BUDGET.value,
          "out_dir": os.path.abspath(out_dir), "tiny": tiny, "sets": parse_sets(_SET.value),
          "steps": _STEPS.value or (3 if tiny else 10),
          "warmup": _WARMUP.value or (1 if tiny else 3),
          "profile_rows": set(_PROFILE_ROWS.value),
          "profile_steps": _PROFILE_STEPS.value if not tiny else min(_PROFILE_STEPS.value, 2),
          "peak_tflops": _PEAK.value, "bytes_limit_gib": _BYTES_LIMIT.value,
          "argv": sys.argv, "argv_flags": passed, "started": time.monotonic()}


def main(argv):
  settings = settings_from_flags(argv)
  os.makedirs(os.path.join(settings["out_dir"], "trace"), exist_ok=True)
  run_rows(settings)
  with open(os.path.join(settings["out_dir"], "device_suite.md"), encoding="utf-8") as f:
    print(f.read())
  print(f"wrote {settings['out_dir']}/device_suite.json, device_suite.md, profile_summary.md "
        "and trace/")


if __name__ == "__main__":
  app.run(main)
