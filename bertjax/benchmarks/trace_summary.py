"""Where a train step's time goes: a jax.profiler trace, split into categories.

  python -m bertjax.benchmarks.trace_summary --trace=perfetto_trace.json.gz \
      [--hlo=hlo.txt.gz] [--steps=3]

reads a trace that `jax.profiler.trace(..., create_perfetto_trace=True)`
wrote (plain JSON trace events, gzipped) and, optionally, the text of the
compiled train step (`compiled.as_text()`), and prints a markdown table of
milliseconds per step by category. bertjax/benchmarks/device_row.py runs
it on the rows that the device suite profiles.

The ops: on a GPU (or TPU) the kernels on the device's stream lines (a
trace's derived lines, such as "XLA Ops", repeat them and are left out); on
the CPU, XLA's thunks, the host events that name an `hlo_op`. Ops nest on
the CPU (a `while` thunk holds its body's): each instant of a line goes to
the innermost op running there. Several lines run at once (CPU threads,
GPU streams): each instant of the step is shared equally among the ops
running then, and instants with none go to `idle`, so the categories add
up to the traced step time. A step is an "XLA Modules" event of the train
step where the trace has that line, else the span of one execution's ops
(their `run_id`), else the whole trace over `steps`.

Each op gets a category from what it computes (`categorise`): its HLO
instruction, and for a fusion the instructions fused into it, by opcode,
custom-call target and the Python functions that traced them (the stack
frames XLA keeps in the program's text), else by the kernel's name.
"""

import argparse
import collections
import dataclasses
import gzip
import json
import os
import re
from typing import Iterable, Mapping

MATMUL = "matmul"
ATTENTION = "attention"
DROPOUT = "dropout_mask"
ELEMENTWISE = "elementwise"
GATHER = "gather_scatter"
COPY = "copy"
OPTIMIZER = "optimizer"
COLLECTIVE = "collective"
OTHER = "other"
IDLE = "idle"

CATEGORIES = {  # In table order.
    MATMUL: "matrix products outside attention (projections, feed-forward, masked-LM decoder)",
    ATTENTION: "attention: a fused kernel, or XLA attention's products, softmax and masking",
    DROPOUT: "drawing dropout keep-masks (fusions with the hash), with what XLA fused into them",
    ELEMENTWISE: "elementwise and reduction fusions: LayerNorm, GELU, bias, dropout applied, "
                 "losses",
    GATHER: "gathers and scatters: embedding lookups and their gradients, masked positions",
    COPY: "copies, transposes, fills and memcpy",
    OPTIMIZER: "the optimizer update: gradient clipping, Adam, weight decay, the finite check",
    COLLECTIVE: "collectives (NCCL, all-reduce and the like)",
    OTHER: "other: loop control, unrecognised kernels",
    IDLE: "no op running (launch gaps, host work, waiting)",
}

_COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
                   "all-to-all", "collective-broadcast", "send", "recv")
_MOVE_OPS = frozenset((
    "copy", "transpose", "bitcast", "reshape", "broadcast", "slice", "dynamic-slice",
    "dynamic-update-slice", "concatenate", "pad", "parameter", "constant", "tuple",
    "get-tuple-element", "reverse", "copy-start", "copy-done", "bitcast-convert"))
_CONTROL_OPS = frozenset(("while", "call", "conditional"))
_GEMM_TARGET = re.compile(r"gemm|matmul|cublas", re.I)
_FUSED_ATTENTION_TARGET = re.compile(r"fmha|flash|attention", re.I)
_RNG = frozenset(("rng", "rng-bit-generator", "rng-get-and-update-state"))
# The threefry hash's operations: a fusion of dropout's code without them only
# compares or applies a mask, and goes where the code around it says.
_HASH = frozenset(("xor", "shift-left", "shift-right-logical"))
# Kernel names, for ops the program's text does not explain (most specific first).
_NAME_RULES = (
    (re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter", re.I), COLLECTIVE),
    (re.compile(r"^(memcpy|memset|copy)|memcpy|memset|^transpose", re.I), COPY),
    (re.compile(r"fmha|flash|sdpa|attention|\bmha", re.I), ATTENTION),
    (re.compile(r"gemm|gemv|matmul|cublas|cutlass|nvjet|xmma|wgmma|hmma|^dot", re.I), MATMUL),
    (re.compile(r"threefry|philox|rng", re.I), DROPOUT),
    (re.compile(r"scatter|gather", re.I), GATHER),
    (re.compile(r"fusion|reduce|elementwise", re.I), ELEMENTWISE),
)
_DEVICE = re.compile(r"^/device:|\b[GT]PU\b")  # A trace's device processes, by name.
# Lines of a device's trace that repeat its kernels under other names.
_DERIVED_LINE = re.compile(r"XLA Ops|XLA Modules|XLA TraceMe|Framework|TensorFlow|Source|"
                           r"Steps|Name Scope|Launch", re.I)


@dataclasses.dataclass(frozen=True)
class OpInfo:
  """What one HLO instruction computes, with the instructions fused into it."""
  opcodes: frozenset = frozenset()
  targets: frozenset = frozenset()  # custom-call targets
  markers: frozenset = frozenset()  # categories named by the source that traced them


def frame_marker(path: str, function: str) -> str | None:
  """The category a stack frame's source file and function name, or None
  (look further out). Dropout's keep-mask functions mark the hash; applying
  a mask is left to the code around it (attention, or an elementwise
  fusion)."""
  base = os.path.basename(path)
  if "/optax/" in path or (base == "optimizer.py" and "/train/" in path) or (
      base == "step.py" and function.startswith("apply_gradients")):
    return OPTIMIZER
  if base == "dropout.py":
    return None if "apply" in function or function == "Dropout.__call__" else DROPOUT
  if base in ("attention.py", "flash_gpu.py", "flash_tpu.py"):
    return ATTENTION
  return None


def _table(text: str, name: str) -> dict[int, str]:
  m = re.search(rf"^{name}\n(.*?)(?:\n\n|\Z)", text, re.S | re.M)
  rows = {}
  for line in (m.group(1).splitlines() if m else ()):
    key, _, value = line.partition(" ")
    if key.isdigit():
      rows[int(key)] = value
  return rows


def _frames(text: str) -> dict[int, list[tuple[str, str]]]:
  """stack_frame_id -> [(file, function)], innermost first, from the program's tables."""
  files = {k: v.strip('"') for k, v in _table(text, "FileNames").items()}
  functions = {k: v.strip('"') for k, v in _table(text, "FunctionNames").items()}
  fields = lambda v: {a: int(b) for a, b in re.findall(r"(\w+)=(-?\d+)", v)}
  locations = {}
  for k, v in _table(text, "FileLocations").items():
    f = fields(v)
    locations[k] = (files.get(f.get("file_name_id"), ""),
                    functions.get(f.get("function_name_id"), ""))
  raw = {k: fields(v) for k, v in _table(text, "StackFrames").items()}
  # XLA prints parent_frame_id one above the parent's id (0: none), so a frame
  # whose parent is the frame before it names itself; without such a frame
  # the ids are taken as they are.
  shift = 1 if any(f.get("parent_frame_id") == k for k, f in raw.items()) else 0
  stacks = {}
  for k in raw:
    stack, seen, frame = [], set(), k
    while frame in raw and frame not in seen:
      seen.add(frame)
      stack.append(locations.get(raw[frame].get("file_location_id"), ("", "")))
      frame = raw[frame].get("parent_frame_id", 0) - shift
    stacks[k] = stack
  return stacks


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_OPCODE = re.compile(r"\s*\S*\s+([a-z][\w\-]*)\(")  # After the shape.


def _opcode(rest: str) -> str:
  """The opcode of an instruction's right-hand side `SHAPE opcode(operands), ...`."""
  i = 0
  if rest.startswith("("):  # A tuple shape.
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        break
  m = _OPCODE.match(rest, i + 1 if i else 0)
  return m.group(1) if m else ""


def parse_hlo(text: str) -> dict[str, OpInfo]:
  """instruction name -> OpInfo for every instruction of an HLO module's text;
  a fusion's holds its fused computation's instructions too."""
  stacks = _frames(text)
  own: dict[str, tuple[str, str, str, str | None]] = {}  # name -> (opcode, target, calls, marker)
  members: dict[str, list[str]] = collections.defaultdict(list)  # computation -> instructions
  computation = ""
  for line in text.splitlines():
    m = _INSTRUCTION.match(line)
    if m is None:
      c = _COMPUTATION.match(line)
      if c:
        computation = c.group(1)
      continue
    name, rest = m.groups()
    target = re.search(r'custom_call_target="([^"]*)"', rest)
    calls = re.search(r"\bcalls=%?([\w.\-]+)", rest)
    frame = re.search(r"\bstack_frame_id=(\d+)", rest)
    source = re.search(r'\bsource_file="([^"]*)"', rest)
    stack = stacks.get(int(frame.group(1)), []) if frame else (
        [(source.group(1), "")] if source else [])
    marker = next((k for k in (frame_marker(f, fn) for f, fn in stack) if k), None)
    own[name] = (_opcode(rest), target.group(1) if target else "",
                 calls.group(1) if calls else "", marker)
    members[computation].append(name)

  def fused(name: str, depth: int = 0) -> list[str]:
    opcode, _, calls, _ = own[name]
    if opcode != "fusion" or not calls or depth > 8:
      return [name]
    return [name] + [n for member in members.get(calls, []) for n in fused(member, depth + 1)]

  infos = {}
  for name in own:
    parts = [own[n] for n in fused(name)]
    infos[name] = OpInfo(frozenset(p[0] for p in parts), frozenset(p[1] for p in parts if p[1]),
                         frozenset(p[3] for p in parts if p[3]))
  return infos


def categorise(kernel_name: str, info: OpInfo | None) -> str:
  """The category of one op: from its OpInfo where the program's text has
  it, else from the kernel's name (see the module docstring)."""
  if info is None or not info.opcodes:
    return next((cat for rule, cat in _NAME_RULES if rule.search(kernel_name)), OTHER)
  ops, targets, markers = info.opcodes, info.targets, info.markers
  if any(op.startswith(_COLLECTIVE_OPS) for op in ops):
    return COLLECTIVE
  if any(_FUSED_ATTENTION_TARGET.search(t) for t in targets):
    return ATTENTION
  if {"dot", "convolution"} & ops or any(_GEMM_TARGET.search(t) for t in targets):
    return ATTENTION if ATTENTION in markers else MATMUL
  if (DROPOUT in markers and _HASH & ops) or _RNG & ops or any("threefry" in t for t in targets):
    return DROPOUT
  for marked in (ATTENTION, OPTIMIZER):
    if marked in markers:
      return marked
  if {"scatter", "gather"} & ops:
    return GATHER
  inside = ops - {"fusion"}
  if inside <= _CONTROL_OPS:
    return OTHER
  if inside <= _MOVE_OPS:
    return COPY
  return ELEMENTWISE


@dataclasses.dataclass(frozen=True)
class Op:
  """One op event: its line, span (microseconds), kernel name and HLO op name."""
  line: tuple
  start: float
  end: float
  name: str
  hlo_op: str


def _names(events: Iterable[Mapping]) -> tuple[dict, dict]:
  processes, threads = {}, {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") == "process_name":
      processes[e.get("pid")] = str(e.get("args", {}).get("name", ""))
    elif e.get("ph") == "M" and e.get("name") == "thread_name":
      threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
  return processes, threads


def _module_matches(e: Mapping, module: str) -> bool:
  named = e.get("args", {}).get("hlo_module")
  return not module or named is None or module in str(named)


def select_ops(events: list[Mapping], module: str = "") -> tuple[list[Op], list, str]:
  """(ops, step windows [(start, end)], what the ops are) of a trace's events.

  Device kernels where the trace has a device (processes named "/device:..."
  or naming a GPU or TPU: their stream lines, or every line but the derived
  ones where none is named "Stream"); else the host's XLA thunks (events with
  an `hlo_op`).
  `module` keeps ops (and "XLA Modules" windows) of modules whose name
  contains it.
  """
  processes, threads = _names(events)
  complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
  devices = {p for p, n in processes.items() if _DEVICE.search(n)}
  on_device = [e for e in complete if e.get("pid") in devices]
  if on_device:
    lines = {(e["pid"], e.get("tid")) for e in on_device}
    named = lambda k: threads.get(k, "")
    streams = {k for k in lines if named(k).startswith("Stream")}
    keep = streams or {k for k in lines if not _DERIVED_LINE.search(named(k))}
    chosen = [e for e in on_device if (e["pid"], e.get("tid")) in keep]
    what = "device kernels"
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in on_device
                     if named((e["pid"], e.get("tid"))) == "XLA Modules"
                     and (not module or module in e.get("name", "")))
  else:
    chosen = [e for e in complete if "hlo_op" in e.get("args", {})]
    what, windows = "XLA thunks on the host", []
  chosen = [e for e in chosen if _module_matches(e, module)]
  ops = [Op((e.get("pid"), e.get("tid")), float(e["ts"]), float(e["ts"]) + float(e["dur"]),
            str(e.get("name", "")), str(e.get("args", {}).get("hlo_op", "")))
         for e in chosen]
  if not windows:
    runs = collections.defaultdict(list)
    for e, op in zip(chosen, ops):
      run = e.get("args", {}).get("run_id")
      if run is not None:
        runs[run].append(op)
    if runs and sum(map(len, runs.values())) == len(ops):
      windows = sorted((min(o.start for o in r), max(o.end for o in r)) for r in runs.values())
  return ops, windows, what


def innermost_segments(ops: list[Op]) -> list[tuple[float, float, Op]]:
  """Each line's time as (start, end, op) pieces, each instant going to the
  innermost op running on that line (a parent keeps the time its children
  leave)."""
  pieces = []
  by_line = collections.defaultdict(list)
  for op in ops:
    by_line[op.line].append(op)
  for line_ops in by_line.values():
    line_ops.sort(key=lambda o: (o.start, -o.end))
    stack: list[Op] = []
    cursor = 0.0  # Where the line's time is attributed up to.
    for op in line_ops + [None]:
      at = float("inf") if op is None else op.start
      while stack and stack[-1].end <= at:
        top = stack.pop()
        if top.end > cursor:
          pieces.append((cursor, top.end, top))
          cursor = top.end
      if op is None:
        break
      if stack and op.start > cursor:
        pieces.append((cursor, op.start, stack[-1]))
      cursor = max(cursor, op.start)
      end = min(op.end, stack[-1].end) if stack else op.end
      stack.append(dataclasses.replace(op, end=end))
  return pieces


def _share(pieces, windows) -> tuple[dict, dict, float]:
  """Wall time per category and per op name over `windows`, each instant
  shared equally among the pieces running then; and the windows' total."""
  by_cat = collections.Counter()
  by_op = collections.Counter()
  total = 0.0
  for w0, w1 in windows:
    total += w1 - w0
    edges = []
    for start, end, key in pieces:
      s, e = max(start, w0), min(end, w1)
      if e > s:
        edges += [(s, 1, key), (e, -1, key)]
    edges.sort(key=lambda x: (x[0], x[1]))
    active = collections.Counter()
    last = w0
    for t, delta, key in edges:
      if t > last:
        n = sum(active.values())
        if n == 0:
          by_cat[IDLE] += t - last
        for k, c in active.items():
          by_cat[k[0]] += (t - last) * c / n
          by_op[k] += (t - last) * c / n
        last = t
      active[key] += delta
      if active[key] == 0:
        del active[key]
    if w1 > last:
      by_cat[IDLE] += w1 - last
  return by_cat, by_op, total


def summarise(events: list[Mapping], ops_info: Mapping[str, OpInfo], steps: int,
              module: str = "train_step", top: int = 12) -> dict:
  """Milliseconds per step by category (see the module docstring) of a trace's
  events; `steps` is how many steps the trace holds, used where it shows no
  step boundaries. Raises ValueError where the trace has no ops."""
  ops, windows, what = select_ops(events, module)
  if not ops:
    raise ValueError(f"the trace holds no ops of a module named like {module!r}")
  if windows:
    steps, how = len(windows), "one window per step"
  else:
    windows, how = [(min(o.start for o in ops), max(o.end for o in ops))], "the whole trace"
  category = {}
  pieces = []
  for start, end, op in innermost_segments(ops):
    if op.name not in category:
      category[op.name] = categorise(op.name, ops_info.get(op.hlo_op))
    pieces.append((start, end, (category[op.name], op.hlo_op or op.name)))
  busy = collections.Counter()
  for start, end, key in pieces:
    busy[key[0]] += end - start
  wall, per_op, total = _share(pieces, windows)
  ms = lambda us: us / 1e3 / steps
  step_ms = ms(total)
  rows = [{"category": c, "ms": ms(wall.get(c, 0.0)), "busy_ms": ms(busy.get(c, 0.0)),
           "percent": 100 * wall.get(c, 0.0) / total if total else 0.0}
          for c in CATEGORIES]
  heaviest = [{"op": name, "category": cat, "ms": ms(t)}
              for (cat, name), t in per_op.most_common(top)]
  return {"steps": steps, "step_ms": step_ms, "ops": what, "windows": how,
          "categories": rows, "top_ops": heaviest,
          "explained_ops": sum(1 for o in ops if o.hlo_op in ops_info), "op_events": len(ops)}


def markdown(summary: dict, title: str) -> str:
  """The summary as a markdown section: the category table, then the heaviest ops."""
  s = summary
  lines = [f"### {title}", "",
           f"{s['steps']} traced steps ({s['windows']}; {s['ops']}, {s['op_events']} op "
           f"events, {s['explained_ops']} found in the compiled program): "
           f"{s['step_ms']:.2f} ms per step.", "",
           "| category | ms per step | share | busy ms per step | what |",
           "|---|---|---|---|---|"]
  for r in s["categories"]:
    lines.append(f"| {r['category']} | {r['ms']:.3f} | {r['percent']:.1f}% | "
                 f"{r['busy_ms']:.3f} | {CATEGORIES[r['category']]} |")
  lines += ["", "| heaviest ops | category | ms per step |", "|---|---|---|"]
  lines += [f"| `{o['op']}` | {o['category']} | {o['ms']:.3f} |" for o in s["top_ops"]]
  return "\n".join(lines) + "\n"


def read_text(path: str) -> str:
  """A file's text, gunzipped where its name ends in .gz."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return f.read()


def load_events(path: str) -> list[dict]:
  """The trace events of a (gzipped) JSON trace file."""
  trace = json.loads(read_text(path))
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--trace", required=True, help="perfetto_trace.json.gz (or .json)")
  parser.add_argument("--hlo", default="", help="The compiled step's text (.txt or .txt.gz).")
  parser.add_argument("--steps", type=int, default=1,
                      help="Steps in the trace, where it shows no step boundaries.")
  parser.add_argument("--module", default="train_step",
                      help="Keep the ops of modules whose name contains this.")
  args = parser.parse_args()
  infos = parse_hlo(read_text(args.hlo)) if args.hlo else {}
  print(markdown(summarise(load_events(args.trace), infos, args.steps, args.module),
                 os.path.basename(args.trace)))


if __name__ == "__main__":
  main()
