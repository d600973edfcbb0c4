"""Per-chip efficiency of the train step on one accelerator, against a PyTorch peer.

  python -m bertjax.benchmarks.device_suite --out_dir=DIR [--rows=large128,base128,...]
      [--budget_s=370] [--compile_box_s=S] [--steps_box_s=S] [--tiny] [--set=FIELD=VALUE ...]
  python -m bertjax.benchmarks.device_suite --out_dir=DIR --variants=ROW [...]

measures these rows, in this order (synthetic data, the paper's dropout:
hidden and attention 0.1, unless a row says otherwise):

  large128       configs/large.py at 128, batch 256, XLA attention; profiled
  base128        configs/base.py at 128, batch 256, XLA attention; profiled
  peer_large128  the peer (below) at BERT-LARGE's sizes, 128, batch 256
  peer_base128   the peer at BERT-BASE's sizes, 128, batch 256
  peer_large512  the peer at BERT-LARGE's sizes, 512, batch 64 (32 if 64 does
                 not fit: the batch that fits both)
  large512       configs/large.py at 512, the batch peer_large512 ran at (64
                 where it did not run), XLA attention
  modern128      configs/modern.py at 128, batch 256 (its attention dropout 0;
                 model.attention_impl as the config has it)
  packed512      configs/base.py at 512, batch 256, XLA attention: the same
                 examples unpacked and packed two to a row (data.packing_factor
                 2), real tokens/s of each

The peer (bertjax/benchmarks/peer_row.py) is transformers' BertForPreTraining
in PyTorch with SDPA attention, bf16 autocast and fused AdamW, timed eager
and then under torch.compile in one process; it takes its sizes, dropout,
learning rate and weight decay from the bertjax row's config (with --set and
--tiny applied). The table's bertjax rows carry bertjax / peer ratios of
sequences/s (compiled and eager) at the same config, length and batch, and
both sides' MFU counts the same model FLOPs: bertjax's analytic count
(bertjax/train/flops.py), which the bertjax row of the same config and
length reports.

With --variants=ROW (a bertjax row, unpacked) the suite times that row and
then the row with one field changed at a time (VARIANTS: hidden dropout 0,
attention dropout 0, model.remat_policy none, model.scan_layers off, each
model.attention_impl of xla, cudnn, flash and splash), and prints each
one's step time against the row's. A variant is skipped, with the reason,
where the row already has that value or where that attention kernel cannot
train the row on this device (device_row reports which can).

Each row runs in a process of its own (device_row.py, peer_row.py; the
peer's with --peer_python), under two time boxes (bertjax/benchmarks/
row_process.py): one for its start and compile (ROWS' compile_box_s, or
--compile_box_s) and one for its steps and profile (steps_box_s, or
--steps_box_s). A row past a box prints every thread's stack and is stopped,
and is reported with the phase it was in ("stopped in compile after 152 s").
The rows share --budget_s: a row is skipped, with the reason, when less is
left than it is expected to take (ROWS' estimate, or what an earlier row of
the same side, config and length took), and stopped when the budget runs
out. A row that fails (out of memory, a compile error) is reported with its
error, and the suite goes on. A bertjax row whose step needs more memory
than the device lets a program use is compiled again with gradient
accumulation (device_row.py).

Written into DIR (default $OUT), at most 8 files, none over 16 MiB, no
folders, as a device run hands back: device_suite.json (every row: before it
starts an entry with status "running" and, as it goes, its phase; then its
figures or why it has none), device_suite.md (the table; with --variants the
deltas), profile_summary.md (where each millisecond of a profiled step goes,
by category), rows.log (every row's process output, appended as it is
written) and traces.tar.gz (each profiled row's trace and compiled program,
as long as the whole stays under 15 MiB). bertjax/benchmarks/device_suite.sh
adds device_suite.log and flash_gpu_check.tar.gz.

--tiny runs the same rows with a tiny model (hidden 32, 2 layers, fp32, vocab
512), global batch 8 and a few steps, on any backend (the CPU included).
"""

import dataclasses
import os
import sys
import tarfile
import tempfile
import time

from absl import app
from absl import flags

from bertjax.benchmarks import device_report
from bertjax.benchmarks import row_process

PAPER_DROPOUT = {"model.hidden_dropout_rate": 0.1, "model.attention_dropout_rate": 0.1}
XLA = {**PAPER_DROPOUT, "model.attention_impl": "xla"}
TINY = {"model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2,
        "model.intermediate_size": 64, "model.vocab_size": 512, "model.dtype": "float32"}
TINY_BATCH = 8
# A tiny row on a loaded 2-core CPU: start, compiles (torch.compile's C++ for the peer), steps.
TINY_ESTIMATE_S = {"bertjax": 40.0, "peer": 120.0}
TINY_BOXES = {"compile": 240.0, "steps": 180.0}
MAX_TRACES_BYTES = 15 * 2**20  # traces.tar.gz, under the 16 MiB a device run hands back.
PEER_MODEL_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads",
                     "intermediate_size", "hidden_dropout_rate", "attention_dropout_rate",
                     "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
                     "initializer_range", "dtype")


@dataclasses.dataclass(frozen=True)
class Row:
  """One row. Times are seconds on one H200, guesses until a run measures them."""
  title: str
  config: str  # Relative to the repository.
  phase: str
  overrides: dict
  estimate_s: float  # Start, compiles, steps and profile together.
  compile_box_s: float  # Start, build and compile (the peer: torch.compile's first step).
  steps_box_s: float  # Warm-up, timed steps and profile (the peer: each of eager and compiled).
  batch: int = 256
  peer: bool = False  # transformers' BertForPreTraining in PyTorch (peer_row.py).
  fallback_batches: tuple[int, ...] = ()  # The peer's, where `batch` does not fit.
  batch_from: str = ""  # A row whose batch this one takes (the batch that fit the peer).
  packing_factor: float = 0.0  # Non-zero: unpacked against packed rows.
  variant: tuple = ()  # (label, field, value) of a --variants row: its one change.


ROWS = {
    "large128": Row("BERT-LARGE, 128, XLA attention", "configs/large.py", "seq128", XLA,
                    100, 150, 60),
    "base128": Row("BERT-BASE, 128, XLA attention", "configs/base.py", "seq128", XLA,
                   60, 100, 45),
    "peer_large128": Row("peer, BERT-LARGE, 128", "configs/large.py", "seq128", PAPER_DROPOUT,
                         85, 150, 45, peer=True),
    "peer_base128": Row("peer, BERT-BASE, 128", "configs/base.py", "seq128", PAPER_DROPOUT,
                        55, 100, 40, peer=True),
    "peer_large512": Row("peer, BERT-LARGE, 512", "configs/large.py", "seq512", PAPER_DROPOUT,
                         90, 150, 60, batch=64, peer=True, fallback_batches=(32,)),
    "large512": Row("BERT-LARGE, 512, XLA attention", "configs/large.py", "seq512", XLA,
                    90, 150, 45, batch=64, batch_from="peer_large512"),
    "modern128": Row("modern (BASE dims), 128", "configs/modern.py", "seq128", {}, 50, 100, 40),
    "packed512": Row("BERT-BASE, 512, XLA attention, packed x2 vs unpacked", "configs/base.py",
                     "seq512", XLA, 110, 100, 40, packing_factor=2.0),
}

# (label, field, value): the single-field changes of --variants.
VARIANTS = (
    ("hidden dropout 0", "model.hidden_dropout_rate", 0.0),
    ("attention dropout 0", "model.attention_dropout_rate", 0.0),
    ("remat none", "model.remat_policy", "none"),
    ("scan_layers off", "model.scan_layers", False),
    ("XLA attention", "model.attention_impl", "xla"),
    ("cuDNN attention", "model.attention_impl", "cudnn"),
    ("flash attention", "model.attention_impl", "flash"),
    ("splash attention", "model.attention_impl", "splash"),
)

_ROWS = flags.DEFINE_list("rows", list(ROWS), f"Rows to run, in this order; of {list(ROWS)}.")
_VARIANTS = flags.DEFINE_string("variants", "", "A bertjax row to time with each of VARIANTS' "
                                "single-field changes (instead of --rows).")
_BUDGET = flags.DEFINE_float("budget_s", 370.0, "Seconds for all the rows together.")
_COMPILE_BOX = flags.DEFINE_float("compile_box_s", 0.0, "Seconds a row may take to start and "
                                  "compile (0: the row's own, ROWS' compile_box_s).")
_STEPS_BOX = flags.DEFINE_float("steps_box_s", 0.0, "Seconds a row may take for its steps and "
                                "profile (0: the row's own, ROWS' steps_box_s).")
_OUT_DIR = flags.DEFINE_string("out_dir", "", "Where the reports go (default: $OUT).")
_TINY = flags.DEFINE_bool("tiny", False, "A tiny model, batch 8 and a few steps (any backend).")
_STEPS = flags.DEFINE_integer("timed_steps", 0, "Timed steps per row (0: 10, with --tiny 3).")
_WARMUP = flags.DEFINE_integer("warmup_steps", 0, "Untimed steps after compiling (0: 3, with --tiny 1).")
_PROFILE_ROWS = flags.DEFINE_list("profile_rows", ["large128", "base128"], "Rows to profile.")
_PROFILE_STEPS = flags.DEFINE_integer("profile_steps", 3, "Steps traced per profiled row.")
_PEAK = flags.DEFINE_float("peak_tflops", 0.0, "Peak bf16 TFLOP/s per chip for MFU (0: "
                           "bertjax.train.flops.PEAK_TFLOPS by device kind).")
_BYTES_LIMIT = flags.DEFINE_float("bytes_limit_gib", 0.0, "Memory a program may use per "
                                  "device, for the fit check (0: what the device reports).")
_SET = flags.DEFINE_multi_string("set", [], "FIELD=VALUE set in every row's config after the "
                                 "row's own, e.g. --set=model.remat_policy=full.")
_PEER_PYTHON = flags.DEFINE_string("peer_python", sys.executable, "The Python that runs the "
                                   "peer's rows: one with torch and transformers.")


def parse_sets(sets: list[str]) -> dict:
  """{field: value} of --set=FIELD=VALUE flags (values as given: the row reads literals)."""
  out = {}
  for item in sets:
    field, eq, value = item.partition("=")
    if not eq or not field:
      raise app.UsageError(f"--set={item}: expected FIELD=VALUE, e.g. model.remat_policy=full")
    out[field.strip()] = value.strip()
  return out


def side(row: Row) -> str:
  return "peer" if row.peer else "bertjax"


def estimate_s(row: Row, done: dict, tiny: bool) -> float:
  """Seconds a row is expected to take: what an earlier row of the same side,
  config and phase took where one ran, else the row's estimate."""
  same = [r["wall_s"] for r in done.values()
          if r.get("status") == "ok" and (r["side"], r["config"], r["phase"])
          == (side(row), row.config, row.phase) and not r.get("packing")]
  if same:
    return max(same)
  return TINY_ESTIMATE_S[side(row)] if tiny else row.estimate_s


def row_batch(row: Row, done: dict, tiny: bool) -> int:
  if tiny:
    return TINY_BATCH
  source = done.get(row.batch_from, {})
  return source.get("batch") or row.batch


def boxes(row: Row, settings: dict) -> dict:
  own = TINY_BOXES if settings["tiny"] else {"compile": row.compile_box_s,
                                             "steps": row.steps_box_s}
  return {"compile": settings["compile_box_s"] or own["compile"],
          "steps": settings["steps_box_s"] or own["steps"]}


def overrides(row: Row, settings: dict) -> dict:
  return {**row.overrides, **(TINY if settings["tiny"] else {}), **settings["sets"]}


def bertjax_spec(row_id: str, row: Row, settings: dict, batch: int, workdir: str) -> dict:
  return {"config": row.config, "phase": row.phase, "batch": batch,
          "overrides": overrides(row, settings), "packing_factor": row.packing_factor,
          "profile": row_id in settings["profile_rows"] and not row.packing_factor,
          "trace_prefix": os.path.join(workdir, "trace", row_id),
          "steps": settings["steps"], "warmup": settings["warmup"],
          "profile_steps": settings["profile_steps"], "peak_tflops": settings["peak_tflops"],
          "bytes_limit": int(settings["bytes_limit_gib"] * 2**30)}


def peer_spec(row: Row, settings: dict, batch: int) -> dict:
  """The peer's spec: the sizes, dropout and optimizer of the row's config."""
  config = row_process.load_config(row.config, overrides(row, settings))
  phase = config.phases[row.phase]
  fallbacks = [] if settings["tiny"] else [b for b in row.fallback_batches if b < batch]
  return {"model": {f: config.model[f] for f in PEER_MODEL_FIELDS},
          "learning_rate": config.optimizer.learning_rate,
          "weight_decay": config.optimizer.weight_decay, "seq_len": phase.max_seq_length,
          "predictions": phase.max_predictions_per_seq, "batches": [batch, *fallbacks],
          "steps": settings["steps"], "warmup": settings["warmup"]}


def run_one(row_id: str, row: Row, settings: dict, done: dict, deadline: float,
            workdir: str) -> dict:
  """Runs a row's process (its files in `workdir`); its result, or why it has none."""
  batch = row_batch(row, done, settings["tiny"])
  command = settings["commands"][side(row)]
  if row.peer:
    spec = peer_spec(row, settings, batch)
  else:
    spec = bertjax_spec(row_id, row, settings, batch, workdir)
  spec.update(row=row_id, boxes=boxes(row, settings), deadline=deadline,
              result=os.path.join(workdir, f"{row_id}.json"),
              status=os.path.join(workdir, f"{row_id}.status.json"))
  log_path = os.path.join(settings["out_dir"], "rows.log")
  with open(log_path, "a", encoding="utf-8") as log:
    log.write(f"===== {row_id}: {row.title} ({time.strftime('%H:%M:%S')}) =====\n")

  def on_phase(status: dict):
    done[row_id].update(process_phase=status.get("phase"),
                        process_phase_detail=status.get("detail", ""),
                        process_phase_since=status.get("since"))
    write_reports(settings, done)

  result = row_process.run(command, spec, log_path, on_phase=on_phase,
                           env=dict(os.environ, PYTHONUNBUFFERED="1"))
  if row.peer and "No module named 'torch'" in result.get("error", ""):
    result["error"] += (f" (in {command[0]}: --peer_python names a Python with torch and "
                        "transformers)")
  print(f"{row_id}: {result['status']} in {result['wall_s']:.0f} s"
        f"{': ' + result['error'] if result.get('error') else ''}", flush=True)
  return result


def run_rows(settings: dict, plan: list[tuple[str, Row]]) -> dict:
  """{row id: result}: each row of `plan` run (within the budget) or skipped;
  with --variants, the variants of the plan's one row after it."""
  deadline = time.time() + settings["budget_s"]
  done = {}
  queue = list(plan)
  open(os.path.join(settings["out_dir"], "rows.log"), "w", encoding="utf-8").close()
  for row_id, row in queue:
    done[row_id] = queued(row_id, row, settings, done)
  with tempfile.TemporaryDirectory() as workdir:
    while queue:
      row_id, row = queue.pop(0)
      left = deadline - time.time()
      need = estimate_s(row, done, settings["tiny"])
      if left < need:
        done[row_id] = {**skipped(f"{max(left, 0):.0f} s of --budget_s="
                                  f"{settings['budget_s']:g} left, and the row takes about "
                                  f"{need:.0f} s"), **describe(row_id, row, settings, done)}
      else:
        done[row_id] = {"status": "running", "process_phase": "start",
                        "process_phase_since": time.time(),
                        **describe(row_id, row, settings, done)}
        write_reports(settings, done)
        result = run_one(row_id, row, settings, done, deadline, workdir)
        done[row_id] = {**describe(row_id, row, settings, done), **result}
        if result.get("trace_files"):
          pack_traces(settings, done)
      if settings["variants"] == row_id:
        queue += variant_rows(row_id, row, done, settings)
      write_reports(settings, done)
  return done


def skipped(reason: str) -> dict:
  return {"status": "skipped", "reason": reason}


def variant_rows(row_id: str, row: Row, done: dict, settings: dict) -> list[tuple[str, Row]]:
  """The rows of VARIANTS that can run; the others go into `done`, skipped
  with the reason (read from the row's own result where it ran)."""
  base = done[row_id]
  model, choices = base.get("model", {}), base.get("attention_choices", {})
  out = []
  for label, field, value in VARIANTS:
    variant_id = f"{row_id}-{label.replace(' ', '_').lower()}"
    variant = dataclasses.replace(row, title=f"{row.title}: {label}",
                                  overrides={**row.overrides, field: value},
                                  variant=(label, field, value))
    name = field.removeprefix("model.")
    if name in model and model[name] == value:
      why = f"the row has {field}={value!r} already"
    elif name == "attention_impl" and "error" in choices.get(value, {}):
      why = choices[value]["error"]
    else:
      out.append((variant_id, variant))
      done[variant_id] = queued(variant_id, variant, settings, done)
      continue
    done[variant_id] = {**skipped(why), **describe(variant_id, variant, settings, done)}
  return out


def queued(row_id: str, row: Row, settings: dict, done: dict) -> dict:
  """The entry of a row that waits for the rows before it."""
  return {"status": "queued", "reason": "waits for the rows before it",
          **describe(row_id, row, settings, done)}


def describe(row_id: str, row: Row, settings: dict, done: dict) -> dict:
  out = {"row": row_id, "title": row.title, "side": side(row), "config": row.config,
         "phase": row.phase, "batch": row_batch(row, done, settings["tiny"]),
         "overrides": {**row.overrides, **settings["sets"]},
         "command": row_command(row_id, row, settings)}
  if row.variant:
    label, field, value = row.variant
    out.update(variant=label, change=f"{field}={value!r}")
  return out


def row_command(row_id: str, row: Row, settings: dict) -> str:
  """The command that runs the row alone (a variant: its row with its change)."""
  extra = []
  if row.variant:
    row_id, extra = settings["variants"], [f"--set={row.variant[1]}={row.variant[2]}"]
  return " ".join(["python -m bertjax.benchmarks.device_suite", f"--rows={row_id}",
                   *settings["argv_flags"], *extra])


def pack_traces(settings: dict, done: dict):
  """traces.tar.gz: every profiled row's trace and compiled program, in row
  order, while the whole stays under MAX_TRACES_BYTES; rows left out say so."""
  path = os.path.join(settings["out_dir"], "traces.tar.gz")
  total = 0
  with tarfile.open(path + ".tmp", "w:gz") as tar:
    for r in done.values():
      files = [f for f in r.get("trace_files", []) if os.path.exists(f)]
      size = sum(os.path.getsize(f) for f in files)
      if not files:
        continue
      if total + size > MAX_TRACES_BYTES:
        r["traces"] = f"left out of traces.tar.gz: it would pass {MAX_TRACES_BYTES >> 20} MiB"
        continue
      total += size
      for f in files:
        tar.add(f, arcname=os.path.basename(f))
      r["traces"] = "traces.tar.gz: " + ", ".join(os.path.basename(f) for f in files)
  os.replace(path + ".tmp", path)


def write_reports(settings: dict, done: dict):
  """device_suite.json, device_suite.md and profile_summary.md of the rows so far."""
  rows = device_report.with_peer_figures(list(done.values()))
  elapsed = time.monotonic() - settings["started"]
  out = settings["out_dir"]
  report = {"suite": "bertjax.benchmarks.device_suite", "argv": settings["argv"],
            "budget_s": settings["budget_s"], "elapsed_s": elapsed, "tiny": settings["tiny"],
            "variants": settings["variants"], "rows": rows}
  row_process.write_json(os.path.join(out, "device_suite.json"), report)
  table = device_report.markdown(rows, budget_s=settings["budget_s"], elapsed_s=elapsed,
                                 tiny=settings["tiny"], variants=settings["variants"])
  for name, text in (("device_suite.md", table),
                     ("profile_summary.md", device_report.profile_markdown(rows))):
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
      f.write(text)


def plan_from_flags() -> list[tuple[str, Row]]:
  if _VARIANTS.value:
    row = ROWS.get(_VARIANTS.value)
    if row is None or row.peer or row.packing_factor:
      raise app.UsageError(
          f"--variants={_VARIANTS.value}: name one of the unpacked bertjax rows "
          f"{','.join(r for r, x in ROWS.items() if not x.peer and not x.packing_factor)}")
    if flags.FLAGS["rows"].present:
      raise app.UsageError("--variants and --rows: give one of them")
    return [(_VARIANTS.value, row)]
  unknown = [r for r in _ROWS.value if r not in ROWS]
  if unknown or not _ROWS.value:
    raise app.UsageError(f"--rows={','.join(_ROWS.value)}: rows are {','.join(ROWS)}")
  return [(r, ROWS[r]) for r in dict.fromkeys(_ROWS.value)]


def make_settings(out_dir: str, *, tiny: bool = False, steps: int = 0, warmup: int = 0,
                  profile_steps: int = 3, peer_python: str = sys.executable, **given) -> dict:
  """The suite's settings: the flags' defaults with `given` over them; steps
  and warm-up 0 take the defaults (fewer with `tiny`)."""
  settings = {
      "budget_s": _BUDGET.default, "variants": "", "sets": {},
      "profile_rows": set(_PROFILE_ROWS.default), "peak_tflops": 0.0, "bytes_limit_gib": 0.0,
      "compile_box_s": 0.0, "steps_box_s": 0.0,
      "commands": {"bertjax": [sys.executable, "-m", "bertjax.benchmarks.device_row"],
                   "peer": [peer_python, "-m", "bertjax.benchmarks.peer_row"]},
      "argv": [], "argv_flags": [], **given}
  settings.update(out_dir=os.path.abspath(out_dir), tiny=tiny,
                  steps=steps or (3 if tiny else 10), warmup=warmup or (1 if tiny else 3),
                  profile_steps=min(profile_steps, 2) if tiny else profile_steps,
                  started=time.monotonic())
  return settings


def settings_from_flags(argv: list[str]) -> dict:
  if _BUDGET.value <= 0:
    raise app.UsageError(f"--budget_s={_BUDGET.value:g}: must be positive")
  out_dir = _OUT_DIR.value or os.environ.get("OUT", "")
  if not out_dir:
    raise app.UsageError("--out_dir is required where OUT is not set")
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # The flags that make a row's command: all as given but the suite's own.
  own = ("--rows", "--out_dir", "--budget_s", "--variants")
  return make_settings(
      out_dir, tiny=_TINY.value, steps=_STEPS.value, warmup=_WARMUP.value,
      profile_steps=_PROFILE_STEPS.value, peer_python=_PEER_PYTHON.value,
      budget_s=_BUDGET.value, variants=_VARIANTS.value, sets=parse_sets(_SET.value),
      profile_rows=set(_PROFILE_ROWS.value), peak_tflops=_PEAK.value,
      bytes_limit_gib=_BYTES_LIMIT.value, compile_box_s=_COMPILE_BOX.value,
      steps_box_s=_STEPS_BOX.value, argv=sys.argv,
      argv_flags=[a for a in sys.argv[1:] if not a.startswith(own)])


def main(argv):
  settings = settings_from_flags(argv)
  plan = plan_from_flags()
  os.makedirs(settings["out_dir"], exist_ok=True)
  done = run_rows(settings, plan)
  if not settings["variants"]:
    for row_id, row in ROWS.items():
      if row_id not in done:
        done[row_id] = {**skipped(f"not in --rows={','.join(r for r, _ in plan)}"),
                        **describe(row_id, row, settings, done)}
  write_reports(settings, done)
  with open(os.path.join(settings["out_dir"], "device_suite.md"), encoding="utf-8") as f:
    print(f.read())
  print(f"wrote {settings['out_dir']}/: device_suite.json, device_suite.md, "
        "profile_summary.md, rows.log and (where a row was profiled) traces.tar.gz")


if __name__ == "__main__":
  app.run(main)
