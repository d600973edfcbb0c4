"""The bytes a compiled multi-slice TPU program sends over the data-center network (DCN).

libtpu compiles a collective whose replica groups span slices into
host-transfer `send`/`recv` pairs handled by its megascale runtime (frontend
attribute _xla_host_transfer_handler_name="xla_megascale_runtime", with the
collective in _xla_megascale_transfer_type, e.g. ALL_REDUCE); collectives
inside a slice stay all-reduce/all-gather/... over ICI. This module reads
those sends from the optimized program's text (compiled.as_text()): what
each device hands to the DCN per step, each send counted as many times as
the loops around it run.
"""

import dataclasses
import math
import re

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
          "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")
_SEND = re.compile(r"= \((\w+)\[([\d,]*)\]\S*, .*\bsend\(.*_xla_host_transfer_handler_name="
                   r"\"xla_megascale_runtime\"")
_TRANSFER_TYPE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_WHILE = re.compile(r"\bwhile\(.*condition=%([\w.\-]+), body=%([\w.\-]+)")
_CALLS = re.compile(r"(?:to_apply|calls|body|condition|true_computation|false_computation)"
                    r"=%([\w.\-]+)|branch_computations=\{([^}]*)\}")
_TRIP_LIMIT = re.compile(r"%([\w.\-]+) = s32\[\]\S* constant\((\d+)\)")
_COMPARE_LT = re.compile(r"compare\(%[\w.\-]+, %([\w.\-]+)\), direction=LT")


@dataclasses.dataclass
class DcnTraffic:
  """DCN sends of one step, per device."""
  bytes_per_step: int  # Payload bytes sent, each send times the trips of the loops around it.
  sends: int  # Send instructions in the program.
  by_type: dict  # _xla_megascale_transfer_type -> bytes per step.
  uncounted_loops: int  # Loops around sends whose trip count could not be read (counted once).


def _computations(hlo: str) -> dict[str, list[str]]:
  out, name = {}, None
  for line in hlo.splitlines():
    match = _COMPUTATION.match(line)
    if match:
      name = match.group(1)
      out[name] = []
      if line.startswith("ENTRY"):
        out["__entry__"] = [name]
    elif name is not None and line.strip() and line.strip() != "}":
      out[name].append(line)
  return out


def _trip_count(condition: list[str]) -> int | None:
  """N of a `counter < N` loop condition (a counter from 0 by 1, as scans lower); None if not that."""
  limits = dict(m.groups() for line in condition for m in [_TRIP_LIMIT.search(line)] if m)
  for line in condition:
    match = _COMPARE_LT.search(line)
    if match and match.group(1) in limits:
      return int(limits[match.group(1)])
  return None


def dcn_traffic(hlo: str) -> DcnTraffic:
  """The megascale sends of an optimized TPU program's text, per device and step."""
  comps = _computations(hlo)
  entry = comps.pop("__entry__", [None])[0]
  if entry is None:
    raise ValueError("no ENTRY computation in the program text")
  times: dict[str, int] = {}
  uncounted = 0

  def visit(name: str, count: int):
    nonlocal uncounted
    times[name] = times.get(name, 0) + count
    for line in comps.get(name, ()):
      loop = _WHILE.search(line)
      if loop:
        condition, body = loop.groups()
        trips = _trip_count(comps.get(condition, []))
        if trips is None and any(_SEND.search(x) for x in comps.get(body, [])):
          uncounted += 1
        visit(condition, count * ((trips or 1) + 1))
        visit(body, count * (trips or 1))
        continue
      for called, branches in _CALLS.findall(line):
        for c in [called] if called else re.findall(r"%([\w.\-]+)", branches):
          visit(c, count)

  visit(entry, 1)
  total, sends, by_type = 0, 0, {}
  for name, lines in comps.items():
    for line in lines:
      match = _SEND.search(line)
      if not match:
        continue
      dtype, dims = match.groups()
      size = _BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
      kind = (_TRANSFER_TYPE.search(line) or [None, "?"])[1]
      sends += 1
      total += size * times.get(name, 0)
      by_type[kind] = by_type.get(kind, 0) + size * times.get(name, 0)
  return DcnTraffic(total, sends, by_type, uncounted)


def gradient_allreduce_bytes(num_params: int, devices_per_slice: int,
                             bytes_per_value: int = 4) -> int:
  """What each device must send over the DCN per step to all-reduce fp32 gradients across slices.

  With data parallelism across slices, the all-reduce is done
  hierarchically: reduced inside each slice over ICI until every device
  holds 1/devices_per_slice of the gradients, all-reduced across slices
  over the DCN at that size, then gathered inside the slice again. The
  analytic figure beside dcn_traffic's measured one.
  """
  return num_params * bytes_per_value // devices_per_slice
