"""One peer row of the device suite: transformers' BertForPreTraining in PyTorch.

  python -m bertjax.benchmarks.peer_row SPEC.json

bertjax/benchmarks/device_suite.py writes SPEC.json and starts this module
once per peer row, as it starts device_row.py for bertjax's. The peer, as
bertjax's device measurements define it:

  - transformers' `BertForPreTraining` with SDPA attention
    (attn_implementation="sdpa"; its fused kernels keep the attention
    dropout), the row's sizes, dropout and vocab, parameters in fp32;
  - bf16 autocast (`torch.autocast("cuda", dtype=torch.bfloat16)`) where the
    row's dtype is bfloat16 (none where it is float32, as with --tiny);
  - fused AdamW (`torch.optim.AdamW(..., fused=True)`) at the row's learning
    rate and weight decay, no gradient clipping;
  - masked LM plus next-sentence prediction on bertjax's synthetic batch of
    the same size (bertjax.input.synthetic, seed 0: the batch device_row
    times). transformers' head scores every position: the labels are -100
    except at the masked positions, and the loss reads them from logits over
    the whole vocab at all L positions, where bertjax computes the decoder at
    the P masked positions only.

A step is forward, backward, the optimizer's step and zeroing the gradients,
each step waited for (torch.cuda.synchronize). The row times the model eager
first, then `torch.compile(model)` (default mode) on the same model and
optimizer, whose first step compiles; each part's figures are written to the
spec's `result` as soon as they are measured. Where the eager step runs out of
memory at a batch, the next of the spec's `batches` is tried, and the
compiled part runs at the batch that fitted.

Its phases, for the suite's time boxes (bertjax/benchmarks/row_process.py):
build (the model on the device), eager (warm-up and timed eager steps),
compile (torch.compile's first step), steps (the compiled warm-up and timed
steps). MFU is left to the suite, which counts the same model FLOPs for both
sides.

Imports torch, transformers, numpy and the standard library (with bertjax's
numpy-only synthetic batch and row_process), so it runs where JAX is absent:
on the GPU machine's PyTorch and, for the tests, in the environment that
tests/torch_env/make.sh creates.
"""

import contextlib
import functools
import gc
import statistics
import sys
import time

import numpy as np
import torch
import transformers

from bertjax.benchmarks import row_process
from bertjax.input.synthetic import SyntheticSource


def build(spec: dict, device: torch.device):
  """(model, optimizer) of the spec's sizes on `device`, in training mode."""
  m = spec["model"]
  config = transformers.BertConfig(
      vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
      num_hidden_layers=m["num_layers"], num_attention_heads=m["num_heads"],
      intermediate_size=m["intermediate_size"], hidden_dropout_prob=m["hidden_dropout_rate"],
      attention_probs_dropout_prob=m["attention_dropout_rate"],
      max_position_embeddings=m["max_position_embeddings"],
      type_vocab_size=m["type_vocab_size"], layer_norm_eps=m["layer_norm_eps"],
      initializer_range=m["initializer_range"], attn_implementation="sdpa")
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(config).to(device)
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=spec["learning_rate"],
                                weight_decay=spec["weight_decay"], fused=True)
  return model, optimizer


def inputs(spec: dict, batch_size: int, device: torch.device) -> dict:
  """The model's keyword arguments for bertjax's synthetic batch at `batch_size`."""
  b = SyntheticSource(batch_size, max_seq_length=spec["seq_len"],
                      max_predictions_per_seq=spec["predictions"],
                      vocab_size=spec["model"]["vocab_size"], seed=0).batch(0)
  labels = np.full(b["input_ids"].shape, -100, np.int64)
  rows, slots = np.nonzero(b["masked_lm_weights"] > 0)
  labels[rows, b["masked_lm_positions"][rows, slots]] = b["masked_lm_ids"][rows, slots]
  arrays = {"input_ids": b["input_ids"], "attention_mask": b["input_mask"],
            "token_type_ids": b["segment_ids"], "labels": labels,
            "next_sentence_label": b["next_sentence_labels"]}
  return {k: torch.as_tensor(np.asarray(v, np.int64), device=device) for k, v in arrays.items()}


def train_step(model, optimizer, batch: dict, autocast) -> torch.Tensor:
  with autocast():
    loss = model(**batch).loss
  loss.backward()
  optimizer.step()
  optimizer.zero_grad(set_to_none=True)
  return loss


def _sync(device: torch.device):
  if device.type == "cuda":
    torch.cuda.synchronize(device)


def timed(step, device: torch.device, n: int) -> tuple[list[float], torch.Tensor]:
  """([seconds per step], last loss) of `n` steps, each waited for."""
  seconds, loss = [], None
  for _ in range(n):
    t0 = time.perf_counter()
    loss = step()
    _sync(device)
    seconds.append(time.perf_counter() - t0)
  return seconds, loss


def figures(batch: dict, seconds: list[float], loss: torch.Tensor, device: torch.device) -> dict:
  rows, length = batch["input_ids"].shape
  real = int(batch["attention_mask"].sum())
  median = statistics.median(seconds)
  out = {"rows": rows, "examples": rows, "seq_len": length, "real_tokens": real,
         "grad_accum_steps": 1, "attention_kernel": "sdpa",
         "step_ms": {"median": 1e3 * median, "min": 1e3 * min(seconds),
                     "max": 1e3 * max(seconds), "all": [1e3 * s for s in seconds]},
         "sequences_per_s": rows / median, "rows_per_s": rows / median,
         "real_tokens_per_s": real / median, "token_slots_per_s": rows * length / median,
         "loss": float(loss.detach())}
  if device.type == "cuda":
    out["memory_gib"] = {"peak_allocated": torch.cuda.max_memory_allocated(device) / 2**30,
                         "peak_reserved": torch.cuda.max_memory_reserved(device) / 2**30}
  return out


def _reset_memory(device: torch.device):
  gc.collect()
  if device.type == "cuda":
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


def run_row(spec: dict, phases: row_process.Phases) -> dict:
  """The row's eager and compiled figures (see the module docstring)."""
  phases.enter("build")
  device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  model, optimizer = build(spec, device)
  bf16 = spec["model"]["dtype"] == "bfloat16"
  autocast = (functools.partial(torch.autocast, device.type, dtype=torch.bfloat16) if bf16
              else contextlib.nullcontext)
  result = {"status": "running", "parts": ["eager", "compiled"],
            "platform": "gpu" if device.type == "cuda" else "cpu",
            "device_kind": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "devices": 1, "framework": f"torch {torch.__version__}, transformers "
                                      f"{transformers.__version__}",
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": "bfloat16 autocast, fp32 parameters" if bf16 else "float32",
            "attention": model.config._attn_implementation,  # pylint: disable=protected-access
            "batch_tries": []}
  batch = None
  for size in spec["batches"]:
    phases.enter("eager", f"batch {size}")
    _reset_memory(device)
    try:
      batch = inputs(spec, size, device)
      step = functools.partial(train_step, model, optimizer, batch, autocast)
      timed(step, device, spec["warmup"])
      seconds, loss = timed(step, device, spec["steps"])
    except torch.cuda.OutOfMemoryError as e:
      result["batch_tries"].append({"batch": size, "error": str(e).splitlines()[0][:300]})
      batch = None
      optimizer.zero_grad(set_to_none=True)
      continue
    result["batch"] = size
    result["eager"] = figures(batch, seconds, loss, device)
    break
  if batch is None:
    raise RuntimeError(f"no batch of {spec['batches']} fits: {result['batch_tries']}")
  row_process.write_json(spec["result"], result)

  phases.enter("compile", f"batch {result['batch']}")
  _reset_memory(device)
  compiled = torch.compile(model)
  step = functools.partial(train_step, compiled, optimizer, batch, autocast)
  first, _ = timed(step, device, 1)
  phases.enter("steps", f"batch {result['batch']}")
  warm, _ = timed(step, device, max(spec["warmup"] - 1, 0))
  seconds, loss = timed(step, device, spec["steps"])
  result["compiled"] = {**figures(batch, seconds, loss, device), "compile_s": first[0],
                        "warmup_ms": [1e3 * s for s in warm]}
  result["compiled_over_eager"] = (result["compiled"]["sequences_per_s"]
                                   / result["eager"]["sequences_per_s"])
  return result


def main(argv):
  row_process.row_main(argv, run_row)


if __name__ == "__main__":
  main(sys.argv)
