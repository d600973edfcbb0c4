"""Ahead-of-time compiles of the pretraining train step, for TPU slices on any machine
or for this machine's devices.

`aot_compile` builds a run config's model, optimizer and mesh
(bertjax/train/step_setup.py, as the step benchmark does) on a TPU
topology's devices (bertjax/fit/topology.py: libtpu's description, no TPU
needed; JAX_PLATFORMS=cpu) or on this machine's, compiles the train step for
the phase's global batch (the packed rows where data.packing is on) and
returns what the compiled program tells: per-device memory against the
memory available, XLA's FLOPs beside the analytic count, its loops and, on
several slices, the bytes each device sends over the data-center network.
"""

import dataclasses
import time

import jax

from bertjax.fit import dcn_traffic
from bertjax.fit import estimate as estimate_lib
from bertjax.fit import topology as topology_lib
from bertjax.input import packing as packing_lib
from bertjax.model import attention
from bertjax.model import layers
from bertjax.train import flops
from bertjax.train import profiling
from bertjax.train import run_config
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib
from bertjax.train import step_setup
from bertjax.train.step_setup import gib


def mib(n):
  return f"{n / 2**20:.1f} MiB"


@dataclasses.dataclass
class AotResult:
  """What an ahead-of-time compile tells (bytes and FLOPs per device)."""
  topology: str  # The TPU topology compiled for; "": this machine's devices.
  devices: int  # JAX devices: one per chip (see topology.topology_devices).
  chips: int
  device_kind: str
  mesh: dict
  phase: str
  global_batch_size: int  # Examples per step.
  seq_len: int
  attention: str
  compile_seconds: float
  argument_bytes: int
  temp_bytes: int
  unaliased_output_bytes: int
  compiled_flops: float | None  # XLA's count for one step on one device.
  analytic_flops: float  # bertjax's model FLOPs for one step of the global batch.
  xla_view_flops: float  # The analytic count as XLA counts it (see flops_as_xla_counts).
  while_loops: int = 0  # `while` instructions in the optimized program (bodies counted once).
  # Memory a program may use on one device: the HBM the compiler allows on a
  # topology, the backend's limit on this machine (topology.available_bytes),
  # or the figure asked for; None: unknown.
  hbm_bytes: int | None = None
  num_slices: int = 1  # Slices of `topology` (devices, chips and mesh count all of them).
  dcn: dcn_traffic.DcnTraffic | None = None  # What one device sends over the DCN per step.
  gradient_allreduce_bytes: int = 0  # Analytic DCN bytes per device (dcn_traffic.gradient_allreduce_bytes).
  packing: packing_lib.Packing | None = None  # The packed rows of the global batch; None: unpacked.
  # The TPU compiler's estimate of the step (estimate.py); None unless asked for.
  estimate: estimate_lib.Estimate | None = None

  @property
  def rows(self) -> int:
    """Rows of the global batch: its examples, or with packing its packed rows."""
    return self.global_batch_size if self.packing is None else self.packing.rows

  @property
  def total_bytes(self) -> int:
    return self.argument_bytes + self.temp_bytes + self.unaliased_output_bytes

  @property
  def nominal_hbm_bytes(self) -> int | None:
    """The chip's nominal HBM (flops.HBM_GIB), shared by the devices on it; None: unknown."""
    per_chip = flops.hbm_gib(self.device_kind)
    return None if per_chip is None else int(per_chip * 2**30 * self.chips / self.devices)

  @property
  def fits(self) -> bool | None:
    """Whether the memory XLA's analysis reports is within the compiler's available HBM."""
    return None if self.hbm_bytes is None else self.total_bytes <= self.hbm_bytes


def flops_as_xla_counts(model_config, seq_len, num_predictions, batch, attention_kernel,
                        grad_accum_steps=1, num_examples=1, platform="tpu") -> float:
  """The analytic FLOPs of what XLA's cost analysis sees of one step of `batch`
  rows (each with `num_examples` [CLS] slots, flops.forward_flops_per_sequence)
  compiled for `platform`.

  XLA counts a loop body once: with scanned layers in a loop (not unrolled,
  model.layer_loop) one of the L - 1 layers before the last (which runs
  outside the loop), with gradient accumulation one micro-batch. Pallas
  kernels (splash, flash) are custom calls it does not count: the attention
  matmuls of the layers before the last are left out (the last layer, at a
  few positions, attends with XLA).
  """
  c = model_config
  if c.scan_layers and not layers.unrolls(c, platform):
    c = c.replace(num_layers=min(2, c.num_layers))
  per_seq = flops.train_flops_per_sequence(c, seq_len, num_predictions, num_examples)
  if attention_kernel in ("splash", "flash"):
    per_seq -= 3 * (c.num_layers - 1) * seq_len * 2 * 2 * seq_len * c.hidden_size
  return per_seq * batch / grad_accum_steps


def aot_compile(config, topology: str, phase_name: str = "",
                global_batch_size: int | None = None, vocab_size: int = 30522,
                num_slices: int = 1, available_bytes: int | None = None,
                mosaic_dump: str | None = None) -> AotResult:
  """Compiles the train step ahead of time for `num_slices` slices of a TPU topology
  (e.g. v5e:2x4), or with no topology ("") for this machine's devices.

  `global_batch_size` (examples; default the phase's) is packed into
  global_batch_size / data.packing_factor rows where data.packing is on.
  `available_bytes`, where given, takes the place of the memory a device
  reports (topology.available_bytes). With `mosaic_dump` (the directory of
  estimate.mosaic_dump_dir(), set before libtpu started) and a TPU topology,
  the result carries the compiler's estimate of the step's time.
  """
  devices = topology_lib.devices(topology, num_slices)
  if global_batch_size:
    config.phases[phase_name or next(iter(config.phases))].global_batch_size = global_batch_size
  model_config, phase, mesh, rules, model, tx = step_setup.build(
      config, devices, phase_name=phase_name, vocab_size=vocab_size,
      device_mesh=bool(topology), compile_only=True)
  accum = config.optimizer.grad_accum_steps
  platform = "tpu" if topology else devices[0].platform
  kernel, _ = attention.choose(
      model_config.attention_impl, attention_dropout_rate=model_config.attention_dropout_rate,
      dtype=model_config.dtype, platform=platform,
      seq_len=phase.max_seq_length, deterministic=False)
  with sharding_lib.mesh_context(mesh, rules):
    abstract_state, shardings = state_lib.abstract_train_state(model, tx, mesh, rules)
    batch = step_setup.batch_specs(config, phase, sharding_lib.batch_sharding(mesh))
    rng = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                               sharding=sharding_lib.replicated(mesh))
    t0 = time.perf_counter()
    step_fn = step_lib.jit_train_step(shardings, mesh, objective=config.objective,
                                      grad_accum_steps=accum)
    dumped = estimate_lib.dump_files(mosaic_dump)
    compiled = step_fn.lower(abstract_state, batch, rng).compile()
    seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  rows, predictions, examples = run_config.row_slots(config, phase)
  length = phase.max_seq_length
  dcn = dcn_traffic.dcn_traffic(compiled.as_text()) if num_slices > 1 else None
  analytic = flops.train_flops_per_sequence(model_config, length, predictions, examples) * rows
  estimate = None
  if mosaic_dump is not None and topology:
    estimate = estimate_lib.estimate(
        compiled.as_text(), devices[0], estimate_lib.dump_files(mosaic_dump) - dumped,
        step_flops=analytic, num_devices=len(devices),
        peak_tflops_per_device=flops.peak_tflops(devices[0].device_kind))
  return AotResult(
      topology=topology, devices=len(devices), chips=_count_chips(devices),
      device_kind=devices[0].device_kind,
      mesh=dict(mesh.shape), phase=phase.name, global_batch_size=phase.global_batch_size,
      seq_len=phase.max_seq_length, attention=kernel, compile_seconds=seconds,
      argument_bytes=mem.argument_size_in_bytes, temp_bytes=mem.temp_size_in_bytes,
      unaliased_output_bytes=mem.output_size_in_bytes - mem.alias_size_in_bytes,
      compiled_flops=profiling.compiled_flops(compiled),
      while_loops=profiling.count_loops(compiled) or 0,
      analytic_flops=analytic,
      xla_view_flops=flops_as_xla_counts(model_config, length, predictions, rows, kernel,
                                         accum, examples, platform),
      hbm_bytes=available_bytes or topology_lib.available_bytes(topology),
      num_slices=num_slices,
      dcn=dcn, gradient_allreduce_bytes=dcn_traffic.gradient_allreduce_bytes(
          sum(x.size for x in jax.tree.leaves(abstract_state.params)),
          len(devices) // num_slices), packing=run_config.packed_layout(config, phase),
      estimate=estimate)


def _count_chips(devices) -> int:
  coords = {(getattr(d, "slice_index", 0),) + tuple(getattr(d, "coords", (d.id,)))
            for d in devices}
  return len(coords)


def print_aot(r: AotResult):
  slices = f"{r.num_slices} slices of " if r.num_slices > 1 else ""
  print(f"topology        {slices}{r.topology or 'this machine'} ({r.chips} chips, "
        f"{r.devices} devices, {r.device_kind})")
  print(f"mesh            {r.mesh}")
  packed = ("" if r.packing is None else
            f", packed into {r.rows} rows of up to {r.packing.max_examples_per_row} examples "
            f"and {r.packing.max_predictions_per_row} predictions")
  print(f"phase           {r.phase}: batch {r.global_batch_size} x {r.seq_len}{packed}, "
        f"attention {r.attention}")
  print(f"compile time    {r.compile_seconds:.1f} s")
  print(f"per device      arguments {gib(r.argument_bytes)}, temporaries "
        f"{gib(r.temp_bytes)}, outputs not aliased {gib(r.unaliased_output_bytes)}")
  nominal = f"{gib(r.nominal_hbm_bytes)} nominal" if r.nominal_hbm_bytes else "nominal unknown"
  memory = "HBM" if r.topology else "memory"
  if r.hbm_bytes:
    hbm = (f" of {gib(r.hbm_bytes)} available {memory} ({nominal}): "
           f"{'fits' if r.fits else 'does not fit'}")
  else:
    hbm = f" (available {memory} unknown; {nominal})"
  print(f"per device      {gib(r.total_bytes)} in all{hbm}")
  if r.compiled_flops:
    print(f"FLOPs per step  XLA {r.compiled_flops * r.devices:.4g} (all devices), analytic "
          f"as XLA counts {r.xla_view_flops:.4g} (ratio "
          f"{r.compiled_flops * r.devices / r.xla_view_flops:.3f}), analytic model FLOPs "
          f"{r.analytic_flops:.4g}")
  if r.dcn is not None:
    print(f"DCN per device  {mib(r.dcn.bytes_per_step)} sent per step by "
          f"{r.dcn.sends} megascale sends {r.dcn.by_type} (from the compiled program; "
          f"{r.dcn.uncounted_loops} loops of unknown trip count counted once); analytic "
          f"hierarchical all-reduce of the fp32 gradients: {mib(r.gradient_allreduce_bytes)}")
  print(f"XLA loops       {r.while_loops} while loops in the optimized program (XLA counts "
        "each body once; scanned layers make a forward and a backward loop, and on TPU "
        "FSDP's all-gathered matmuls may become windowed-einsum loops)")
  if r.estimate is not None:
    for line in estimate_lib.describe(r.estimate):
      print(f"estimate        {line.strip()}")
