"""The TPU compiler's own cost estimate of a compiled program, summed.

A program compiled for a TPU (on any host, ahead of time, through libtpu)
carries the compiler's cost model in its text: each scheduled fusion, copy,
convert or other top-level instruction has an `estimated_cycles` in its
backend_config. `program_cost` sums them over the program as it runs: the
body of a while loop (the scanned layers, forward and backward) times its
trip count, the largest branch of a conditional, called computations once.
What the compiler does not price is kept apart: Pallas (Mosaic) kernels,
`tpu_custom_call`s, which mosaic_cost.py prices from their own operation
counts; collectives, counted in bytes; and async copies and slices, which
overlap the compute they sit beside.

The figures are the compiler's estimate, not a measurement.
"""

import collections
import dataclasses
import functools
import re

_HEADER = re.compile(r"^(ENTRY )?%([^\s(]+) \(.*\{\s*$")
_NAME = re.compile(r"^\s*(?:ROOT )?%([^\s=]+) = ")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_ATTR = re.compile(r"\b(calls|body|condition|to_apply)=%([^\s,)}]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_DIRECTION = re.compile(r"direction=([A-Z]+)")
_INDEX = re.compile(r"\bindex=(\d+)")
_CONSTANT = re.compile(r"constant\((-?\d+)\)")
_ARRAY = re.compile(r"\b(pred|[subf]\d+|bf16|f8e\w+)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
          "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}

# Collectives: the compiler gives them no cycles; their bytes are counted.
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute")
# Free, or overlapping the compute beside them (async copies and slices).
_UNPRICED = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant",
             "partition-id", "replica-id", "after-all", "copy-start", "copy-done",
             "slice-start", "slice-done", "opt-barrier", "while", "conditional", "call",
             "custom-call", "fusion"}


@dataclasses.dataclass
class Instruction:
  name: str
  opcode: str
  line: str
  cycles: int | None
  op_name: str

  @property
  def operands(self) -> list[str]:
    start = self.line.index(f"{self.opcode}(") + len(self.opcode) + 1
    depth, end = 1, start
    while depth and end < len(self.line):
      depth += {"(": 1, ")": -1}.get(self.line[end], 0)
      end += 1
    return re.findall(r"%([^\s,)]+)", self.line[start:end - 1])

  def attr(self, key: str) -> str | None:
    for k, v in _ATTR.findall(self.line):
      if k == key:
        return v
    return None

  @property
  def result_bytes(self) -> int:
    head = self.line[:self.line.index(f" {self.opcode}(")]
    return sum(_BYTES.get(t, 4) * _product(dims) for t, dims in _ARRAY.findall(head))


def _product(dims: str) -> int:
  n = 1
  for d in filter(None, dims.split(",")):
    n *= int(d)
  return n


def _opcode(line: str) -> str:
  """The opcode after `%name = TYPE `, TYPE possibly a nested tuple."""
  rest = line[_NAME.match(line).end():]
  if rest.startswith("("):
    depth, i = 0, 0
    for i, ch in enumerate(rest):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        break
    rest = rest[i + 1:]
  else:
    rest = rest[rest.index(" "):] if " " in rest else ""
  m = _OPCODE.match(rest)
  return m.group(1) if m else ""


def parse(text: str) -> tuple[dict[str, dict[str, Instruction]], str]:
  """({computation: {instruction name: Instruction}}, the entry computation's name)."""
  computations, entry, current = {}, "", None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = computations.setdefault(header.group(2), {})
      if header.group(1):
        entry = header.group(2)
      continue
    if line.rstrip() == "}":  # (A kernel's backend_config may span lines starting "}}".)
      current = None
      continue
    name = _NAME.match(line)
    if current is None or not name:
      continue
    cycles = _CYCLES.search(line)
    op_name = _OP_NAME.search(line)
    current[name.group(1)] = Instruction(
        name.group(1), _opcode(line), line, int(cycles.group(1)) if cycles else None,
        op_name.group(1) if op_name else "")
  if not entry:
    raise ValueError("no ENTRY computation in the program text")
  return computations, entry


def trip_count(loop: Instruction, computations) -> int | None:
  """A while loop's iterations: the compiler's known_trip_count, else read off
  a condition `counter < N` on a counter that starts at a constant."""
  known = _TRIP.search(loop.line)
  if known:
    return int(known.group(1))
  condition = computations.get(loop.attr("condition") or "", {})
  root = next((i for i in condition.values() if i.line.lstrip().startswith("ROOT")), None)
  if root is None or root.opcode != "compare":
    return None
  direction = _DIRECTION.search(root.line)
  operands = [condition.get(o) for o in root.operands]
  if direction is None or None in operands or len(operands) != 2:
    return None
  counter, bound = operands
  if counter.opcode == "constant":
    counter, bound = bound, counter
  limit = _CONSTANT.search(bound.line)
  index = _INDEX.search(counter.line)
  if counter.opcode != "get-tuple-element" or not limit or not index:
    return None
  start = 0
  parent_name = loop.operands[0] if loop.operands else ""
  # The loop's initial tuple: element `index`, if a constant, is the start.
  for comp in computations.values():
    init = comp.get(parent_name)
    if init is not None and init.opcode == "tuple":
      elements = init.operands
      value = comp.get(elements[int(index.group(1))]) if int(index.group(1)) < len(elements) \
          else None
      if value is not None and value.opcode == "constant":
        start = int(_CONSTANT.search(value.line).group(1))
      break
  n = int(limit.group(1)) - start
  return n + 1 if direction.group(1) == "LE" else n if direction.group(1) == "LT" else None


@dataclasses.dataclass
class ProgramCost:
  """What the compiler's estimate says of one run of a program (per device)."""
  cycles: int = 0  # Priced instructions, loops times their trips.
  loop_cycles: int = 0  # The part inside while loops.
  # (instruction, op_name) -> cycles, over the program (loops times their trips).
  items: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  outside_loops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  # Pallas kernels by name -> calls per run, and the bytes of a call's
  # operands and results.
  kernels: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  kernel_bytes: dict = dataclasses.field(default_factory=dict)
  collective_bytes: int = 0
  collectives: int = 0
  unpriced: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  unknown_trips: int = 0


def kernel_name(instruction: Instruction) -> str:
  """A Pallas call's kernel name: its instruction's name without the suffix."""
  return instruction.name.rsplit(".", 1)[0]


def program_cost(text: str) -> ProgramCost:
  """Sums the compiler's estimated cycles over a compiled program's text."""
  computations, entry = parse(text)
  cost = ProgramCost()

  def walk(name: str, times: int, in_loop: bool, depth: int = 0):
    if depth > 64:
      raise ValueError(f"computation nesting deeper than 64 at {name}")
    for ins in computations.get(name, {}).values():
      instruction_bytes_here = functools.partial(instruction_bytes, computations, name)
      if ins.opcode == "while":
        trips = trip_count(ins, computations)
        if trips is None:
          cost.unknown_trips += 1
          trips = 1
        walk(ins.attr("body"), times * trips, True, depth + 1)
        continue
      if ins.opcode == "conditional":
        branches = _BRANCHES.search(ins.line)
        names = re.findall(r"%([^\s,]+)", branches.group(1)) if branches else []
        priced = [(_computation_cycles(b, computations), b) for b in names]
        if priced:
          walk(max(priced)[1], times, in_loop, depth + 1)
        continue
      if ins.opcode == "call":
        walk(ins.attr("to_apply"), times, in_loop, depth + 1)
        continue
      if ins.opcode == "custom-call" and _TARGET.search(ins.line) and \
          _TARGET.search(ins.line).group(1) == "tpu_custom_call":
        cost.kernels[kernel_name(ins)] += times
        cost.kernel_bytes[kernel_name(ins)] = ins.result_bytes + sum(
            instruction_bytes_here(o) for o in ins.operands)
        continue
      base = ins.opcode.removesuffix("-start").removesuffix("-done")
      if base in COLLECTIVES:
        if not ins.opcode.endswith("-done"):
          cost.collectives += times
          cost.collective_bytes += times * ins.result_bytes
        continue
      if ins.cycles is None:
        if ins.opcode not in _UNPRICED:
          cost.unpriced[ins.opcode] += times
        continue
      cycles = ins.cycles * times
      cost.cycles += cycles
      key = (ins.name, ins.op_name)
      cost.items[key] += cycles
      if in_loop:
        cost.loop_cycles += cycles
      else:
        cost.outside_loops[key] += cycles

  walk(entry, 1, False)
  return cost


def instruction_bytes(computations, computation: str, name: str) -> int:
  """The bytes of instruction `name`'s result in `computation` (0 if unknown)."""
  ins = computations.get(computation, {}).get(name)
  return ins.result_bytes if ins is not None else 0


def _computation_cycles(name: str, computations) -> int:
  return sum(i.cycles or 0 for i in computations.get(name, {}).values())
