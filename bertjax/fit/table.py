"""The fit-and-FLOPs table: configs x phases x TPU slices, each compiled ahead of time.

The tables of docs/fit-table.md and docs/multislice.md come from here; one
config's fit check is `python -m bertjax.fit` (bertjax/fit/__main__.py).

  pip install "jax[tpu]"
  JAX_PLATFORMS=cpu python -m bertjax.fit.table \\
      --configs base,large --phases seq128,seq512 \\
      --slices v4-8,v5e-8,v5p-8,v6e-8,v4-32,v5e-32,v5p-32,v6e-32 [--find_max_batch]

For every combination it compiles the train step for the slice on this CPU
host (bertjax.fit.aot.aot_compile) with the attention kernel --attention_impl
names (default `auto`, which takes XLA attention on TPU until a kernel is
proven there: docs/attention.md; the table in docs/fit-table.md was made with
`--attention_impl splash`), and prints one markdown row as soon as it is done: the HBM needed
per device (one device per chip; a v4 chip's two TensorCores as one
megacore device, see topology.topology_devices) against the HBM the
compiler lets a program use on that device (topology.available_hbm_bytes,
below the chip's nominal HBM on v4, v5e and v6e), whether it fits, XLA's
FLOPs per step against bertjax's analytic count as XLA sees the program
(scanned layers counted once, Pallas kernels not counted) and, with
--find_max_batch, the largest per-device batch that fits (each search
after the first of a config and phase starts from the previous one's memory
per sequence, or from its answer where that was for the same slice, e.g.
v5e-256 before 2xv5e-256, or else from --max_batch_guess; this saves
compiles, not changes answers). Attention dropout is 0 unless
--attention_dropout_rate says otherwise (splash has none).

A slice written NxSLICE (e.g. 2xv5e-256) is N such slices joined by the
data-center network (DCN), the mesh split across them by config.mesh.dcn_*
(data parallel across slices by default); these rows go to a second table
that also gives the bytes each device sends over the DCN per step, read
from the compiled program (bertjax/fit/dcn_traffic.py), beside the
analytic gradient all-reduce (dcn_traffic.gradient_allreduce_bytes).
--per_device_batch sets every phase's global batch to that many sequences
per data-parallel device (the configs' 256 do not divide over 512 chips).
"""

import argparse
import importlib.metadata
import importlib.util
import math
import os
import re
import sys

import jax

from bertjax.fit import aot
from bertjax.fit import max_batch as max_batch_lib
from bertjax.fit import topology as topology_lib
from bertjax.train import cli
from bertjax.train import sharding as sharding_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Cloud TPU slice names (as in --accelerator-type) -> topology names for
# jax.experimental.topologies. A v4/v5p "-N" counts TensorCores (2 per chip),
# each chip one device (topology.topology_devices).
SLICES = {
    "v4-8": "v4:2x2x1", "v4-32": "v4:2x2x4",
    "v5e-8": "v5e:2x4", "v5e-32": "v5e:4x8",
    "v5p-8": "v5p:2x2x1", "v5p-32": "v5p:2x2x4",
    "v6e-8": "v6e:2x4", "v6e-32": "v6e:4x8",
    "v5e-256": "v5e:16x16", "v5p-128": "v5p:4x4x4",
}
HEADER = ("| config | phase (global batch) | slice | chips (devices) | attention | mesh | "
          "HBM per device: needed of available | fits | XLA FLOPs/step | "
          "analytic as XLA counts | ratio | analytic model FLOPs/step | max per-device batch |")
MULTISLICE_HEADER = (
    "| config | phase (global batch) | slices | chips (devices) | attention | mesh | "
    "HBM per device: needed of available | fits | DCN sent per device per step "
    "(compiled program) | analytic: hierarchical fp32 gradient all-reduce | compile s | "
    "max per-device batch |")
_SPEC = re.compile(r"^(?:(\d+)x)?([\w-]+)$")


def parse_slices(text: str) -> list[tuple[int, str]]:
  """'v5e-8,2xv5e-256' -> [(1, 'v5e-8'), (2, 'v5e-256')]; unknown names raise ValueError."""
  out = []
  for spec in text.split(","):
    match = _SPEC.match(spec.strip())
    if not match or match.group(2) not in SLICES or match.group(1) in ("0",):
      raise ValueError(f"--slices: {spec!r} is not SLICE or NxSLICE with SLICE one of "
                       f"{sorted(SLICES)}")
    out.append((int(match.group(1) or 1), match.group(2)))
  return out


def load_config(name: str, attention_dropout_rate: float, vocab_multiple: int = 0,
                attention_impl: str = "auto"):
  spec = importlib.util.spec_from_file_location(
      f"{name}_config", os.path.join(REPO, "configs", f"{name}.py"))
  sys.path.insert(0, os.path.join(REPO, "configs"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.model.attention_dropout_rate = attention_dropout_rate
  config.model.attention_impl = attention_impl
  if vocab_multiple:
    config.model.vocab_multiple = vocab_multiple
  return config


def _memory_cells(r: aot.AotResult) -> tuple[str, str, str]:
  mesh = " x ".join(f"{k} {v}" for k, v in r.mesh.items() if v > 1) or "1 chip"
  hbm = f" of {r.hbm_bytes / 2**30:.2f}" if r.hbm_bytes else ""
  return mesh, f"{r.total_bytes / 2**30:.2f}{hbm} GiB", {True: "yes", False: "no", None: "?"}[r.fits]


def row(config_name: str, slice_name: str, r: aot.AotResult, max_batch) -> str:
  if r.num_slices > 1:
    return multislice_row(config_name, slice_name, r, max_batch)
  mesh, memory, fits = _memory_cells(r)
  xla = r.compiled_flops * r.devices if r.compiled_flops else None
  return (f"| {config_name} | {r.phase} ({r.global_batch_size}) | {slice_name} | "
          f"{r.chips} ({r.devices}) | "
          f"{r.attention} | {mesh} | {memory} | {fits} | "
          f"{f'{xla:.4g}' if xla else 'n/a'} | {r.xla_view_flops:.4g} | "
          f"{f'{xla / r.xla_view_flops:.3f}' if xla else 'n/a'} | {r.analytic_flops:.4g} | "
          f"{max_batch if max_batch is not None else 'not searched'} |")


def multislice_row(config_name: str, slice_name: str, r: aot.AotResult,
                   max_batch) -> str:
  mesh, memory, fits = _memory_cells(r)
  dcn = r.dcn
  sent = (f"{dcn.bytes_per_step / 2**20:.2f} MiB in {dcn.sends} sends"
          + (f" ({dcn.uncounted_loops} loops counted once)" if dcn.uncounted_loops else ""))
  return (f"| {config_name} | {r.phase} ({r.global_batch_size}) | {r.num_slices} x {slice_name} | "
          f"{r.chips} ({r.devices}) | {r.attention} | {mesh} | {memory} | {fits} | {sent} | "
          f"{r.gradient_allreduce_bytes / 2**20:.2f} MiB | {r.compile_seconds:.0f} | "
          f"{max_batch if max_batch is not None else 'not searched'} |")


def set_per_device_batch(config, per_device: int, topology: str, num_slices: int):
  """Every phase's global batch: `per_device` sequences per data-parallel device."""
  devices = len(topology_lib.topology_devices(topology, num_slices))
  dp = math.prod(sharding_lib.mesh_shape(config.mesh, devices, num_slices)[:2])
  for phase in config.phases.values():
    phase.global_batch_size = per_device * dp
  return config


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", default="base,large")
  parser.add_argument("--phases", default="seq128,seq512")
  parser.add_argument("--slices", default="v4-8,v5e-8,v5p-8,v6e-8,v4-32,v5e-32,v5p-32,v6e-32")
  parser.add_argument("--attention_dropout_rate", type=float, default=0.0)
  parser.add_argument("--attention_impl", default="auto",
                      help="model.attention_impl of every compile (auto, xla, splash, flash)")
  parser.add_argument("--find_max_batch", action="store_true")
  parser.add_argument("--per_device_batch", type=int, default=0,
                      help="Sequences per data-parallel device in every phase's global batch; "
                      "0 keeps the configs' global batches.")
  parser.add_argument("--vocab_multiple", type=int, default=0,
                      help="model.vocab_multiple for every config (0 keeps the configs'): "
                      "the word table's rows split over tensor x fsdp, so 256-way FSDP "
                      "needs a multiple of 256.")
  parser.add_argument("--max_batch_guess", type=int, default=0,
                      help="With --find_max_batch: the per-device batch each search compiles "
                      "first (with its neighbour), where no earlier search of the same config, "
                      "phase and slice gave one; 0 predicts it from the row's compile.")
  args = parser.parse_args()
  cli.quiet_library_logs()
  try:
    specs = parse_slices(args.slices)
  except ValueError as e:
    parser.error(str(e))
  print(f"jax {jax.__version__}, libtpu {importlib.metadata.version('libtpu')}, "
        f"attention_impl {args.attention_impl}, attention_dropout_rate "
        f"{args.attention_dropout_rate}, per_device_batch "
        f"{args.per_device_batch or 'from the configs'}, vocab_multiple "
        f"{args.vocab_multiple or 'from the configs'}")
  answers = {}  # (config, phase, slice) -> max per-device batch found on any number of them.
  for header, group in ((HEADER, [s for s in specs if s[0] == 1]),
                        (MULTISLICE_HEADER, [s for s in specs if s[0] > 1])):
    if not group:
      continue
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    for config_name in args.configs.split(","):
      for phase in args.phases.split(","):
        per_item = None  # Memory per sequence from the last search of this config and phase.
        for num_slices, slice_name in group:
          topology = SLICES[slice_name]
          def make(c=config_name, t=topology, n=num_slices):
            config = load_config(c, args.attention_dropout_rate, args.vocab_multiple,
                                 args.attention_impl)
            if args.per_device_batch:
              set_per_device_batch(config, args.per_device_batch, t, n)
            return config
          try:
            result = aot.aot_compile(make(), topology, phase, num_slices=num_slices)
          except jax.errors.JaxRuntimeError as e:
            if not topology_lib.is_out_of_memory(e):
              raise
            name = f"{num_slices} x {slice_name}" if num_slices > 1 else slice_name
            print(f"| {config_name} | {phase} | {name} | | | | more than the device "
                  f"has (the compiler ran out of HBM) | no |"
                  + " |" * (header.count(" | ") - 7), flush=True)
            continue
          max_batch = None
          if args.find_max_batch:
            per_device = result.rows // max(1, result.mesh["data"] * result.mesh["fsdp"])
            max_batch, _, found = max_batch_lib.find_max_batch(
                make, topology, phase, per_device, log=lambda m: print(m, file=sys.stderr),
                known=result, per_item_hint=per_item, num_slices=num_slices,
                guess=answers.get((config_name, phase, slice_name), args.max_batch_guess))
            per_item = found or per_item
            if max_batch:
              answers[config_name, phase, slice_name] = max_batch
          print(row(config_name, slice_name, result, max_batch), flush=True)


if __name__ == "__main__":
  main()
