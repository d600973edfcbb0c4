"""Checks a run config before anything compiles, and derives the phase plan.

Every error names the config field (as `--config.` flags spell it) and what
would fix it.
"""

import dataclasses
import math
from typing import Optional

import ml_collections

from bertjax.input import packing as packing_lib
from bertjax.model import attention
from bertjax.model.config import REMAT_POLICIES, BertConfig
from bertjax.records import schema
from bertjax.records.schema import OBJECTIVES
from bertjax.train import sharding as sharding_lib
from bertjax.train.optimizer import SCHEDULES, phase_boundaries

_GROUPS = {
    "": {"seed", "objective", "total_steps", "init_from", "allow_changes", "compile_cache_dir", "model", "data", "phases",
         "optimizer", "mesh", "checkpoint", "logging"},
    "model": {f.name for f in dataclasses.fields(BertConfig)},
    "data": {"source", "demo_dir", "vocab_hash", "order", "shuffle_block", "skip_corrupt",
             "dynamic_masking", "masked_lm_prob", "prefetch", "packing", "packing_factor",
             "packing_chunk_steps", "packing_max_examples_per_row",
             "packing_max_predictions_per_row"},
    "optimizer": {"name", "learning_rate", "b1", "b2", "eps", "weight_decay",
                  "bias_correction", "schedule", "clip_norm", "warmup_steps", "end_learning_rate",
                  "per_phase_warmup", "grad_accum_steps", "max_nonfinite_in_a_row"},
    "mesh": {"data", "fsdp", "tensor", "dcn_data", "dcn_fsdp", "dcn_tensor", "rules"},
    "checkpoint": {"every_steps", "keep", "async_save"},
    "logging": {"every_steps", "eval_every_steps", "eval_batches", "peak_tflops",
                "profile_steps"},
}
_PHASE_FIELDS = {"fraction", "max_seq_length", "max_predictions_per_seq",
                 "global_batch_size", "train_files", "eval_files", "warmup_steps",
                 "remat_policy"}


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase of the run with its step range [start, end)."""
  name: str
  index: int
  start: int
  end: int
  max_seq_length: int
  max_predictions_per_seq: int
  global_batch_size: int
  train_files: str
  eval_files: str
  warmup_steps: int
  remat_policy: str = ""  # This phase's model.remat_policy; "": the model's.

  @property
  def num_steps(self) -> int:
    return self.end - self.start

  def model_config(self, model: BertConfig) -> BertConfig:
    """The model config this phase trains with: its own remat_policy, if any."""
    return model.replace(remat_policy=self.remat_policy) if self.remat_policy else model


class ConfigError(ValueError):
  pass


def _fail(field: str, why: str):
  raise ConfigError(f"--config.{field}: {why}")


def _check_keys(config: ml_collections.ConfigDict):
  for group, known in _GROUPS.items():
    node = config if not group else config.get(group)
    if node is None:
      _fail(group, "missing group")
    for key in node.keys():
      if key not in known:
        _fail(f"{group}.{key}" if group else key,
              f"unknown field; known fields of {group or 'the config'}: {sorted(known)}")
  for name, phase in config.phases.items():
    for key in phase.keys():
      if key not in _PHASE_FIELDS:
        _fail(f"phases.{name}.{key}", f"unknown field; known: {sorted(_PHASE_FIELDS)}")


def phases(config: ml_collections.ConfigDict) -> list[Phase]:
  """The phases in run order with their step ranges."""
  names = list(config.phases.keys())
  if not names:
    _fail("phases", "needs at least one phase")
  fractions = [float(config.phases[n].fraction) for n in names]
  for n, f in zip(names, fractions):
    if not 0.0 < f <= 1.0:
      _fail(f"phases.{n}.fraction", f"must be in (0, 1], got {f}")
  if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
    _fail("phases", f"fractions {dict(zip(names, fractions))} add up to "
          f"{sum(fractions):.6g}, not 1")
  bounds = phase_boundaries(config.total_steps, fractions)
  out = []
  for i, n in enumerate(names):
    p = config.phases[n]
    if bounds[i + 1] <= bounds[i]:
      _fail(f"phases.{n}.fraction", f"gives no steps of total_steps={config.total_steps}")
    remat = p.get("remat_policy", "")
    if remat and remat not in REMAT_POLICIES:
      _fail(f"phases.{n}.remat_policy", f"{remat!r} is not one of {REMAT_POLICIES} (or "
            "empty: model.remat_policy)")
    out.append(Phase(n, i, bounds[i], bounds[i + 1], int(p.max_seq_length),
                     int(p.max_predictions_per_seq), int(p.global_batch_size),
                     p.train_files, p.eval_files, int(p.warmup_steps), remat))
  return out


def phase_at(plan: list[Phase], step: int) -> Phase:
  for p in plan:
    if p.start <= step < p.end:
      return p
  return plan[-1]


def _check_splash_heads(model: BertConfig, plan: list[Phase], tensor: int, platform: str):
  """Refuses splash and flash attention where the tensor axis does not divide the heads.

  Both run per shard (attention.PER_SHARD); heads that do not split evenly
  over the tensor axis are left whole, so every tensor shard would compute
  every head. 'splash' and 'flash' are refused outright; 'auto' wherever it
  would pick one of them on `platform` (attention.choose): in training, and
  in evaluation for phases with eval_files.
  """
  if model.num_heads % tensor == 0:
    return
  fix = (f"set mesh.tensor to a divisor of {model.num_heads}, or "
         "model.attention_impl='xla'")
  problem = (f"{model.num_heads} heads do not split over the mesh.tensor={tensor} tensor "
             "shards, so {} attention would compute every head on every tensor shard")
  if model.attention_impl in attention.PER_SHARD:
    _fail("model.num_heads", f"{problem.format(model.attention_impl)} "
          f"(model.attention_impl={model.attention_impl!r}): {fix}")
  if model.attention_impl != "auto":
    return
  for p in plan:
    for deterministic, use in ((False, "training"), (True, "evaluation")):
      if deterministic and not p.eval_files:
        continue
      kernel, _ = attention.choose(
          "auto", attention_dropout_rate=model.attention_dropout_rate, dtype=model.dtype,
          platform=platform, seq_len=p.max_seq_length, deterministic=deterministic)
      if kernel in attention.PER_SHARD:
        _fail("model.num_heads", f"{problem.format(kernel)} (model.attention_impl='auto' "
              f"picks {kernel} on {platform} for {use} at phase {p.name}'s length "
              f"{p.max_seq_length}): {fix}")


def model_overrides(objective: str) -> dict[str, bool]:
  """What the objective sets in the model config: ltr's causal mask, and the
  next-sentence head only for the paper's objective."""
  return {"causal": objective == "ltr", "next_sentence_head": objective == "mlm+nsp"}


def packing_options(config: ml_collections.ConfigDict, phase: Phase) -> Optional[dict]:
  """The pipeline's `packing` dict for `phase` (None when data.packing is off):
  rows = global_batch_size / data.packing_factor packed rows per global batch."""
  data = config.get("data", {})
  if not data.get("packing", False):
    return None
  return {"rows": int(round(phase.global_batch_size / float(data.packing_factor))),
          "max_examples_per_row": int(data.packing_max_examples_per_row),
          "max_predictions_per_row": int(data.packing_max_predictions_per_row),
          "chunk_steps": int(data.packing_chunk_steps)}


def packed_layout(config: ml_collections.ConfigDict, phase: Phase
                  ) -> Optional[packing_lib.Packing]:
  """The rows of `phase`'s global batch and what each holds, as the input
  pipeline packs them (packing.from_options over all hosts together); None
  when data.packing is off."""
  options = packing_options(config, phase)
  if options is None:
    return None
  return packing_lib.from_options(options, process_count=1,
                                  max_seq_length=phase.max_seq_length,
                                  max_predictions_per_seq=phase.max_predictions_per_seq)


def batch_shapes(config: ml_collections.ConfigDict, phase: Phase
                 ) -> dict[str, tuple[tuple[int, ...], type]]:
  """Shapes and numpy dtypes of `phase`'s global batch as the input pipeline
  yields it: schema.batch_shapes, or with data.packing packing.packed_batch_shapes."""
  layout = packed_layout(config, phase)
  if layout is None:
    return schema.batch_shapes(phase.global_batch_size, phase.max_seq_length,
                               phase.max_predictions_per_seq)
  return packing_lib.packed_batch_shapes(layout)


def row_slots(config: ml_collections.ConfigDict, phase: Phase) -> tuple[int, int, int]:
  """(rows, masked-LM slots per row, [CLS] slots per row) of `phase`'s global
  batch: what each train step computes on (flops.train_flops_per_sequence);
  packed rows hold several examples each."""
  layout = packed_layout(config, phase)
  if layout is None:
    return phase.global_batch_size, phase.max_predictions_per_seq, 1
  return layout.rows, layout.max_predictions_per_row, layout.max_examples_per_row


def _check_packing(config, model: BertConfig, plan: list[Phase], dp: Optional[int],
                   process_count: int, compile_only: bool):
  """Refuses packing settings that the data, the model or the mesh cannot take."""
  data = config.data
  if not data.packing:
    return
  if data.source != "tfrecord" and not compile_only:
    _fail("data.packing", f"packs records as they are read; data.source={data.source!r} "
          "reads none: set data.source='tfrecord' or data.packing=False")
  if model.attention_impl == "cudnn":
    _fail("model.attention_impl", attention.PACKED_CUDNN)
  per_row = int(data.packing_max_examples_per_row)
  if per_row < 1:
    _fail("data.packing_max_examples_per_row", f"must be at least 1, got {per_row}")
  if int(data.packing_chunk_steps) < 1:
    _fail("data.packing_chunk_steps", f"must be at least 1, got {data.packing_chunk_steps}")
  factor = float(data.packing_factor)
  if not 1.0 <= factor <= per_row:
    _fail("data.packing_factor", f"must be in [1, data.packing_max_examples_per_row={per_row}]"
          f", got {factor}")
  k = config.optimizer.grad_accum_steps
  for p in plan:
    rows = p.global_batch_size / factor
    f = f"phases.{p.name}.global_batch_size"
    if abs(rows - round(rows)) > 1e-9:
      _fail("data.packing_factor", f"{p.global_batch_size} examples of phase {p.name} over "
            f"packing_factor={factor} is {rows:g} rows, not a whole number; change "
            f"data.packing_factor or --config.{f}")
    rows = int(round(rows))
    if rows % process_count or rows % k or (dp is not None and (rows // k) % dp):
      _fail("data.packing_factor", f"phase {p.name}'s {rows} packed rows do not split over "
            f"the {process_count} hosts, optimizer.grad_accum_steps={k} and "
            f"{dp or 1} data-parallel devices; change data.packing_factor or --config.{f}")
    predictions = int(data.packing_max_predictions_per_row) or (
        packing_lib.default_predictions_per_row(per_row, p.max_seq_length,
                                                p.max_predictions_per_seq))
    problem = packing_lib.predictions_problem(predictions, p.max_seq_length,
                                              p.max_predictions_per_seq)
    if problem:
      raise ConfigError(f"--config.{problem} (phase {p.name})")


def validate(config: ml_collections.ConfigDict, *, num_devices: Optional[int] = None,
             process_count: int = 1, vocab_size: Optional[int] = None,
             platform: Optional[str] = None, num_slices: int = 1,
             compile_only: bool = False) -> BertConfig:
  """Raises ConfigError naming the field; returns the model config.

  `compile_only`: the steps are compiled for the batches' shapes but fed no
  records (the fit check, bertjax.fit), so packing needs no record source.

  `num_devices` (in `num_slices` slices) resolves a -1 in config.mesh;
  without it the checks that need the mesh's sizes take only the sizes the
  config fixes. `platform`
  ('tpu', 'gpu', 'cpu') is where the steps will run, for what
  model.attention_impl='auto' picks there; None checks as for TPU.
  """
  _check_keys(config)
  if config.total_steps <= 0:
    _fail("total_steps", f"must be positive, got {config.total_steps}")
  objective = config.get("objective", "mlm+nsp")
  if objective not in OBJECTIVES:
    _fail("objective", f"{objective!r} is not one of {OBJECTIVES}")
  if config.model.get("causal", False) and objective != "ltr":
    _fail("model.causal", f"True needs objective='ltr' (the left-to-right model), got "
          f"objective={objective!r}; the objective sets it, so leave it False")
  if objective == "ltr" and config.data.get("dynamic_masking", False):
    _fail("data.dynamic_masking", "objective='ltr' trains on every next token of its "
          "records as they are, so masking them would make [MASK] and random tokens its "
          "targets: set data.dynamic_masking=False (configs/modern.py sets it True), or "
          "another objective")
  if objective == "ltr" and config.data.get("packing", False):
    _fail("data.packing", "objective='ltr' predicts each row's next tokens, which would "
          "cross from one packed example into the next: set data.packing=False")
  try:
    model = BertConfig.from_mapping(config.model, **model_overrides(objective), **(
        {"vocab_size": vocab_size} if vocab_size else {}))
  except ValueError as e:
    raise ConfigError(f"--config.{e}") from None
  if config.data.source not in ("tfrecord", "synthetic"):
    _fail("data.source", f"{config.data.source!r} is not one of 'tfrecord', 'synthetic'")
  if config.data.order not in ("files", "global"):
    _fail("data.order", f"{config.data.order!r} is not one of 'files', 'global'")
  if config.data.shuffle_block < 1:
    _fail("data.shuffle_block", f"must be at least 1, got {config.data.shuffle_block}")
  if config.data.dynamic_masking and not 0.0 < config.data.masked_lm_prob < 1.0:
    _fail("data.masked_lm_prob", f"must be in (0, 1), got {config.data.masked_lm_prob}")
  if config.optimizer.schedule not in SCHEDULES:
    _fail("optimizer.schedule", f"{config.optimizer.schedule!r} is not one of {SCHEDULES}")
  if config.optimizer.name not in ("adamw", "lamb"):
    _fail("optimizer.name", f"{config.optimizer.name!r} is not one of 'adamw', 'lamb'")
  if config.optimizer.grad_accum_steps < 1:
    _fail("optimizer.grad_accum_steps", "must be at least 1")
  if config.optimizer.max_nonfinite_in_a_row < 1:
    _fail("optimizer.max_nonfinite_in_a_row", "must be at least 1 (1 stops at the first "
          f"non-finite step), got {config.optimizer.max_nonfinite_in_a_row}")
  if config.checkpoint.keep < 1:
    _fail("checkpoint.keep", "must be at least 1")
  if config.checkpoint.every_steps < 1:
    _fail("checkpoint.every_steps", "must be at least 1")
  if config.logging.every_steps < 1:
    _fail("logging.every_steps", "must be at least 1")
  if config.logging.eval_batches < 0:
    _fail("logging.eval_batches", "must be 0 (the whole eval set) or more")
  dp = None
  ici_dcn = (int(config.mesh.tensor), int(getattr(config.mesh, "dcn_tensor", 1)))
  tensor = math.prod(ici_dcn) if min(ici_dcn) > 0 else -1  # -1 while the device count is unknown.
  if num_devices is not None:
    try:
      shape = sharding_lib.mesh_shape(config.mesh, num_devices, num_slices)
    except ValueError as e:
      raise ConfigError(f"--{e}") from None
    dp, tensor = shape[0] * shape[1], shape[2]
  if tensor > 0:
    _check_splash_heads(model, phases(config), tensor, platform or "tpu")
  needs_files = config.data.source == "tfrecord" and not config.data.demo_dir
  for p in phases(config):
    f = f"phases.{p.name}"
    if p.max_seq_length > model.max_position_embeddings:
      _fail(f"{f}.max_seq_length", f"{p.max_seq_length} exceeds "
            f"model.max_position_embeddings={model.max_position_embeddings}")
    if not 0 < p.max_predictions_per_seq <= p.max_seq_length:
      _fail(f"{f}.max_predictions_per_seq", f"must be in [1, max_seq_length], got "
            f"{p.max_predictions_per_seq}")
    b, k = p.global_batch_size, config.optimizer.grad_accum_steps
    if b <= 0:
      _fail(f"{f}.global_batch_size", f"must be positive, got {b}")
    if b % k:
      _fail(f"{f}.global_batch_size", f"{b} is not divisible by optimizer.grad_accum_steps={k}")
    if dp is not None and (b // k) % dp:
      _fail(f"{f}.global_batch_size", f"{b} (/{k} micro-batches) is not divisible by the "
            f"{dp} data-parallel devices (mesh.data x mesh.fsdp)")
    if b % process_count:
      _fail(f"{f}.global_batch_size", f"{b} is not divisible by the {process_count} hosts")
    if needs_files and not p.train_files:
      _fail(f"{f}.train_files", "is empty: give a glob of TFRecords, or set "
            "data.source=synthetic or data.demo_dir")
  _check_packing(config, model, phases(config), dp, process_count, compile_only)
  return model
