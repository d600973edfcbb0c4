"""What `auto` may pick: the fused attention kernels proven on a platform.

A fused kernel is `model.attention_impl='auto'`'s choice on a platform only
where there is evidence of two things there: that BERT-LARGE's train step
with it compiles within `COMPILE_BOUND_S`, and that it is faster than XLA
attention. On a GPU both come from runs on the device (a test in the `gpu`
tier, a timed row of the device suite); on a TPU, where nothing here has
run, from the ahead-of-time compile for a TPU topology, interpret-mode
parity with XLA attention and the TPU compiler's own cost estimate
(`python -m bertjax.fit --estimate`). Every kernel without such evidence is
there by name (`model.attention_impl='flash'`, ...), and `auto` says in the
log why it did not take it.

Evidence holds for the jax minor releases it was gathered on: a kernel
written in Pallas compiles through that release's Triton or Mosaic
pipeline, which changes between releases (setup.py names the range).
"""

import dataclasses

import jax

# The bound on compiling BERT-LARGE's train step with a kernel, in seconds.
COMPILE_BOUND_S = 60


@dataclasses.dataclass(frozen=True)
class Evidence:
  """Why `kernel` is auto's choice on `platform`.

  dropout: for training with attention dropout on (True) or for steps
  without it (False: evaluation, or a rate of 0). seq_lens: the lengths
  the evidence covers. jax_minors: the jax releases ("0.11") it was
  gathered on. compiled, faster: what showed each, with the device.
  """
  kernel: str
  platform: str
  dropout: bool
  seq_lens: tuple[int, ...]
  jax_minors: tuple[str, ...]
  compiled: str
  faster: str


# Evidence per auto choice; docs/attention.md's table shows the same rows.
PROVEN: tuple[Evidence, ...] = ()

# The fused kernel auto would weigh, by (platform, attention dropout in
# training), and what is known of it while it has no evidence.
CANDIDATES = {
    ("tpu", True): ("flash", "it compiles ahead of time for TPU topologies and matches XLA "
                    "attention in interpret mode, but has never run on a TPU, and by the TPU "
                    "compiler's estimate it is not faster than XLA attention (BERT-BASE on "
                    "v5e: 41.4M against 38.3M cycles a step at 128, 41.0M against 41.7M at 512)"),
    ("tpu", False): ("splash", "it compiles ahead of time for TPU topologies and matches XLA "
                     "attention in interpret mode, but has never run on a TPU, and by the TPU "
                     "compiler's estimate it is slower than XLA attention (BERT-BASE on v5e: "
                     "43.8M against 37.8M cycles a step at 128, 44.2M against 42.6M at 512)"),
    ("gpu", True): ("flash", "its BERT-LARGE train step did not finish compiling in 360 s "
                    "on an NVIDIA H200 (jax 0.11.2, the kernel before its rebuild), and the "
                    "rebuilt kernel has not run on a GPU"),
    ("gpu", False): ("cudnn", "it compiles and matches XLA attention on an NVIDIA H200 and "
                     "H100 (tests/test_gpu.py, jax 0.11.2), but no timed row shows it "
                     "faster than XLA attention"),
}


def jax_minor(version: str | None = None) -> str:
  """'0.11' for '0.11.2' (the running jax's by default)."""
  return ".".join((version or jax.__version__).split(".")[:2])


def proven(platform: str, dropout: bool, seq_len: int,
           version: str | None = None) -> Evidence | None:
  """The evidence for a fused kernel on `platform` at `seq_len`, on this jax
  release (`version`: the running jax's by default); None where there is none."""
  minor = jax_minor(version)
  for e in PROVEN:
    if (e.platform == platform and e.dropout == dropout and seq_len in e.seq_lens
        and minor in e.jax_minors):
      return e
  return None


def unproven_reason(platform: str, dropout: bool, seq_len: int,
                    version: str | None = None) -> str:
  """Why auto takes no fused kernel on `platform` for this step, naming the
  kernel a user can ask for by name."""
  kernel, known = CANDIDATES[(platform, dropout)]
  step = "training with attention dropout" if dropout else "steps without attention dropout"
  other = [e for e in PROVEN if e.platform == platform and e.dropout == dropout]
  if other:
    known = (f"its evidence covers lengths {sorted({n for e in other for n in e.seq_lens})} "
             f"on jax {sorted({m for e in other for m in e.jax_minors})}, not length "
             f"{seq_len} on jax {jax_minor(version)}")
  return (f"{kernel} is not proven on {platform} for {step}: {known} "
          f"(model.attention_impl={kernel!r} opts in; docs/attention.md)")
