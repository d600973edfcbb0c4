"""One row of the device suite, measured in a process of its own.

  python -m bertjax.benchmarks.device_row SPEC.json

bertjax/benchmarks/device_suite.py writes SPEC.json (the config file, phase,
global batch, field overrides, what to time and where to write) and starts
this module once per row, so that a row that runs out of memory, crashes or
overruns the suite's budget takes only itself down. It writes the row's
result as JSON to the spec's `result` path: status "ok" and its figures, or
status "failed" and the error.

The step is bertjax.benchmarks.step_bench's (bertjax/train/step_setup.py's build,
the synthetic batch, the jitted train step), timed one step at a time (each
step waited for, so that the median and range are per step). Before it runs, XLA's memory analysis of
the compiled step is compared with what the device lets a program use; a
step that needs more is compiled again with the global batch split into
gradient-accumulation micro-batches, as few as the analysis predicts fit
(`next_accumulation`), counting up from optimizer.grad_accum_steps (1 in
the configs).

With `packing_factor` the row packs: synthetic examples cut to lengths that
leave room for packing (`short_examples`) are timed unpacked, and then the
same examples packed into global_batch / packing_factor rows (first-fit
decreasing, as the input pipeline packs). With `profile`, a few more steps
run under jax.profiler and bertjax/benchmarks/trace_summary.py splits their
time into categories.

The row reports its phases (build, compile, steps, profile) for the suite's
time boxes (bertjax/benchmarks/row_process.py) and writes its result so far
after each part it measures. Its result also holds what the suite needs
beside the figures: the model FLOPs of one sequence (bertjax's analytic
count, which the suite also uses for the peer's MFU), the model fields that
the suite's variants change, and what each model.attention_impl resolves to
for this row on this device (or why it cannot run here).
"""

import functools
import glob
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import jax
import numpy as np

from bertjax.benchmarks import row_process
from bertjax.benchmarks import trace_summary
from bertjax.input import device as device_lib
from bertjax.input import packing as packing_lib
from bertjax.input.synthetic import SyntheticSource
from bertjax.model import attention
from bertjax.records import masking
from bertjax.records import schema
from bertjax.train import flops
from bertjax.train import profiling
from bertjax.train import run_config
from bertjax.train import sharding as sharding_lib
from bertjax.train import state as state_lib
from bertjax.train import step as step_lib
from bertjax.train import step_setup

# The suite hands back every profiled row's trace in one file of at most 16 MiB.
MAX_TRACE_BYTES = 7 * 2**20
FIT_HEADROOM = 0.95  # Share of the device's limit that an accumulation is chosen to fill.


def next_accumulation(needed: int, argument_bytes: int, bytes_limit: int, accum: int,
                      rows_per_device: int) -> int | None:
  """The fewest micro-batches above `accum` (a divisor of the rows per device)
  that should fit `bytes_limit`, given that the step needs `needed` bytes at
  `accum`: everything but the arguments (parameters, optimizer state, batch)
  taken to shrink with the micro-batch. None where none is predicted to fit."""
  room = FIT_HEADROOM * bytes_limit - argument_bytes
  whole_batch = (needed - argument_bytes) * accum
  if room <= 0:
    return None
  for k in range(accum + 1, rows_per_device + 1):
    if rows_per_device % k == 0 and whole_batch / k <= room:
      return k
  return None


class DoesNotFit(RuntimeError):
  pass


def fit_accumulation(compile_at, *, rows_per_device: int, bytes_limit: int | None,
                     start: int = 1, max_compiles: int = 4):
  """(compiled step, grad_accum_steps, tries) of the fewest micro-batches from
  `start` on that fit: `compile_at(k)` compiles the step at k; without a limit
  (CPU) k is `start`."""
  accum, tries = start, []
  while True:
    compiled = compile_at(accum)
    mem = compiled.memory_analysis()
    needed = step_setup.needed_bytes(mem)
    tries.append({"grad_accum_steps": accum, "needed_gib": needed / 2**30})
    if not bytes_limit or needed <= bytes_limit:
      return compiled, accum, tries
    nxt = next_accumulation(needed, mem.argument_size_in_bytes, bytes_limit, accum,
                            rows_per_device)
    if nxt is None or len(tries) >= max_compiles:
      raise DoesNotFit(
          f"needs {step_setup.gib(needed)} at grad_accum_steps={accum} where the device "
          f"lets a program use {step_setup.gib(bytes_limit)} (tried {tries}); no "
          f"accumulation of the {rows_per_device} rows per device is predicted to fit")
    accum = nxt


def short_examples(batch: dict, lengths_N: np.ndarray, predictions_per_seq: int) -> dict:
  """A synthetic batch with each example cut to at most lengths_N tokens: the
  padding grows, segment B starts halfway, and the masked positions past the
  end go (keeping at most 15% of the tokens, as the records mask)."""
  out = {k: np.array(v) for k, v in batch.items()}
  n_N = np.minimum(lengths_N, out["input_mask"].sum(1))
  pos_L = np.arange(out["input_ids"].shape[1])[None, :]
  keep_NxL = pos_L < n_N[:, None]
  out["input_mask"] = (out["input_mask"] * keep_NxL).astype(batch["input_mask"].dtype)
  out["input_ids"] = (out["input_ids"] * keep_NxL).astype(batch["input_ids"].dtype)
  out["segment_ids"] = ((pos_L >= (n_N // 2)[:, None]) & keep_NxL).astype(
      batch["segment_ids"].dtype)
  allowed_N = masking.num_predictions(n_N, 0.15, predictions_per_seq)
  kept_NxP = (out["masked_lm_weights"] > 0) & (out["masked_lm_positions"] < (n_N - 1)[:, None])
  kept_NxP &= np.cumsum(kept_NxP, axis=1) <= allowed_N[:, None]
  for name in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
    out[name] = (out[name] * kept_NxP).astype(batch[name].dtype)
  return out


def packed_pair(config, phase, vocab_size: int, seed: int = 0) -> tuple[dict, dict, int]:
  """(unpacked, packed, examples left out): the phase's global batch of
  synthetic examples of uniform length in [L/16, 5L/8] (34% of the slots real
  on average, as the original release's records at 512; docs/packing.md),
  and the same examples packed into the rows of data.packing_factor."""
  layout = run_config.packed_layout(config, phase)
  n, length = phase.global_batch_size, phase.max_seq_length
  source = SyntheticSource(n, max_seq_length=length, vocab_size=vocab_size, seed=seed,
                           max_predictions_per_seq=phase.max_predictions_per_seq)
  lengths = np.random.default_rng(seed).integers(length // 16, 5 * length // 8 + 1, size=n)
  unpacked = short_examples(source.batch(0), lengths, phase.max_predictions_per_seq)
  tokens, predictions, real = packing_lib.example_sizes(unpacked)
  row, offset = packing_lib.first_fit(tokens, predictions, real, layout)
  return unpacked, packing_lib.pack(unpacked, row, offset, layout), int((row < 0).sum())


def time_steps(step, state, batch, rng, warmup: int, steps: int):
  """(state, [seconds per step]): `steps` steps after `warmup`, each waited for."""
  metrics = None
  for _ in range(warmup):
    state, metrics = step(state, batch, rng)
  jax.block_until_ready(metrics)
  seconds = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = step(state, batch, rng)
    jax.block_until_ready(metrics)
    seconds.append(time.perf_counter() - t0)
  return state, seconds


def save_trace(events_path: str, hlo_text: str, prefix: str) -> list[str]:
  """Copies the trace (only its op events where it is too large to hand back)
  and the compiled step's text, gzipped, to prefix.*; returns the paths."""
  trace_path, hlo_path = prefix + ".perfetto_trace.json.gz", prefix + ".hlo.txt.gz"
  os.makedirs(os.path.dirname(trace_path), exist_ok=True)
  shutil.copyfile(events_path, trace_path)
  if os.path.getsize(trace_path) > MAX_TRACE_BYTES:
    events = trace_summary.load_events(events_path)
    kept = [e for e in events if e.get("ph") == "M" or "hlo_op" in e.get("args", {})
            or str(e.get("name", "")).startswith("jit_")]
    with gzip.open(trace_path, "wt", encoding="utf-8") as f:
      json.dump({"traceEvents": kept}, f)
  with gzip.open(hlo_path, "wt", encoding="utf-8") as f:
    f.write(hlo_text)
  return [trace_path, hlo_path]


def profile_steps(step, state, batch, rng, steps: int, prefix: str) -> tuple:
  """(state, figures): `steps` steps traced; figures has their time by category
  ("profile") and the saved files ("trace_files"), or why there are none
  ("profile_error": the row's other figures stand)."""
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      metrics = None
      for _ in range(steps):
        state, metrics = step(state, batch, rng)
      jax.block_until_ready(metrics)
    try:
      path, = glob.glob(os.path.join(tmp, "plugins", "profile", "*", "perfetto_trace.json.gz"))
      hlo = step.as_text()
      figures = {"trace_files": save_trace(path, hlo, prefix),
                 "profile": trace_summary.summarise(trace_summary.load_events(path),
                                                    trace_summary.parse_hlo(hlo), steps)}
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      figures = {"profile_error": f"{type(e).__name__}: {e}"[:2000]}
  return state, figures


def _batch_slots(batch: dict) -> tuple[int, int, int, int]:
  """(rows, length, masked-LM slots per row, [CLS] slots per row) of a batch."""
  rows, length = batch["input_ids"].shape
  nsp = batch["next_sentence_labels"]
  return rows, length, batch["masked_lm_positions"].shape[1], 1 if nsp.ndim == 1 else nsp.shape[1]


def measure(setup: dict, batch_np: dict, spec: dict, phases: row_process.Phases, *,
            profile: bool, prefix: str, part: str = "", save=None) -> dict:
  """Figures of the train step on one batch: compiled (fitted to the device's
  memory), timed and optionally profiled; setup["state"] moves on with the steps.
  `save(measured)`, where given, is called with the figures before the profile."""
  mesh, devices = setup["mesh"], setup["devices"]
  batch = device_lib.to_global(batch_np, sharding_lib.batch_sharding(mesh))
  rng = jax.random.key(1)
  limit = int(spec.get("bytes_limit") or 0) or (devices[0].memory_stats() or {}).get(
      "bytes_limit")

  def compile_at(accum: int):
    return step_lib.jit_train_step(setup["shardings"], mesh, objective=setup["config"].objective,
                                   grad_accum_steps=accum).lower(setup["state"], batch,
                                                                 rng).compile()

  out = {}
  with sharding_lib.mesh_context(mesh, setup["rules"]):
    phases.enter("compile", part)
    t0 = time.perf_counter()
    step, accum, out["fit_tries"] = fit_accumulation(
        compile_at, rows_per_device=len(batch_np["input_ids"]) // sharding_lib.data_parallel_size(
            mesh), bytes_limit=limit, start=setup["config"].optimizer.grad_accum_steps)
    out["compile_s"] = time.perf_counter() - t0
    phases.enter("steps", part)
    setup["state"], seconds = time_steps(step, setup["state"], batch, rng, spec["warmup"],
                                         spec["steps"])
    out.update(figures(setup, batch_np, spec, step, seconds, accum, limit))
    if save:
      save(out)
    left = phases.left()
    if profile and left < 30 + 3 * spec["profile_steps"] * statistics.median(seconds):
      out["profile_skipped"] = f"{left:.0f} s left of the steps time box or the budget"
    elif profile:
      phases.enter("profile", part)
      setup["state"], traced = profile_steps(step, setup["state"], batch, rng,
                                             spec["profile_steps"], prefix)
      out.update(traced)
  return out


def figures(setup: dict, batch_np: dict, spec: dict, step, seconds: list[float], accum: int,
            limit: int | None) -> dict:
  """Throughput, utilisation, attention kernel and memory of a timed step."""
  model_config, devices = setup["model_config"], setup["devices"]
  rows, length, predictions, examples_per_row = _batch_slots(batch_np)
  median = statistics.median(seconds)
  examples = int((batch_np[schema.EXAMPLE_WEIGHT_KEY] > 0).sum())
  real = int((batch_np["input_mask"] > 0).sum())
  peak = float(spec.get("peak_tflops") or 0) or flops.peak_tflops(devices[0].device_kind)
  util = profiling.utilisation(
      step_seconds=median, num_chips=len(devices), peak_tflops_per_chip=peak,
      model_config=model_config, seq_len=length, num_predictions=predictions,
      global_batch_size=rows, compiled_step_flops=profiling.whole_step_flops(step),
      grad_accum_steps=accum, num_examples=examples_per_row)
  choices = attention_choices(model_config, devices[0].platform, length,
                              packed="packed_example_ids" in batch_np)
  own = choices[model_config.attention_impl]
  if "error" in own:
    raise ValueError(own["error"])
  kernel, reason = own["kernel"], own["reason"]
  mem = step.memory_analysis()
  stats = devices[0].memory_stats() or {}
  return {
      "rows": rows, "examples": examples, "seq_len": length, "real_tokens": real,
      "grad_accum_steps": accum,
      "step_ms": {"median": 1e3 * median, "min": 1e3 * min(seconds),
                  "max": 1e3 * max(seconds), "all": [1e3 * s for s in seconds]},
      "sequences_per_s": examples / median, "rows_per_s": rows / median,
      "real_tokens_per_s": real / median, "token_slots_per_s": rows * length / median,
      "mfu": util.get("mfu"), "hfu": util.get("hfu"), "peak_tflops": peak,
      "model_flops_per_sequence": flops.train_flops_per_sequence(
          model_config, length, predictions, examples_per_row),
      "attention_impl": model_config.attention_impl, "attention_kernel": kernel,
      "attention_reason": reason, "attention_choices": choices,
      "memory_gib": {"needed": step_setup.needed_bytes(mem) / 2**30,
                     "arguments": mem.argument_size_in_bytes / 2**30,
                     "temporaries": mem.temp_size_in_bytes / 2**30,
                     "limit": limit / 2**30 if limit else None,
                     "peak_in_use": stats.get("peak_bytes_in_use", 0) / 2**30 or None}}


def attention_choices(model_config, platform: str, seq_len: int, packed: bool) -> dict:
  """{impl: {"kernel", "reason"}, or {"error"} where it cannot train this row here}
  for every model.attention_impl, the row's other fields as they are."""
  out = {}
  for impl in attention.IMPLS:
    try:
      kernel, reason = attention.choose(
          impl, attention_dropout_rate=model_config.attention_dropout_rate,
          dtype=model_config.dtype, platform=platform, seq_len=seq_len, deterministic=False,
          packed=packed)
      out[impl] = {"kernel": kernel, "reason": reason}
    except ValueError as e:
      out[impl] = {"error": str(e)}
  return out


def _save_part(spec: dict, result: dict, name: str, measured: dict):
  row_process.write_json(spec["result"], {**result, name: measured})


# The model fields that the suite's variants change, as this row has them.
VARIANT_FIELDS = ("hidden_dropout_rate", "attention_dropout_rate", "remat_policy",
                  "scan_layers", "attention_impl")


def run_row(spec: dict, phases: row_process.Phases) -> dict:
  """A row's figures (see the module docstring); its result so far is written
  to spec["result"] after each part."""
  phases.enter("build")
  config = row_process.load_config(spec["config"], spec["overrides"])
  phase_cfg = config.phases[spec["phase"]]
  phase_cfg.global_batch_size = spec["batch"]
  factor = float(spec.get("packing_factor") or 0)
  if factor:
    config.data.packing, config.data.packing_factor = True, factor
  devices = jax.devices()
  # compile_only: the suite makes its own packed batches (packed_pair), where
  # the pipeline would pack records read from files.
  model_config, phase, mesh, rules, model, tx = step_setup.build(
      config, devices, phase_name=spec["phase"], compile_only=bool(factor))
  state, shardings = state_lib.create_train_state(model, tx, mesh, rules, jax.random.key(0))
  setup = dict(config=config, phase=phase, model_config=model_config, mesh=mesh, rules=rules,
               devices=devices, state=state, shardings=shardings)
  result = {"status": "running", "device_kind": devices[0].device_kind,
            "platform": devices[0].platform, "devices": len(devices),
            "jax_version": jax.__version__,
            "parameters": sum(x.size for x in jax.tree.leaves(state.params)),
            "dtype": model_config.dtype, "remat_policy": model_config.remat_policy,
            "model": {f: getattr(model_config, f) for f in VARIANT_FIELDS}}
  if not factor:
    source = SyntheticSource(phase.global_batch_size, max_seq_length=phase.max_seq_length,
                             max_predictions_per_seq=phase.max_predictions_per_seq,
                             vocab_size=model_config.vocab_size, seed=0)
    def save(measured):
      row_process.write_json(spec["result"], {**result, **measured})
    return {**result, **measure(setup, source.batch(0), spec, phases, profile=spec["profile"],
                                prefix=spec["trace_prefix"], save=save)}
  unpacked, packed, left_out = packed_pair(config, phase, model_config.vocab_size)
  result["packing"] = {"factor": factor, "examples_left_out": left_out,
                       "real_token_share": {
                           "unpacked": packing_lib.real_token_share(unpacked),
                           "packed": packing_lib.real_token_share(packed)}}
  result["parts"] = ["unpacked", "packed"]
  for name, batch in (("unpacked", unpacked), ("packed", packed)):
    result[name] = measure(setup, batch, spec, phases, profile=False, prefix="", part=name,
                           save=functools.partial(_save_part, spec, result, name))
  result["packed_over_unpacked"] = (result["packed"]["real_tokens_per_s"]
                                    / result["unpacked"]["real_tokens_per_s"])
  return result


def main(argv):
  row_process.row_main(argv, run_row)


if __name__ == "__main__":
  main(sys.argv)
