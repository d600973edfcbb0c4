"""The device suite's reports: its table, the peer's figures, the variants' deltas.

bertjax/benchmarks/device_suite.py writes them after every row (and every
phase a row enters) from the rows' results: device_suite.md from `markdown`
and profile_summary.md from `profile_markdown`, both over the rows as
`with_peer_figures` completes them (the peer's MFU and the bertjax / peer
ratios, which need rows of both sides).
"""

import time

from bertjax.benchmarks import trace_summary


def _fmt(x, spec=",.0f", none="n/a"):
  return none if x is None else format(x, spec)


def parts(r: dict) -> list[tuple[str, dict]]:
  """(label, figures) of each measurement of an ok (or stopped) row."""
  if r.get("parts"):
    return [(name, r[name]) for name in r["parts"] if name in r]
  return [("", r)] if "step_ms" in r else []


def _twin_flops(rows: list[dict], r: dict) -> tuple[float, float] | None:
  """(model FLOPs per sequence, peak TFLOP/s) from a bertjax row of r's config and length."""
  for t in rows:
    if (t["side"] == "bertjax" and t.get("model_flops_per_sequence") and t.get("peak_tflops")
        and (t["config"], t["phase"]) == (r["config"], r["phase"])):
      return t["model_flops_per_sequence"], t["peak_tflops"]
  return None


def with_peer_figures(rows: list[dict]) -> list[dict]:
  """The rows with the peer's MFU (from the same FLOP count as bertjax's) and
  each unpacked bertjax row's ratios to the peer at the same config, length
  and batch ("over_peer": {"compiled": x, "eager": y})."""
  out = [dict(r) for r in rows]
  peers = [r for r in out if r["side"] == "peer"]
  for r in peers:
    twin = _twin_flops(out, r)
    for name, m in parts(r):
      r[name] = {**m, "mfu": twin and twin[0] * m["sequences_per_s"] / (twin[1] * 1e12),
                 "peak_tflops": twin and twin[1]}
  for r in out:
    if r["side"] != "bertjax" or "step_ms" not in r:
      continue
    ratios = {}
    for p in peers:
      for name, m in parts(p):
        if (p["config"], p["phase"], m["examples"]) == (r["config"], r["phase"], r["examples"]):
          ratios[name] = r["sequences_per_s"] / m["sequences_per_s"]
    if ratios:
      r["over_peer"] = ratios
  return out


def _status_cell(r: dict) -> str:
  if r["status"] == "running":
    since = time.time() - r.get("process_phase_since", time.time())
    return f"running: in {r.get('process_phase', 'start')} for {since:.0f} s"
  if r["status"] == "ok":
    return "ok"
  why = (r.get("reason") or r.get("error") or "no reason recorded").strip().split("\n")[0]
  return f"{r['status']}: {why}".replace("|", "/")


def _line(r: dict, label: str, m: dict | None) -> str:
  """A table line: a measured part of a row (`m`: its figures), or the row's status."""
  row = f"{r['row']} {label}".strip()
  who = f"{r['side']} {label}".strip() if r["side"] == "peer" else "bertjax"
  if m is None:
    return (f"| {row} | {who} | {r['config']} | {r['phase']} | {r['batch']} | "
            f"{_status_cell(r)} | | | | | | | | `{r['command']}` |")
  batch = f"{m['examples']}"
  if m["rows"] != m["examples"]:
    batch += f" in {m['rows']} packed rows"
  if m.get("grad_accum_steps", 1) > 1:
    batch += f", {m['grad_accum_steps']} micro-batches"
  step = m["step_ms"]
  mfu = None if m.get("mfu") is None else 100 * m["mfu"]
  ratio = r.get("over_peer", {}) if not label else {}
  return (f"| {row} | {who} | {r['config']} | {r['phase']} | {batch} | ok | "
          f"{_fmt(m['sequences_per_s'])} | {_fmt(m['real_tokens_per_s'])} | "
          f"{step['median']:.1f} ({step['min']:.1f}-{step['max']:.1f}) | "
          f"{_fmt(mfu, '.1f')}{'%' if mfu is not None else ''} | {m['attention_kernel']} | "
          f"{_fmt(ratio.get('compiled'), '.2f', '')} | {_fmt(ratio.get('eager'), '.2f', '')} | "
          f"`{r['command']}` |")


TABLE_HEAD = ("| row | side | config | phase | batch (examples) | status | sequences/s | "
              "real tokens/s | step ms, median (range) | MFU | attention | bertjax / peer "
              "compiled | bertjax / peer eager | command |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

PEER_NOTE = (
    "The peer: transformers' BertForPreTraining in PyTorch (bertjax/benchmarks/peer_row.py) "
    "with SDPA attention (its fused kernels keep the dropout), bf16 autocast over fp32 "
    "parameters where the config computes in bf16, fused AdamW at the config's learning rate and weight decay and no gradient "
    "clipping (bertjax clips at global norm 1.0), the same dropout and the same synthetic "
    "batch; eager, then torch.compile(model) (default mode) in the same process. Its "
    "masked-LM head scores every position (labels -100 elsewhere): the decoder over the "
    "whole vocab runs at all L positions where bertjax's runs at the P masked ones (20 at "
    "128, 80 at 512), so the peer does more work than its MFU counts. Both sides' MFU counts "
    "bertjax's analytic model FLOPs of the task (bertjax/train/flops.py, as the bertjax row "
    "of the same config and length reports them). The ratios are bertjax's sequences/s over "
    "the peer's at the same config, length and batch.")


def markdown(rows: list[dict], *, budget_s: float, elapsed_s: float, tiny: bool,
             variants: str) -> str:
  """device_suite.md: the table of every row's measurements (with `variants`,
  the variants' deltas first) and notes."""
  ran = [r for r in rows if r.get("device_kind")]
  device = "; ".join(sorted({f"{r['side']}: {r['devices']} x {r['device_kind']} "
                             f"({r['platform']}), "
                             f"{r.get('framework') or 'jax ' + r.get('jax_version', '?')}"
                             for r in ran})) or "no row ran"
  lines = ["# Device suite", "",
           f"Device: {device}. Budget {budget_s:g} s; the rows took "
           f"{elapsed_s:.0f} s.{' Tiny model (--tiny).' if tiny else ''}", ""]
  if variants:
    lines += variants_markdown(rows, variants)
  lines += [TABLE_HEAD]
  notes = []
  for r in rows:
    measured = parts(r)
    if not measured:
      lines.append(_line(r, "", None))
    for label, m in measured:
      lines.append(_line(r, label, m))
    if r["status"] != "ok" and measured:  # Stopped or failed after measuring a part.
      lines.append(_line(r, "(rest)", None))
    if r.get("packed_over_unpacked"):
      p = r["packing"]
      notes.append(f"{r['row']}: packed / unpacked real tokens/s "
                   f"{r['packed_over_unpacked']:.2f}; real tokens "
                   f"{100 * p['real_token_share']['unpacked']:.0f}% of the slots unpacked, "
                   f"{100 * p['real_token_share']['packed']:.0f}% packed; "
                   f"{p['examples_left_out']} examples fit in no packed row.")
    if r.get("batch_tries"):
      notes.append(f"{r['row']}: did not fit at " + "; ".join(
          f"batch {t['batch']} ({t['error']})" for t in r["batch_tries"]) + ".")
    if r.get("innermost"):
      notes.append(f"{r['row']}: stopped; innermost frames: " + " < ".join(r["innermost"]))
  peaks = sorted({m["peak_tflops"] for r in rows for _, m in parts(r) if m.get("peak_tflops")})
  lines += [""] + notes + [
      "", f"MFU: analytic model FLOPs over {', '.join(f'{p:g}' for p in peaks) or 'no known'} "
      "TFLOP/s per chip (bf16 peak of the device kind, or --peak_tflops). Step times are "
      "per step, each step waited for; sequences/s and tokens/s use the median. The "
      "attention column is what model.attention_impl resolves to for training on this "
      "device (bertjax/model/attention.py: choose); sdpa is PyTorch's."]
  if any(r["side"] == "peer" and parts(r) for r in rows):
    lines += ["", PEER_NOTE]
  return "\n".join(lines) + "\n"


def variants_markdown(rows: list[dict], row_id: str) -> list[str]:
  """The table of row_id's variants: each one's step time against the row's."""
  base = next(r for r in rows if r["row"] == row_id)
  ref = base.get("step_ms", {}).get("median") if base["status"] == "ok" else None
  lines = [f"## Variants of {base['row']} ({base['title']})", "",
           "| variant | change | status | sequences/s | step ms, median (range) | MFU | "
           "attention | step ms - the row's | step time / the row's |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in [base] + [r for r in rows if r.get("variant")]:
    label, change = (r["variant"], f"`{r['change']}`") if r.get("variant") else ("the row", "")
    if r["status"] != "ok":
      lines.append(f"| {label} | {change} | {_status_cell(r)} | | | | | | |")
      continue
    step = r["step_ms"]
    mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    delta = ratio = ""
    if ref and r is not base:
      delta, ratio = f"{step['median'] - ref:+.1f}", f"{step['median'] / ref:.3f}"
    lines.append(f"| {label} | {change} | ok | {_fmt(r['sequences_per_s'])} | "
                 f"{step['median']:.1f} ({step['min']:.1f}-{step['max']:.1f}) | {mfu} | "
                 f"{r['attention_kernel']} | {delta} | {ratio} |")
  return lines + ["", "All the rows:", ""]


def profile_markdown(rows: list[dict]) -> str:
  """profile_summary.md: each profiled row's milliseconds per step by category."""
  parts_ = ["# Profile summary", "",
            "Milliseconds per traced step by category (bertjax/benchmarks/trace_summary.py); "
            "'busy' adds up each op's own time, which exceeds the wall time where ops run at "
            "once.", ""]
  for r in rows:
    if r.get("profile"):
      title = f"{r['row']}: {r['title']} (timed median {r['step_ms']['median']:.2f} ms)"
      parts_.append(trace_summary.markdown(r["profile"], title))
    elif r.get("profile_skipped") or r.get("profile_error"):
      why = r.get("profile_skipped") or r["profile_error"]
      parts_.append(f"### {r['row']}: no profile ({why})\n")
  return "\n".join(parts_)
