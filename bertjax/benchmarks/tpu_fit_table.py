"""The fit-and-FLOPs table: configs x phases x TPU slices, each compiled ahead of time.

  pip install "jax[tpu]"
  JAX_PLATFORMS=cpu python -m bertjax.benchmarks.tpu_fit_table \\
      --configs base,large --phases seq128,seq512 \\
      --slices v4-8,v5e-8,v5p-8,v6e-8,v4-32,v5e-32,v5p-32,v6e-32 [--find_max_batch]

For every combination it compiles the train step for the slice on this CPU
host (bertjax.benchmark.aot_compile) with the attention kernel `auto` picks
there, and prints one markdown row as soon as it is done: the HBM needed
per device (one device per chip; a v4 chip's two TensorCores as one
megacore device, see tpu_topology.topology_devices) against the HBM the
compiler lets a program use on that device (tpu_topology.available_hbm_bytes,
below the chip's nominal HBM on v4, v5e and v6e), whether it fits, XLA's
FLOPs per step against bertjax's analytic count as XLA sees the program
(scanned layers counted once, Pallas kernels not counted) and, with
--find_max_batch, the largest per-device batch that fits (each search
after the first of a config and phase starts from the previous one's memory
per sequence, which saves compiles, not changes answers). Attention dropout is 0 unless --attention_dropout_rate says
otherwise, so that `auto` may pick the splash kernel.
"""

import argparse
import importlib.metadata
import importlib.util
import os
import sys

import jax

from bertjax import benchmark
from bertjax.benchmarks import tpu_topology

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Cloud TPU slice names (as in --accelerator-type) -> topology names for
# jax.experimental.topologies. A v4/v5p "-N" counts TensorCores (2 per chip),
# each chip one device (tpu_topology.topology_devices).
SLICES = {
    "v4-8": "v4:2x2x1", "v4-32": "v4:2x2x4",
    "v5e-8": "v5e:2x4", "v5e-32": "v5e:4x8",
    "v5p-8": "v5p:2x2x1", "v5p-32": "v5p:2x2x4",
    "v6e-8": "v6e:2x4", "v6e-32": "v6e:4x8",
}
HEADER = ("| config | phase (global batch) | slice | chips (devices) | attention | mesh | "
          "HBM per device: needed of available | fits | XLA FLOPs/step | "
          "analytic as XLA counts | ratio | analytic model FLOPs/step | max per-device batch |")


def load_config(name: str, attention_dropout_rate: float):
  spec = importlib.util.spec_from_file_location(
      f"{name}_config", os.path.join(REPO, "configs", f"{name}.py"))
  sys.path.insert(0, os.path.join(REPO, "configs"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.model.attention_dropout_rate = attention_dropout_rate
  return config


def row(config_name: str, slice_name: str, r: benchmark.AotResult, max_batch) -> str:
  mesh = " x ".join(f"{k} {v}" for k, v in r.mesh.items() if v > 1) or "1 chip"
  gib = r.total_bytes / 2**30
  fits = {True: "yes", False: "no", None: "?"}[r.fits]
  hbm = f" of {r.hbm_bytes / 2**30:.2f}" if r.hbm_bytes else ""
  xla = r.compiled_flops * r.devices if r.compiled_flops else None
  return (f"| {config_name} | {r.phase} ({r.global_batch_size}) | {slice_name} | "
          f"{r.chips} ({r.devices}) | "
          f"{r.attention} | {mesh} | {gib:.2f}{hbm} GiB | {fits} | "
          f"{f'{xla:.4g}' if xla else 'n/a'} | {r.xla_view_flops:.4g} | "
          f"{f'{xla / r.xla_view_flops:.3f}' if xla else 'n/a'} | {r.analytic_flops:.4g} | "
          f"{max_batch if max_batch is not None else 'not searched'} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", default="base,large")
  parser.add_argument("--phases", default="seq128,seq512")
  parser.add_argument("--slices", default="v4-8,v5e-8,v5p-8,v6e-8,v4-32,v5e-32,v5p-32,v6e-32")
  parser.add_argument("--attention_dropout_rate", type=float, default=0.0)
  parser.add_argument("--find_max_batch", action="store_true")
  args = parser.parse_args()
  unknown = sorted(set(args.slices.split(",")) - set(SLICES))
  if unknown:
    parser.error(f"--slices: unknown {unknown}; known: {sorted(SLICES)}")
  print(f"jax {jax.__version__}, libtpu {importlib.metadata.version('libtpu')}, "
        f"attention_dropout_rate {args.attention_dropout_rate}")
  print(HEADER)
  print("|" + "---|" * HEADER.count(" | ") + "---|")
  for config_name in args.configs.split(","):
    for phase in args.phases.split(","):
      per_item = None  # Memory per sequence from the last search of this config and phase.
      for slice_name in args.slices.split(","):
        make = lambda c=config_name: load_config(c, args.attention_dropout_rate)
        try:
          result = benchmark.aot_compile(make(), SLICES[slice_name], phase)
        except jax.errors.JaxRuntimeError as e:
          if not tpu_topology.is_out_of_memory(e):
            raise
          print(f"| {config_name} | {phase} | {slice_name} | | | | more than the device "
                f"has (the compiler ran out of HBM) | no |" + " |" * 5, flush=True)
          continue
        max_batch = None
        if args.find_max_batch:
          dp = result.global_batch_size // max(1, result.mesh["data"] * result.mesh["fsdp"])
          max_batch, _, found = benchmark.find_max_batch(
              make, SLICES[slice_name], phase, dp, log=lambda m: print(m, file=sys.stderr),
              known=result, per_item_hint=per_item)
          per_item = found or per_item
        print(row(config_name, slice_name, result, max_batch), flush=True)


if __name__ == "__main__":
  main()
