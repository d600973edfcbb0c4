"""The fit check: each compile of a pretraining config's phases, or of a fine-tuning
config's step, told as one line.

A line says whether the step fits, the memory one device needs against what
it may use, and, where it does not fit, the fields to change. The compiles
are aot.aot_compile's (pretraining, with its details printed before the
line) and finetune.compile_step's; with `find_max_batch` each phase also
gets max_batch's largest per-device batch that fits.
"""

import dataclasses
import itertools
from typing import Callable, Sequence

import jax

from bertjax.fit import aot
from bertjax.fit import finetune
from bertjax.fit import max_batch as max_batch_lib
from bertjax.fit import topology as topology_lib
from bertjax.train import step_setup
from bertjax.train.step_setup import gib


@dataclasses.dataclass
class Verdict:
  """One compile's answer: the memory one device needs and what it may use."""
  label: str  # What was compiled: a phase, or a task's step.
  needed_bytes: int  # Per device; where the compiler stopped, what its message names.
  available_bytes: int | None  # What a program may use on one device; None: unknown.
  parts: str  # The needed bytes in parts (arguments, temporaries, ...).
  ways_to_fit: str  # The fields to change where it does not fit.
  stopped: str = ""  # The compiler's first line where it ran out of HBM.

  @property
  def fits(self) -> bool | None:
    if self.stopped:
      return False
    if self.available_bytes is None:
      return None
    return self.needed_bytes <= self.available_bytes

  def line(self) -> str:
    if self.fits is None:
      return (f"{self.label}: {gib(self.needed_bytes)} per device ({self.parts}); the "
              "memory a device may use is unknown (its backend reports none): give "
              "--available_gib to check against a figure")
    available = "an unknown amount" if self.available_bytes is None else gib(
        self.available_bytes)
    if self.stopped:
      parts = f" ({self.parts})" if self.parts else ""
      of = (f"the compiler ran out of HBM{parts}, {available} available "
            f"({self.stopped[:200]})")
    else:
      of = f"{gib(self.needed_bytes)} per device ({self.parts}) of {available} available"
    if self.fits:
      return f"{self.label}: fits: {of}"
    return f"{self.label}: does not fit: {of}; to fit, {self.ways_to_fit}"


def pretraining(make_config: Callable[[], object], *, topology: str, phases: Sequence[str],
                accums: Sequence[int], num_slices: int = 1, vocab_size: int = 30522,
                available_bytes: int | None = None, find_max_batch: bool = False,
                mosaic_dump: str | None = None, remats: Sequence[str] = (),
                out: Callable[[str], None] = print) -> list[Verdict]:
  """Compiles the train step of each phase (at each grad_accum_steps of `accums`;
  none: the config's) and each remat policy of `remats` (set as the phase's;
  none: the config's) of `make_config()`, a fresh run config each call; with
  `mosaic_dump` (aot.aot_compile's) each compile's details end with the
  compiler's estimate of the step."""
  verdicts = []
  for phase in phases:
    for accum, remat in itertools.product(accums or [None], remats or [None]):
      def fresh(accum=accum, remat=remat):
        config = make_config()
        if accum is not None:
          config.optimizer.grad_accum_steps = accum
        if remat is not None:
          config.phases[phase].remat_policy = remat
        return config
      label = " ".join([phase] + ([f"grad_accum_steps={accum}"] if accum is not None else [])
                       + ([f"remat_policy={remat}"] if remat is not None else []))
      ways = step_setup.ways_to_fit(phase, "" if topology else jax.devices()[0].platform)
      try:
        r = aot.aot_compile(fresh(), topology, phase, vocab_size=vocab_size,
                            num_slices=num_slices, available_bytes=available_bytes,
                            mosaic_dump=mosaic_dump)
      except jax.errors.JaxRuntimeError as e:
        if not topology_lib.is_out_of_memory(e):
          raise
        verdicts.append(Verdict(label, 0, available_bytes or topology_lib.available_bytes(
            topology), "", ways, str(e).splitlines()[0]))
        out(verdicts[-1].line())
        continue
      aot.print_aot(r)
      verdicts.append(Verdict(label, r.total_bytes, r.hbm_bytes, _parts(
          r.argument_bytes, r.temp_bytes, r.unaliased_output_bytes), ways))
      out(verdicts[-1].line())
      if find_max_batch:
        out(_max_batch_line(fresh, r, label, topology, phase, num_slices, vocab_size,
                            available_bytes, ways))
  return verdicts


def _max_batch_line(make_config, known: aot.AotResult, label: str, topology: str,
                    phase: str, num_slices: int, vocab_size: int,
                    available_bytes: int | None, ways: str) -> str:
  """The largest per-device batch of `phase` that fits, searched from the compile `known`."""
  data_parallel = max(1, known.mesh["data"] * known.mesh["fsdp"])
  best, result, _ = max_batch_lib.find_max_batch(
      make_config, topology, phase, known.rows // data_parallel, known=known,
      vocab_size=vocab_size, num_slices=num_slices, available_bytes=available_bytes)
  if result is None:
    step = max_batch_lib.search_step(make_config())
    return (f"{label}: no per-device batch of {step} or more fits (or the memory available "
            f"is unknown); to fit, {ways}")
  aot.print_aot(result)
  config = make_config()
  examples = max_batch_lib.examples_for_rows(config, best)
  packed = ("" if max_batch_lib.packing_factor(config) is None else
            f" packed rows, {examples} examples at data.packing_factor="
            f"{config.data.packing_factor}")
  return (f"{label}: largest per-device batch that fits: {best}{packed} (global batch "
          f"{max_batch_lib.examples_for_rows(config, best * data_parallel)}, "
          f"{gib(result.total_bytes)} per device of {gib(result.hbm_bytes)} available)")


def finetuning(config, *, topology: str, accums: Sequence[int], vocab_size: int = 30522,
               available_bytes: int | None = None,
               out: Callable[[str], None] = print) -> list[Verdict]:
  """Compiles a fine-tuning config's train step at each grad_accum_steps of `accums`
  (none: the config's)."""
  verdicts = []
  for accum in accums or [config.optimizer.grad_accum_steps]:
    r = finetune.compile_step(config.copy_and_resolve_references(), topology, accum,
                              vocab_size, available_bytes)
    label = (f"{config.task} step (L={config.model.num_layers} H={config.model.hidden_size}, "
             f"batch {r.global_batch_size} x {r.max_seq_length}) grad_accum_steps={accum}")
    ways = ("split each step's batch with --config.optimizer.grad_accum_steps="
            f"{2 * accum} (or more), lower --config.global_batch_size or "
            "--config.max_seq_length, or run on more devices")
    if r.out_of_memory:
      verdict = Verdict(label, r.temp_bytes, r.hbm_bytes,
                        f"temporaries alone {gib(r.temp_bytes)}" if r.temp_bytes else "",
                        ways, r.out_of_memory.splitlines()[0])
    else:
      verdict = Verdict(label, r.total_bytes, r.hbm_bytes, _parts(
          r.argument_bytes, r.temp_bytes, r.unaliased_output_bytes), ways)
    verdicts.append(verdict)
    out(verdict.line())
  return verdicts


def _parts(arguments: int, temporaries: int, outputs: int) -> str:
  return (f"arguments {gib(arguments)}, temporaries {gib(temporaries)}, outputs not "
          f"aliased {gib(outputs)}")
