"""`python -m bertjax.fit`: whether a config's train step fits a TPU slice, before it
is booked, or this machine's devices, before a run.

  pip install "jax[tpu]"
  JAX_PLATFORMS=cpu python -m bertjax.fit --config=configs/large.py --topology=v5p:2x2x2

compiles each phase's train step ahead of time for the topology on this
machine (libtpu describes its devices; no TPU is needed) and prints the
compile's details, then one line per phase: fits or does not fit, the memory
one device needs against what the compiler lets a program use on one, and
what to change where it does not fit. For a TPU topology the details end
with the TPU compiler's estimate of the step's time and MFU (its cost model,
summed over the compiled program: not a measurement; --noestimate leaves it
out). The exit status is 1 where a step does not fit. With a fine-tuning config (one with a `task`) it checks the task's
train step at the config's batch and length. docs/fit.md has the flags and
an example of the output; `python -m bertjax.fit.table` builds the fit table
over configs and slices (docs/fit-table.md).
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from bertjax.fit import check
from bertjax.fit import estimate as estimate_lib
from bertjax.fit import finetune
from bertjax.fit import topology as topology_lib
from bertjax.model.config import REMAT_POLICIES
from bertjax.train import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Pretraining config (configs/large.py) or fine-tuning config "
    "(configs/finetune/squad.py) file.", lock_config=True)
_TOPOLOGY = flags.DEFINE_string(
    "topology", "", "TPU topology to compile for on this machine, e.g. v5p:2x2x2 or "
    "v5e:2x4 (needs libtpu); empty: this machine's own devices.")
_NUM_SLICES = flags.DEFINE_integer(
    "num_slices", 1, "Pretraining, with --topology: this many slices of it, joined by the "
    "data-center network (config.mesh.dcn_* split the mesh across them).")
_PHASE = flags.DEFINE_string("phase", "", "Pretraining: the phase to check (default: each).")
_ACCUM = flags.DEFINE_list(
    "grad_accum_steps", [], "Compile once per value of optimizer.grad_accum_steps, e.g. "
    "1,2,4 (default: the config's).")
_REMAT = flags.DEFINE_list(
    "remat_policy", [], "Pretraining: compile once per activation-recomputation policy, "
    "set as each phase's (none, full, dots, dots_no_batch), e.g. none,dots_no_batch "
    "(default: the config's).")
_FIND_MAX_BATCH = flags.DEFINE_bool(
    "find_max_batch", False, "Pretraining: also search each phase's largest per-device "
    "batch that fits (one compile per try).")
_AVAILABLE_GIB = flags.DEFINE_float(
    "available_gib", 0.0, "Memory a program may use on one device, in GiB, in place of "
    "the compiler's or the device's figure (0: theirs; the CPU gives none).")
_LARGE = flags.DEFINE_bool(
    "large", False, "Fine-tuning: BERT-LARGE's sizes (L=24, H=1024, A=16, F=4096) "
    "instead of the config's.")
_ESTIMATE = flags.DEFINE_bool(
    "estimate", True, "Pretraining, with a TPU --topology: also print the TPU compiler's "
    "estimate of each step's time and MFU (bertjax/fit/estimate.py; its cost model, not a "
    "measurement).")
_VOCAB = flags.DEFINE_integer(
    "vocab_size", 30522, "Vocab size where config.model.vocab_size is 0 (the uncased "
    "release's).")


def _accums() -> list[int]:
  values = []
  for text in _ACCUM.value:
    if not text.isdigit() or int(text) < 1:
      raise app.UsageError(f"--grad_accum_steps: {text!r} is not a positive integer")
    values.append(int(text))
  return values


def _remats() -> list[str]:
  for policy in _REMAT.value:
    if policy not in REMAT_POLICIES:
      raise app.UsageError(f"--remat_policy: {policy!r} is not one of {REMAT_POLICIES}")
  return list(_REMAT.value)


def _devices(topology: str, num_slices: int) -> list:
  if num_slices < 1 or (num_slices > 1 and not topology):
    raise app.UsageError(f"--num_slices={num_slices}: give 1, or more with --topology")
  try:
    return topology_lib.devices(topology, num_slices)
  except RuntimeError as e:
    if not topology:
      raise
    raise app.UsageError(
        f"--topology={topology}: {str(e).splitlines()[0]} (compiling for a TPU topology "
        "needs libtpu: pip install \"jax[tpu]\", and JAX_PLATFORMS=cpu)") from None


def main(argv) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=configs/large.py")
  if _AVAILABLE_GIB.value < 0:
    raise app.UsageError(f"--available_gib={_AVAILABLE_GIB.value}: give 0 or more")
  accums, topology = _accums(), _TOPOLOGY.value
  # Before libtpu starts (describing the topology starts it): where Mosaic's
  # kernel dumps go, for the estimate to price the Pallas kernels.
  mosaic_dump = (estimate_lib.mosaic_dump_dir()
                 if topology and _ESTIMATE.value and "task" not in config else None)
  devices = _devices(topology, _NUM_SLICES.value)
  available = int(_AVAILABLE_GIB.value * 2**30) or None
  if "task" in config:
    for flag, given in (("--phase", _PHASE.value), ("--find_max_batch", _FIND_MAX_BATCH.value),
                        ("--num_slices", _NUM_SLICES.value > 1),
                        ("--remat_policy", _REMAT.value)):
      if given:
        raise app.UsageError(f"{flag}: for a pretraining config; {config.task}'s fine-tuning "
                             "config has one step, on one slice")
    if _LARGE.value:
      config.unlock()
      config.model.update(finetune.LARGE)
    print(f"{topology or 'this machine'}: {len(devices)} x {devices[0].device_kind}")
    verdicts = check.finetuning(config, topology=topology, accums=accums,
                                vocab_size=_VOCAB.value, available_bytes=available)
  else:
    if _LARGE.value:
      raise app.UsageError("--large: for a fine-tuning config; a pretraining config names "
                           "its model (configs/large.py is BERT-LARGE)")
    if _PHASE.value and _PHASE.value not in config.phases:
      raise app.UsageError(f"--phase={_PHASE.value}: not one of {list(config.phases)}")
    verdicts = check.pretraining(
        config.copy_and_resolve_references, topology=topology,
        phases=[_PHASE.value] if _PHASE.value else list(config.phases), accums=accums,
        num_slices=_NUM_SLICES.value, vocab_size=_VOCAB.value, available_bytes=available,
        find_max_batch=_FIND_MAX_BATCH.value, mosaic_dump=mosaic_dump, remats=_remats())
  return 1 if any(v.fits is False for v in verdicts) else 0


if __name__ == "__main__":
  cli.run(main)
