"""Measures the steady-state train step on synthetic data, or compiles it for a TPU slice.

  python -m bertjax.benchmark --config=configs/base.py --phase=seq128 --steps=20

prints compile time, step time, sequences/s, tokens/s and utilisation (MFU
from the analytic model FLOPs, HFU from XLA's count where it is complete; with
--compile_cache_dir the compile is loaded from that cache when it holds the
step). With --topology (e.g. v5e:2x4, v4:2x2x1) it instead compiles the step
ahead of time for that TPU slice on this machine (needs `pip install
jax[tpu]` and JAX_PLATFORMS=cpu) and prints the per-device memory the program
needs, whether it fits the HBM that the compiler lets a program use on one
device of that slice, and XLA's FLOPs against the analytic count, which
shows that it compiles and fits before any TPU is booked; --find_max_batch
searches for the largest per-device batch that fits. With --num_slices=N it
compiles for N such slices joined by the data-center network (DCN) and also
prints the bytes each device sends over the DCN per step, read from the
compiled program (bertjax/benchmarks/dcn_traffic.py), beside the analytic
gradient all-reduce.
With --config.data.packing=True the compile is of the packed train step:
its batch has the rows, fields and shapes that the input pipeline packs a
global batch into (run_config.batch_shapes), and --find_max_batch searches
the packed rows per device. The timed run has no packed synthetic data and
refuses packing.
bertjax/benchmarks/tpu_fit_table.py runs this over configs and slices."""

import dataclasses
import fractions
import math
import time
from typing import NamedTuple

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from bertjax.benchmarks import dcn_traffic
from bertjax.benchmarks import tpu_topology
from bertjax.input import packing as packing_lib
from bertjax.input.synthetic import SyntheticSource
from bertjax.model import attention
from bertjax.model.bert import BertForPreTraining
from bertjax.train import flops
from bertjax.train import optimizer as opt_lib
from bertjax.train import profiling
from bertjax.train import run_config
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config file.",
                                          lock_config=True)
_PHASE = flags.DEFINE_string("phase", "", "Phase to measure (default: the first).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps after the warm-up.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
_TOPOLOGY = flags.DEFINE_string("topology", "", "Compile ahead of time for this TPU "
                                "topology (e.g. v5e:2x2) instead of running.")
_NUM_SLICES = flags.DEFINE_integer(
    "num_slices", 1, "With --topology: compile for this many slices of it, joined by the "
    "data-center network (config.mesh.dcn_* split the mesh across them).")
_VOCAB = flags.DEFINE_integer("vocab_size", 30522, "Vocab size when config.model.vocab_size is 0.")
_CACHE = flags.DEFINE_string(
    "compile_cache_dir", "", "Persistent compilation cache directory; a second run with "
    "the same config loads the step from it.")
_FIND_MAX_BATCH = flags.DEFINE_bool(
    "find_max_batch", False, "With --topology: search for the largest per-device batch "
    "that fits the HBM available on a device (one ahead-of-time compile per try).")


def build(config, devices, *, phase_name: str = "", vocab_size: int = 30522,
          device_mesh: bool = False, compile_only: bool = False):
  """(model config, phase, mesh, rules, model, optimizer) for a run config on `devices`.

  The benchmark reads no files: the data source becomes synthetic.
  `compile_only`: the step is compiled, never run, so the config may pack
  (run_config.validate). With `device_mesh` the devices are laid out in the
  given order within each slice (topology devices have no physical layout
  to optimise for).
  """
  config.data.source = "synthetic"
  config.data.demo_dir = ""
  vocab = config.model.vocab_size or vocab_size
  slices, _ = sharding_lib.device_slices(devices, config.mesh)
  model_config = run_config.validate(config, num_devices=len(devices), vocab_size=vocab,
                                     num_slices=len(slices), compile_only=compile_only)
  plan = run_config.phases(config)
  phase = next((p for p in plan if p.name == phase_name), None) if phase_name else plan[0]
  if phase is None:
    raise app.UsageError(f"--phase={phase_name}: not one of {[p.name for p in plan]}")
  mesh = jax.sharding.Mesh(
      sharding_lib.listed_device_array(
          slices, *sharding_lib.hybrid_mesh_shape(config.mesh, len(devices), len(slices))),
      sharding_lib.MESH_AXES) if device_mesh else sharding_lib.make_mesh(config.mesh, devices)
  rules = sharding_lib.rules(config.mesh)
  schedule = opt_lib.learning_rate_schedule(
      config.optimizer, config.total_steps, [p.start for p in plan] + [plan[-1].end],
      [p.warmup_steps for p in plan])
  tx = opt_lib.make_optimizer(config.optimizer, schedule)
  return model_config, phase, mesh, rules, BertForPreTraining(model_config), tx


def _gib(n):
  return f"{n / 2**30:.2f} GiB"


def _mib(n):
  return f"{n / 2**20:.1f} MiB"


@dataclasses.dataclass
class AotResult:
  """What an ahead-of-time compile for a TPU slice tells (bytes and FLOPs per device)."""
  topology: str
  devices: int  # JAX devices: one per chip (see tpu_topology.topology_devices).
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
  # HBM the compiler lets a program use on one device (tpu_topology); None: unknown.
  hbm_bytes: int | None = None
  num_slices: int = 1  # Slices of `topology` (devices, chips and mesh count all of them).
  dcn: dcn_traffic.DcnTraffic | None = None  # What one device sends over the DCN per step.
  gradient_allreduce_bytes: int = 0  # Analytic DCN bytes per device (dcn_traffic.gradient_allreduce_bytes).
  packing: packing_lib.Packing | None = None  # The packed rows of the global batch; None: unpacked.

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
    gib = flops.hbm_gib(self.device_kind)
    return None if gib is None else int(gib * 2**30 * self.chips / self.devices)

  @property
  def fits(self) -> bool | None:
    """Whether the memory XLA's analysis reports is within the compiler's available HBM."""
    return None if self.hbm_bytes is None else self.total_bytes <= self.hbm_bytes


def flops_as_xla_counts(model_config, seq_len, num_predictions, batch, attention_kernel,
                        grad_accum_steps=1, num_examples=1) -> float:
  """The analytic FLOPs of what XLA's cost analysis sees of one step of `batch`
  rows (each with `num_examples` [CLS] slots, flops.forward_flops_per_sequence).

  XLA counts a loop body once: with scanned layers one of the L - 1 layers
  before the last (which runs outside the loop), with gradient accumulation
  one micro-batch. Pallas kernels (splash) are custom calls it does not
  count: the attention matmuls of the layers before the last are left out
  (the last layer, at a few positions, attends with XLA).
  """
  c = model_config
  if c.scan_layers:
    c = c.replace(num_layers=min(2, c.num_layers))
  per_seq = flops.train_flops_per_sequence(c, seq_len, num_predictions, num_examples)
  if attention_kernel == "splash":
    per_seq -= 3 * (c.num_layers - 1) * seq_len * 2 * 2 * seq_len * c.hidden_size
  return per_seq * batch / grad_accum_steps


def aot_compile(config, topology: str, phase_name: str = "",
                global_batch_size: int | None = None, vocab_size: int = 30522,
                num_slices: int = 1) -> AotResult:
  """Compiles the train step ahead of time for `num_slices` slices of a TPU topology (e.g. v5e:2x4).

  `global_batch_size` (examples; default the phase's) is packed into
  global_batch_size / data.packing_factor rows where data.packing is on.
  """
  devices = tpu_topology.topology_devices(topology, num_slices)
  if global_batch_size:
    config.phases[phase_name or next(iter(config.phases))].global_batch_size = global_batch_size
  model_config, phase, mesh, rules, model, tx = build(
      config, devices, phase_name=phase_name, vocab_size=vocab_size, device_mesh=True,
      compile_only=True)
  accum = config.optimizer.grad_accum_steps
  kernel, _ = attention.choose(
      model_config.attention_impl, attention_dropout_rate=model_config.attention_dropout_rate,
      dtype=model_config.dtype, platform="tpu", seq_len=phase.max_seq_length,
      deterministic=False)
  with sharding_lib.mesh_context(mesh, rules):
    abstract_state, shardings = state_lib.abstract_train_state(model, tx, mesh, rules)
    batch = batch_specs(config, phase, sharding_lib.batch_sharding(mesh))
    rng = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                               sharding=sharding_lib.replicated(mesh))
    t0 = time.perf_counter()
    step_fn = step_lib.jit_train_step(shardings, mesh, grad_accum_steps=accum)
    compiled = step_fn.lower(abstract_state, batch, rng).compile()
    seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  rows, predictions, examples = run_config.row_slots(config, phase)
  length = phase.max_seq_length
  dcn = dcn_traffic.dcn_traffic(compiled.as_text()) if num_slices > 1 else None
  return AotResult(
      topology=topology, devices=len(devices), chips=_count_chips(devices),
      device_kind=devices[0].device_kind,
      mesh=dict(mesh.shape), phase=phase.name, global_batch_size=phase.global_batch_size,
      seq_len=phase.max_seq_length, attention=kernel, compile_seconds=seconds,
      argument_bytes=mem.argument_size_in_bytes, temp_bytes=mem.temp_size_in_bytes,
      unaliased_output_bytes=mem.output_size_in_bytes - mem.alias_size_in_bytes,
      compiled_flops=profiling.compiled_flops(compiled),
      while_loops=profiling.count_loops(compiled) or 0,
      analytic_flops=flops.train_flops_per_sequence(model_config, length, predictions,
                                                    examples) * rows,
      xla_view_flops=flops_as_xla_counts(model_config, length, predictions, rows, kernel,
                                         accum, examples),
      hbm_bytes=tpu_topology.available_hbm_bytes(topology), num_slices=num_slices,
      dcn=dcn, gradient_allreduce_bytes=dcn_traffic.gradient_allreduce_bytes(
          sum(x.size for x in jax.tree.leaves(abstract_state.params)),
          len(devices) // num_slices), packing=run_config.packed_layout(config, phase))


def batch_specs(config, phase: run_config.Phase, sharding) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batch of `phase` as the input pipeline yields it, as abstract
  arrays: packed rows and fields where data.packing is on."""
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
          for k, (shape, dtype) in run_config.batch_shapes(config, phase).items()}


def _count_chips(devices) -> int:
  coords = {(getattr(d, "slice_index", 0),) + tuple(getattr(d, "coords", (d.id,)))
            for d in devices}
  return len(coords)


MAX_SEARCHED_BATCH = 65536  # Per device; the search stops here.
BATCH_STEP = 8  # The search's resolution: per-device batches are multiples of this.


def _packing_factor(config) -> fractions.Fraction | None:
  """data.packing_factor as a fraction (None without packing)."""
  data = config.get("data", {})
  if not data.get("packing", False):
    return None
  return fractions.Fraction(float(data.packing_factor)).limit_denominator(1000)


def search_step(config) -> int:
  """The search's resolution in rows per device: BATCH_STEP, or with packing
  its least multiple that holds a whole number of examples at
  data.packing_factor (8 at 1.25, 40 at 1.1)."""
  factor = _packing_factor(config)
  return BATCH_STEP if factor is None else math.lcm(BATCH_STEP, factor.denominator)


def examples_for_rows(config, rows: int) -> int:
  """The global batch size (examples) whose step has `rows` rows:
  rows x data.packing_factor with packing."""
  factor = _packing_factor(config)
  return rows if factor is None else int(rows * factor)


class MaxBatch(NamedTuple):
  """find_max_batch's answer: the batch, its compile, and memory per row near it."""
  batch: int  # Largest per-device batch that fits, in rows (packed rows with packing; 0: none).
  result: AotResult | None  # The compile at `batch`.
  bytes_per_item: float | None  # Memory per row, from the two compiles nearest it.


def find_max_batch(make_config, topology: str, phase_name: str, start: int,
                   log=print, known: AotResult | None = None,
                   per_item_hint: float | None = None, vocab_size: int = 30522,
                   num_slices: int = 1, guess: int | None = None) -> MaxBatch:
  """Largest per-device batch (a multiple of search_step) that fits: search over compiles.

  `make_config()` gives a fresh run config (`vocab_size` and `num_slices`
  as in aot_compile; vocab_size is used where its model.vocab_size is 0);
  the batch per device is the rows of the step per data-parallel device
  (global batch / (mesh.data x mesh.fsdp); with data.packing, packed rows,
  each compiled with rows x data.packing_factor examples: examples_for_rows),
  and the search starts from a compile at `start` (`known`, when that
  compile is already done). Memory is close to linear in the batch: the first compile
  predicts the answer, from `per_item_hint` (bytes per sequence, e.g. a
  similar search's bytes_per_item) and then the neighbouring batch is
  compiled too, or else as if all but the arguments (parameters and
  optimizer state) grew with the batch. A `guess` (a per-device batch, e.g.
  the answer of a search of the same config and phase on one slice) takes
  the place of that prediction, neighbour included: a right guess costs two
  compiles beyond `known` (one when it is `start`). A compile at that
  prediction fits a line, the line predicts again and compiles around the
  prediction confirm it. The answer is always bracketed by a compile that
  fits and one (search_step larger) that does not; where the predictions
  were off, the bracket narrows by interpolating between its ends
  (bisecting when that did not halve it). The hint and the guess change how
  many compiles that takes, not the answer. A compile that the compiler
  itself stops for lack of HBM (RESOURCE_EXHAUSTED) counts as one that does
  not fit.
  """
  tried: dict[int, AotResult | None] = {}  # None: the compiler ran out of HBM.
  step = search_step(make_config())

  def compile_at(per_device: int) -> AotResult | None:
    if per_device not in tried:
      config = make_config()
      dp = math.prod(sharding_lib.mesh_shape(
          config.mesh, _num_devices(topology, num_slices), num_slices)[:2])
      try:
        tried[per_device] = aot_compile(config, topology, phase_name,
                                        examples_for_rows(config, per_device * dp),
                                        vocab_size=vocab_size, num_slices=num_slices)
        log(f"  per-device batch {per_device}: {_gib(tried[per_device].total_bytes)} -> "
            f"{'fits' if tried[per_device].fits else 'does not fit'}")
      except jax.errors.JaxRuntimeError as e:
        if not tpu_topology.is_out_of_memory(e):
          raise
        tried[per_device] = None
        log(f"  per-device batch {per_device}: the compiler ran out of HBM -> does not fit")
    return tried[per_device]

  def fits(n: int) -> bool:
    return tried[n] is not None and tried[n].fits

  def to_batch(x: float) -> int:
    return int(min(max(x, step), MAX_SEARCHED_BATCH)) // step * step

  a = max(step, start // step * step)
  if known is not None and start == a:
    tried[a] = known
  ra = compile_at(a)
  while ra is None and a > step:  # Start where the compiler gets through.
    a = max(step, a // 2 // step * step)
    ra = compile_at(a)
  if ra is None or ra.hbm_bytes is None:
    return MaxBatch(0, None, None)
  hbm = ra.hbm_bytes
  growing = ra.total_bytes - ra.argument_bytes
  if guess:
    b = to_batch(guess)
  elif per_item_hint:
    b = to_batch(a + (hbm - ra.total_bytes) / per_item_hint)
  else:
    b = to_batch(a * (hbm - ra.argument_bytes) / growing) if growing > 0 else 2 * a
  if b == a:
    b = a + step if ra.fits else max(step, a - step if guess else a // 2 // step * step)
  if b == a:  # a == step and it does not fit.
    return MaxBatch(0, None, None)
  rb = compile_at(b)
  if guess or per_item_hint:  # An informed guess is usually within a step: try its neighbour.
    neighbour = b + step if fits(b) else b - step
    if neighbour >= step:
      compile_at(neighbour)
  guess = None
  if rb is not None:
    (a1, r1), (b1, r2) = sorted([(a, ra), (b, rb)], key=lambda t: t[0])
    per_item = (r2.total_bytes - r1.total_bytes) / (b1 - a1)
    guess = (to_batch(a1 + (hbm - r1.total_bytes) / per_item) if per_item > 0
             else MAX_SEARCHED_BATCH)
  lo, hi = 0, None  # lo fits (0: nothing yet); hi does not.
  for n in sorted(tried):
    if fits(n):
      lo = max(lo, n)
    elif hi is None or n < hi:
      hi = n
  for probe in (() if guess is None else (guess, guess + step)):
    if lo < probe and (hi is None or probe < hi):
      compile_at(probe)
      lo, hi = (probe, hi) if fits(probe) else (lo, probe)
  while hi is None and lo < MAX_SEARCHED_BATCH:
    # Still fitting above the line's guess: extrapolate from the two largest
    # fitting compiles (at least one step, at most doubling).
    below = max(n for n in tried if n < lo)
    slope = (tried[lo].total_bytes - tried[below].total_bytes) / (lo - below)
    room = (hbm - tried[lo].total_bytes) / slope if slope > 0 else lo
    probe = min(max(lo + step, int(lo + room) // step * step), lo * 2, MAX_SEARCHED_BATCH)
    compile_at(probe)
    lo, hi = (probe, None) if fits(probe) else (lo, probe)
  interpolate = True
  while hi is not None and hi - lo > step:
    # Between a fit and a miss: where the line through both meets the HBM,
    # or the midpoint after a step that did not halve the interval.
    mid = (lo + hi) // 2
    if interpolate and lo and tried[hi] is not None:
      slope = (tried[hi].total_bytes - tried[lo].total_bytes) / (hi - lo)
      if slope > 0:
        mid = lo + int((hbm - tried[lo].total_bytes) / slope)
    mid = min(max(lo + step, mid // step * step), hi - step)
    compile_at(mid)
    width = hi - lo
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    interpolate = 2 * (hi - lo) <= width
  measured = sorted((n for n in tried if tried[n] is not None), key=lambda n: abs(n - lo))
  per_item = None
  if len(measured) >= 2:
    (n0, r0), (n1, r1) = sorted((n, tried[n]) for n in measured[:2])
    per_item = (r1.total_bytes - r0.total_bytes) / (n1 - n0)
  return MaxBatch(lo, tried.get(lo), per_item if per_item and per_item > 0 else None)


def _num_devices(topology: str, num_slices: int = 1) -> int:
  return len(tpu_topology.topology_devices(topology, num_slices))


def print_aot(r: AotResult):
  slices = f"{r.num_slices} slices of " if r.num_slices > 1 else ""
  print(f"topology        {slices}{r.topology} ({r.chips} chips, {r.devices} devices, "
        f"{r.device_kind})")
  print(f"mesh            {r.mesh}")
  packed = ("" if r.packing is None else
            f", packed into {r.rows} rows of up to {r.packing.max_examples_per_row} examples "
            f"and {r.packing.max_predictions_per_row} predictions")
  print(f"phase           {r.phase}: batch {r.global_batch_size} x {r.seq_len}{packed}, "
        f"attention {r.attention}")
  print(f"compile time    {r.compile_seconds:.1f} s")
  print(f"per device      arguments {_gib(r.argument_bytes)}, temporaries "
        f"{_gib(r.temp_bytes)}, outputs not aliased {_gib(r.unaliased_output_bytes)}")
  nominal = f"{_gib(r.nominal_hbm_bytes)} nominal" if r.nominal_hbm_bytes else "nominal unknown"
  if r.hbm_bytes:
    hbm = (f" of {_gib(r.hbm_bytes)} available HBM ({nominal}): "
           f"{'fits' if r.fits else 'does not fit'}")
  else:
    hbm = f" (available HBM unknown; {nominal})"
  print(f"per device      {_gib(r.total_bytes)} in all{hbm}")
  if r.compiled_flops:
    print(f"FLOPs per step  XLA {r.compiled_flops * r.devices:.4g} (all devices), analytic "
          f"as XLA counts {r.xla_view_flops:.4g} (ratio "
          f"{r.compiled_flops * r.devices / r.xla_view_flops:.3f}), analytic model FLOPs "
          f"{r.analytic_flops:.4g}")
  if r.dcn is not None:
    print(f"DCN per device  {_mib(r.dcn.bytes_per_step)} sent per step by "
          f"{r.dcn.sends} megascale sends {r.dcn.by_type} (from the compiled program; "
          f"{r.dcn.uncounted_loops} loops of unknown trip count counted once); analytic "
          f"hierarchical all-reduce of the fp32 gradients: {_mib(r.gradient_allreduce_bytes)}")
  print(f"XLA loops       {r.while_loops} while loops in the optimized program (XLA counts "
        "each body once; scanned layers make a forward and a backward loop, and on TPU "
        "FSDP's all-gathered matmuls may become windowed-einsum loops)")


def compile_for_topology(config):
  """Ahead-of-time compile for a TPU slice; prints per-device memory and FLOPs."""
  if _FIND_MAX_BATCH.value:
    config_copy = config.copy_and_resolve_references()
    slices = _NUM_SLICES.value
    dp = math.prod(sharding_lib.mesh_shape(
        config.mesh, _num_devices(_TOPOLOGY.value, slices), slices)[:2])
    phase = _PHASE.value or next(iter(config.phases))
    factor = _packing_factor(config) or 1
    best, result, _ = find_max_batch(lambda: config_copy.copy_and_resolve_references(),
                                     _TOPOLOGY.value, phase,
                                     int(config.phases[phase].global_batch_size / factor) // dp,
                                     vocab_size=_VOCAB.value, num_slices=slices)
    packed = ("" if factor == 1 else f" packed rows, {examples_for_rows(config, best)} examples "
              f"at data.packing_factor={config.data.packing_factor}")
    print(f"largest per-device batch that fits: {best}{packed}")
    if result is not None:
      print_aot(result)
    return
  print_aot(aot_compile(config, _TOPOLOGY.value, _PHASE.value, vocab_size=_VOCAB.value,
                        num_slices=_NUM_SLICES.value))


def run_benchmark(config):
  if config.data.get("packing", False):
    raise app.UsageError(
        "--config.data.packing=True: the timed run has unpacked synthetic batches only; add "
        "--topology=... to compile the packed step for a TPU slice, or time it on records "
        "with python -m bertjax.benchmarks.packing_bench")
  devices = jax.devices()
  model_config, phase, mesh, rules, model, tx = build(
      config, devices, phase_name=_PHASE.value, vocab_size=_VOCAB.value)
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
  source = SyntheticSource(phase.global_batch_size, max_seq_length=phase.max_seq_length,
                           max_predictions_per_seq=phase.max_predictions_per_seq,
                           vocab_size=model_config.vocab_size, seed=0,
                           process_index=jax.process_index(),
                           process_count=jax.process_count())
  batch_s = sharding_lib.batch_sharding(mesh)
  batch = {k: jax.make_array_from_process_local_data(batch_s, v)
           for k, v in source.batch(0).items()}
  rng = jax.random.key(1)
  with sharding_lib.mesh_context(mesh, rules):
    t0 = time.perf_counter()
    step_fn = step_lib.jit_train_step(
        shardings, mesh, grad_accum_steps=config.optimizer.grad_accum_steps)
    step_fn = step_fn.lower(state, batch, rng).compile()
    compile_s = time.perf_counter() - t0
    for _ in range(_WARMUP.value):
      state, metrics = step_fn(state, batch, rng)
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for _ in range(_STEPS.value):
      state, metrics = step_fn(state, batch, rng)
    jax.block_until_ready(metrics)
    seconds = (time.perf_counter() - t0) / _STEPS.value
  seqs = phase.global_batch_size / seconds
  peak = config.logging.peak_tflops or flops.peak_tflops(devices[0].device_kind)
  util = profiling.utilisation(
      step_seconds=seconds, num_chips=len(devices), peak_tflops_per_chip=peak,
      model_config=model_config, seq_len=phase.max_seq_length,
      num_predictions=phase.max_predictions_per_seq,
      global_batch_size=phase.global_batch_size,
      compiled_step_flops=profiling.whole_step_flops(step_fn),
      grad_accum_steps=config.optimizer.grad_accum_steps)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  print(f"devices         {len(devices)} x {devices[0].device_kind}, mesh {dict(mesh.shape)}")
  print(f"model           {n_params / 1e6:.1f}M parameters, dtype {model_config.dtype}, "
        f"remat {model_config.remat_policy}, attention_impl {model_config.attention_impl}")
  print(f"phase           {phase.name}: batch {phase.global_batch_size} x "
        f"{phase.max_seq_length}, {phase.max_predictions_per_seq} predictions")
  print(f"compile time    {compile_s:.1f} s")
  print(f"step time       {seconds * 1e3:.1f} ms (mean of {_STEPS.value})")
  print(f"sequences/s     {seqs:.1f}")
  print(f"tokens/s        {seqs * phase.max_seq_length:.0f}")
  print(f"model TFLOP/s   {flops.train_flops_per_sequence(model_config, phase.max_seq_length, phase.max_predictions_per_seq) * seqs / 1e12:.2f}")
  mfu_text = hfu_text = "n/a (unknown peak for this device)"
  if util:
    mfu_text = f"{100 * util['mfu']:.1f}% (analytic model FLOPs)"
    hfu_text = (f"{100 * util['hfu']:.1f}% (XLA's hardware FLOPs)" if "hfu" in util
                else "n/a (no XLA count of the whole step: it has loops, or the "
                "backend gives no cost analysis)")
  print(f"MFU             {mfu_text}")
  print(f"HFU             {hfu_text}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config=configs/base.py")
  if _CACHE.value:
    profiling.enable_compilation_cache(_CACHE.value)
  if _TOPOLOGY.value:
    compile_for_topology(_CONFIG.value)
  else:
    run_benchmark(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
