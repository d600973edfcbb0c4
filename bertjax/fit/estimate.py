"""A train step's time and MFU on a TPU slice by the compiler's own estimate.

`estimate` sums the TPU compiler's estimated cycles over a compiled step
(hlo_cost.py: loop bodies times their trip counts) and adds the Pallas
kernels at their own operation counts (mosaic_cost.py), per device, at the
chip's clock. It is the compiler's cost model, not a measurement: it prices
each fusion and kernel alone, assumes the collectives overlap the compute
(their bytes are shown apart), and leaves out what it cannot see (host
input, launch gaps). It compares programs for the same chip: XLA against
flash attention, dropout schemes, rematerialisation.

A compile writes Mosaic's dumps only when libtpu starts with
`--xla_mosaic_dump_to`: `mosaic_dump_dir()` sets that up before the
first TPU topology is described in the process.
"""

import dataclasses
import glob
import os
import tempfile

from bertjax.fit import hlo_cost
from bertjax.fit import mosaic_cost

# The TensorCore clock of each chip (device_kind), from Google's published
# peak bf16 FLOP/s over the matrix units' FLOPs per cycle.
CLOCK_HZ = {"TPU v4": 1.05e9, "TPU v5 lite": 1.5e9, "TPU v5e": 1.5e9, "TPU v5": 1.75e9,
            "TPU v5p": 1.75e9, "TPU v6 lite": 1.75e9, "TPU v6e": 1.75e9}
_DUMP_FLAG = "--xla_mosaic_dump_to"


def clock_hz(device_kind: str) -> float | None:
  return CLOCK_HZ.get(device_kind)


def mosaic_dump_dir() -> str:
  """A directory libtpu writes Mosaic's kernel dumps to (LIBTPU_INIT_ARGS), set
  once per process before libtpu starts; the existing one when already set."""
  args = os.environ.get("LIBTPU_INIT_ARGS", "")
  for arg in args.split():
    if arg.startswith(_DUMP_FLAG + "="):
      return arg.split("=", 1)[1]
  directory = tempfile.mkdtemp(prefix="mosaic_dump_")
  os.environ["LIBTPU_INIT_ARGS"] = f"{args} {_DUMP_FLAG}={directory}".strip()
  return directory


@dataclasses.dataclass
class Estimate:
  """The compiler's estimate of one step on one device."""
  device_kind: str
  compiler_cycles: int  # XLA's priced instructions, loops times their trips.
  loop_cycles: int  # Of which inside while loops (the scanned layers).
  kernel_cycles: float  # Pallas kernels at their own counts.
  clock_hz: float | None
  outside_loops: list  # The largest items outside the loops: (cycles, name, op_name).
  kernels: dict  # Kernel name -> (calls, cycles a call, the busiest unit).
  collective_bytes: int
  unpriced_kernels: list  # Kernels called without a dump to price them.
  step_flops: float = 0.0  # Analytic model FLOPs of the step, all devices.
  num_devices: int = 1
  peak_tflops_per_device: float | None = None

  @property
  def cycles(self) -> float:
    return self.compiler_cycles + self.kernel_cycles

  @property
  def seconds(self) -> float | None:
    return self.cycles / self.clock_hz if self.clock_hz else None

  @property
  def mfu(self) -> float | None:
    if not (self.seconds and self.peak_tflops_per_device and self.step_flops):
      return None
    return self.step_flops / (self.seconds * self.num_devices * self.peak_tflops_per_device
                              * 1e12)


def dump_files(directory: str | None) -> set[str]:
  """The Mosaic dump files in `directory` now (none without one): a compile's
  own are those it adds."""
  if not directory:
    return set()
  return set(glob.glob(os.path.join(directory, "*-mosaic-dump-*.txt")))


def estimate(compiled_text: str, device, dumps: set[str], *, step_flops: float = 0.0,
             num_devices: int = 1, peak_tflops_per_device: float | None = None,
             top: int = 8) -> Estimate:
  """The estimate of a compiled step (`compiled.as_text()`) for `device` (a
  TPU topology device), its kernels read from `dumps`, the Mosaic dump files
  its compile wrote (dump_files after, less dump_files before)."""
  program = hlo_cost.program_cost(compiled_text)
  counts = mosaic_cost.read_dumps(dumps) if program.kernels else {}
  rates = mosaic_cost.calibrate(device) if program.kernels else None
  kernels, kernel_cycles, unpriced = {}, 0.0, []
  for name, calls in sorted(program.kernels.items()):
    compiles = counts.get(name)
    if not compiles:
      unpriced.append(name)
      continue
    # Several compiles of one kernel (other shapes): the dearest prices each call.
    call_bytes = program.kernel_bytes.get(name, 0)
    priced = max(compiles, key=lambda c: mosaic_cost.kernel_cycles(c, rates, call_bytes))
    units = mosaic_cost.step_cycles(priced, rates)
    units["hbm"] = call_bytes / rates.hbm_bytes / priced.steps
    per_call = mosaic_cost.kernel_cycles(priced, rates, call_bytes)
    busiest = max(("valu", "eup", "mxu", "hbm"), key=units.get)
    kernels[name] = (calls, per_call, busiest)
    kernel_cycles += calls * per_call
  outside = [(cycles, name, op_name)
             for (name, op_name), cycles in program.outside_loops.most_common(top)]
  return Estimate(
      device_kind=device.device_kind, compiler_cycles=program.cycles,
      loop_cycles=program.loop_cycles, kernel_cycles=kernel_cycles,
      clock_hz=clock_hz(device.device_kind), outside_loops=outside, kernels=kernels,
      collective_bytes=program.collective_bytes, unpriced_kernels=unpriced,
      step_flops=step_flops, num_devices=num_devices,
      peak_tflops_per_device=peak_tflops_per_device)


def describe(e: Estimate) -> list[str]:
  """Lines for a person, every figure labelled as the compiler's estimate."""
  ms = f"{1e3 * e.seconds:.2f} ms" if e.seconds else "unknown clock"
  mfu = f", MFU {100 * e.mfu:.1f}%" if e.mfu is not None else ""
  lines = [f"compiler's estimate (not a measurement), per device ({e.device_kind}): "
           f"{e.cycles / 1e6:.2f}M cycles, {ms} a step{mfu}",
           f"  XLA-priced {e.compiler_cycles / 1e6:.2f}M cycles ({e.loop_cycles / 1e6:.2f}M in "
           f"the layer loops, {(e.compiler_cycles - e.loop_cycles) / 1e6:.2f}M outside); "
           f"Pallas kernels {e.kernel_cycles / 1e6:.2f}M; collectives "
           f"{e.collective_bytes / 2**20:.1f} MiB a step (assumed overlapped)"]
  for name, (calls, per_call, unit) in e.kernels.items():
    lines.append(f"  kernel {name}: {calls} calls x {per_call / 1e3:.1f}k cycles "
                 f"({unit}-bound by its own counts)")
  if e.unpriced_kernels:
    lines.append(f"  unpriced kernels (no Mosaic dump): {', '.join(e.unpriced_kernels)}")
  for cycles, name, op_name in e.outside_loops:
    lines.append(f"  outside the loops: {cycles / 1e6:.2f}M cycles {name} ({op_name})")
  return lines
