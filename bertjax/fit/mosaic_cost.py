"""Pallas (Mosaic) TPU kernels priced from their own operation counts.

The TPU compiler gives a Pallas kernel (a `tpu_custom_call`) no estimated
cycles. With `LIBTPU_INIT_ARGS=--xla_mosaic_dump_to=DIR` libtpu writes each
kernel's passes to DIR as it compiles it; `read_dumps` reads, per kernel,
the final low-level program of one grid step (vector ALU, transcendental,
load and store operations), the matrix products of the kernel as written
(their FLOPs) and the grid (`iteration_bounds`).

`kernel_cycles` prices a grid step at the rates the compiler's own cost
model gives the same kinds of work on that chip (`calibrate`: an integer
chain for the vector ALUs, an exp chain for the transcendental unit, a large
matrix product for the matrix units, a large elementwise pass for HBM),
taking the busiest of the three units (an issue bound that assumes they
overlap), times the grid; or the call's operands and results moved once at
the HBM rate, where that takes longer. Blocks that a kernel reads again at
other grid steps and the pipeline's start-up are left out, so the figure
is a lower bound.
"""

import collections
import dataclasses
import functools
import glob
import os
import re

# Vector ALU operations of the final LLO program (what the dropout budget counts).
VALU_OPS = frozenset({
    "vadd", "vsub", "vmul", "vmax", "vmin", "vand", "vor", "vxor", "vshll", "vshrl", "vshra",
    "vcmp", "vselect", "vpack", "vunpack", "vcmask", "vxlaneid", "vslaneid", "vcvt", "vclz",
    "vpcnt", "vneg", "vabs"})
# Transcendental-unit operations.
EUP_OPS = frozenset({"vexp", "vrecip", "vln", "vlog2", "vpow2", "vrsqrt", "vsqrt", "vtanh"})
_LLO_OP = re.compile(r"\bllo\.(v[a-z_0-9]+)")
_FUNC = re.compile(r"func\.func @(\w+)")
_BOUNDS = re.compile(r"iteration_bounds = array<i64(?:: ([\d, ]+))?>")
_MATMUL = re.compile(r"tpu\.matmul .*: vector<([\dx]+)x\w+>, vector<[\dx]+x\w+>, "
                     r"vector<[\dx]+x\w+> -> vector<([\dx]+)x\w+>")


@dataclasses.dataclass(frozen=True)
class KernelCounts:
  """One Pallas kernel: its operations per grid step and its grid."""
  name: str
  valu: int
  eup: int
  vector_loads: int
  vector_stores: int
  matmul_flops: int  # Per grid step.
  grid: tuple[int, ...]

  @property
  def steps(self) -> int:
    n = 1
    for g in self.grid:
      n *= g
    return n


@dataclasses.dataclass(frozen=True)
class Rates:
  """Work per cycle of one chip by the compiler's cost model."""
  valu_vreg_ops: float
  eup_vreg_ops: float
  matmul_flops: float
  hbm_bytes: float


def _dims(shape: str) -> list[int]:
  return [int(d) for d in shape.split("x")]


def read_dumps(files) -> dict[str, list[KernelCounts]]:
  """Kernel name -> counts of each distinct compile of it among Mosaic dump
  files (a directory's `*-mosaic-dump-*.txt`, or the paths themselves)."""
  if isinstance(files, str):
    files = glob.glob(os.path.join(files, "*-mosaic-dump-*.txt"))
  runs = collections.defaultdict(dict)
  for path in files:
    base = os.path.basename(path)
    run, stage = base.split("-")[0], base.split("-mosaic-dump-")[1]
    runs[run][stage] = path
  kernels = collections.defaultdict(list)
  for stages in runs.values():
    final = next((p for s, p in stages.items() if "finalize-llo" in s), None)
    original = next((p for s, p in stages.items() if s.endswith("original.txt")), None)
    if final is None or original is None:
      continue
    llo = open(final).read()
    name = _FUNC.search(llo)
    bounds = _BOUNDS.search(llo)
    if name is None or bounds is None:
      continue
    ops = collections.Counter(_LLO_OP.findall(llo))
    flops = 0
    for lhs, out in _MATMUL.findall(open(original).read()):
      lhs, out = _dims(lhs), _dims(out)
      m, n = out[-2], out[-1]
      k = 1
      for d in lhs:
        k *= d
      flops += 2 * m * n * (k // m)
    counts = KernelCounts(
        name=name.group(1), valu=sum(v for op, v in ops.items() if op in VALU_OPS),
        eup=sum(v for op, v in ops.items() if op in EUP_OPS),
        vector_loads=ops["vector_load"],
        vector_stores=ops["vector_store"] + ops["vector_store_masked"], matmul_flops=flops,
        grid=tuple(int(g) for g in (bounds.group(1) or "").replace(" ", "").split(",") if g))
    if counts not in kernels[counts.name]:
      kernels[counts.name].append(counts)
  return dict(kernels)


def step_cycles(counts: KernelCounts, rates: Rates) -> dict[str, float]:
  """Cycles of one grid step on each unit at `rates`, and their maximum."""
  units = {"valu": counts.valu / rates.valu_vreg_ops, "eup": counts.eup / rates.eup_vreg_ops,
           "mxu": counts.matmul_flops / rates.matmul_flops}
  units["step"] = max(units.values())
  return units


def kernel_cycles(counts: KernelCounts, rates: Rates, call_bytes: int = 0) -> float:
  """Cycles of one call of the kernel: its grid steps at step_cycles, or
  reading and writing its operands and results once (`call_bytes`) at the
  compiler's HBM rate where that takes longer (a lower bound on its memory
  traffic: a block read again at other grid steps is counted once)."""
  return max(counts.steps * step_cycles(counts, rates)["step"], call_bytes / rates.hbm_bytes)


_PROBE_ELEMENTS = 8 * 1024 * 1024
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


@functools.lru_cache(maxsize=None)
def _calibrated(device_kind: str, device) -> Rates:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  on = jax.sharding.SingleDeviceSharding(device)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=on)

  def cycles(fn, *args) -> int:
    text = jax.jit(fn).lower(*args).compile().as_text()
    return sum(int(c) for c in _CYCLES.findall(text))

  def int_chain(x):  # Four vector ALU operations per element and round.
    for i in range(10):
      x = (x * jnp.int32(0x7FEB352D)) ^ ((x >> 15) + jnp.int32(i))
    return x

  def exp_chain(x):
    for _ in range(8):
      x = jnp.exp(x) * 0.5
    return x

  vregs = _PROBE_ELEMENTS // 1024  # 8 x 128 32-bit elements a vector register.
  rows = spec((_PROBE_ELEMENTS // 1024, 1024), jnp.int32)
  size = 4096
  big = spec((8 * _PROBE_ELEMENTS // 1024, 1024), jnp.float32)  # Read and written once.
  return Rates(
      valu_vreg_ops=40 * vregs / cycles(int_chain, rows),
      eup_vreg_ops=8 * vregs / cycles(exp_chain, spec(rows.shape, jnp.float32)),
      matmul_flops=2 * size ** 3 / cycles(lambda a, b: a @ b,
                                          spec((size, size), jnp.bfloat16),
                                          spec((size, size), jnp.bfloat16)),
      hbm_bytes=2 * 4 * 8 * _PROBE_ELEMENTS / cycles(lambda x: x + 1.0, big))


def calibrate(device) -> Rates:
  """The compiler's rates on `device` (a TPU topology's device), from three
  small programs compiled for it and their estimated cycles."""
  return _calibrated(device.device_kind, device)


def flash_counts(length: int, rate: float, topology: str = "v5e:2x2", heads: int = 12,
                 head_dim: int = 64, batch: int = 2) -> dict[str, KernelCounts]:
  """The flash kernels' counts (flash_tpu.py: forward, and dq/dk/dv in one pass
  with the keys in one block) at `length` and dropout `rate`, compiled for a
  chip of `topology` on this host. libtpu must have started with Mosaic's
  dumps on (estimate.mosaic_dump_dir() before the first topology)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  from bertjax.fit import estimate  # pylint: disable=g-import-not-at-top
  from bertjax.model import flash_tpu  # pylint: disable=g-import-not-at-top

  directory = estimate.mosaic_dump_dir()
  device = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]
  on = jax.sharding.SingleDeviceSharding(device)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=on)

  def grads(q, k, v, ids, rows, cols):
    def loss(q, k, v):
      out = flash_tpu.flash_attention(q, k, v, ids, ids, rows, cols, dropout_rate=rate,
                                      sm_scale=head_dim ** -0.5)
      return jnp.sum(out.astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  qkv = spec((batch, heads, head_dim, length), jnp.bfloat16)
  before = estimate.dump_files(directory)
  jax.jit(grads).lower(qkv, qkv, qkv, spec((batch, length), jnp.int32),
                       spec((batch, length), jnp.int32),
                       spec((batch, heads, length), jnp.int32)).compile()
  found = read_dumps(estimate.dump_files(directory) - before)
  return {name: compiles[0] for name, compiles in found.items()}


def main(argv=None):
  """Prints the flash kernels' vector ALU counts per grid step, without and with dropout."""
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("--lengths", default="128,512")
  parser.add_argument("--rate", type=float, default=0.1)
  parser.add_argument("--topology", default="v5e:2x2")
  args = parser.parse_args(argv)
  from bertjax.fit import estimate  # pylint: disable=g-import-not-at-top
  estimate.mosaic_dump_dir()
  print("| length | kernel | vector ALU, no dropout | with dropout | ratio | vector loads, no "
        "dropout | with dropout |")
  print("|---|---|---|---|---|---|---|")
  for length in (int(n) for n in args.lengths.split(",")):
    without = flash_counts(length, 0.0, args.topology)
    with_ = flash_counts(length, args.rate, args.topology)
    for name in sorted(without):
      a, b = without[name], with_[name]
      print(f"| {length} | {name} | {a.valu} | {b.valu} | {b.valu / a.valu:.2f} | "
            f"{a.vector_loads} | {b.vector_loads} |")


if __name__ == "__main__":
  main()
