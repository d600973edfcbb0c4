"""Console lines, TensorBoard scalars and the throughput figures behind them.

Throughput and utilisation (MFU from the analytic model FLOPs, HFU from
XLA's hardware FLOPs; profiling.utilisation) are rates of training steps
alone: a logging window's time spent in checkpoint saves (the part the loop
waits for; an async save writes on in the background) and held-out
evaluation is measured apart (RunClock) and left out of them, and reported
on its own. Goodput is the share of this process's wall time spent in
training steps (their input waits and the first step's compile included).

Two token rates: tokens_per_second is sequences_per_second (steps/s x
global_batch_size) x max_seq_length, the token slots of that many unpacked
rows, padding included, packed or not; real_tokens_per_second counts the
tokens the steps actually processed, the sum of input_mask over each global
batch (train_step's real_tokens metric), so it shows what packing gains.
"""

import contextlib
import time
from typing import Optional

import jax
import numpy as np
from absl import logging

from bertjax.model.config import BertConfig
from bertjax.train import flops
from bertjax.train import profiling


class RunClock:
  """This process's wall time, and the seconds of it spent saving and evaluating."""

  KINDS = ("checkpoint", "eval")

  def __init__(self):
    self.start = time.perf_counter()
    self.seconds = dict.fromkeys(self.KINDS, 0.0)
    self.step_seconds = 0.0  # Added up by the logger, window by window.

  @contextlib.contextmanager
  def measure(self, kind: str):
    t0 = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[kind] += time.perf_counter() - t0

  def apart(self) -> float:
    """Seconds spent outside training steps so far."""
    return sum(self.seconds.values())

  def goodput(self) -> float:
    return self.step_seconds / max(time.perf_counter() - self.start, 1e-9)

  def summary(self) -> dict[str, float]:
    wall = time.perf_counter() - self.start
    return {"wall_seconds": wall, "step_seconds": self.step_seconds,
            **{f"{k}_seconds": v for k, v in self.seconds.items()},
            "goodput": self.goodput()}


class MetricLogger:
  """Averages step metrics over a logging window and writes them out."""

  def __init__(self, workdir: str, model_config: BertConfig, total_steps: int,
               peak_tflops: float = 0.0, clock: Optional[RunClock] = None,
               grad_accum_steps: int = 1):
    self.model_config = model_config
    self.grad_accum_steps = grad_accum_steps
    self.total_steps = total_steps
    self.num_chips = jax.device_count()
    kind = jax.devices()[0].device_kind
    self.peak = peak_tflops or flops.peak_tflops(kind)
    self._writer = None
    if jax.process_index() == 0:
      try:
        from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
        self._writer = SummaryWriter(logdir=f"{workdir}/tensorboard")
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("No TensorBoard events (%s); console logging only.", e)
    self.clock = clock or RunClock()
    self._t0 = self._apart0 = None
    self._step0 = None

  def __enter__(self) -> "MetricLogger":
    return self

  def __exit__(self, *exc):
    self.close()

  def start_window(self, step: int):
    self._t0, self._apart0, self._step0 = time.perf_counter(), self.clock.apart(), step

  def log_train(self, step: int, phase, host_metrics: list[dict[str, float]],
                learning_rate: float, data_stats: Optional[dict[str, int]] = None,
                compiled_step_flops: Optional[float] = None,
                nonfinite: Optional[dict[str, int]] = None,
                row_slots: Optional[tuple[int, int, int]] = None) -> dict[str, float]:
    """Averages the window's metrics, adds rates, prints and writes them.

    The averages are over the window's finite steps (over all of them when
    none was finite). `data_stats` (the input's counters, e.g. skipped
    records) go to TensorBoard under data/; `nonfinite` (StepMetrics.counts:
    skipped steps in all and in a row) under train/. `mfu` is always from
    the analytic model FLOPs; `hfu` from `compiled_step_flops` (XLA's count
    per device, recomputation included) where XLA counts the whole step, and
    absent otherwise (profiling.utilisation). `row_slots` is what the step
    computes on (run_config.row_slots: rows, masked-LM and [CLS] slots per
    row; packed rows differ from the phase's); None: the phase's, unpacked.
    """
    now = time.perf_counter()
    steps = step - self._step0
    apart = self.clock.apart() - self._apart0
    seconds = max(now - self._t0 - apart, 1e-9)
    self.clock.step_seconds += seconds
    m = window_means(host_metrics)
    steps_per_s = steps / seconds
    seqs = steps_per_s * phase.global_batch_size
    m.update(learning_rate=learning_rate, step_time=1.0 / max(steps_per_s, 1e-9),
             sequences_per_second=seqs,
             tokens_per_second=seqs * phase.max_seq_length, goodput=self.clock.goodput())
    m.update(real_token_rates(host_metrics, seconds))
    rows, predictions, examples = row_slots or (
        phase.global_batch_size, phase.max_predictions_per_seq, 1)
    m.update(profiling.utilisation(
        step_seconds=seconds / max(steps, 1), num_chips=self.num_chips,
        peak_tflops_per_chip=self.peak, model_config=self.model_config,
        seq_len=phase.max_seq_length, num_predictions=predictions, global_batch_size=rows,
        compiled_step_flops=compiled_step_flops, grad_accum_steps=self.grad_accum_steps,
        num_examples=examples))
    m.update(nonfinite or {})
    eta = (self.total_steps - step) / max(steps_per_s, 1e-9)
    percent = lambda k: f"{100 * m[k]:.1f}%" if k in m else "n/a"
    skipped = (f"  skipped {m['skipped_steps']} steps ({m['nonfinite_in_a_row']} in a row)"
               if m.get("skipped_steps") else "")
    logging.info(
        "step %d/%d [%s] loss %.4f  mlm_acc %.4f  nsp_acc %.4f  lr %.3g  "
        "%.1f seq/s  %s real tok/s  MFU %s  HFU %s  goodput %.1f%% (checkpoints %.1fs, "
        "eval %.1fs)  ETA %s%s",
        step, self.total_steps, phase.name, m["loss"], m["mlm_accuracy"],
        m["nsp_accuracy"], learning_rate, seqs,
        f"{m['real_tokens_per_second']:.0f}" if "real_tokens_per_second" in m else "n/a",
        percent("mfu"), percent("hfu"),
        100 * m["goodput"], self.clock.seconds["checkpoint"], self.clock.seconds["eval"],
        _duration(eta), skipped)
    self.write(step, m, prefix="train")
    self.write(step, {f"{k}_seconds": v for k, v in self.clock.seconds.items()},
               prefix="time")
    if data_stats:
      self.write(step, data_stats, prefix="data")
    self.start_window(step)
    return m

  def write(self, step: int, scalars: dict[str, float], prefix: str):
    if self._writer is None:
      return
    for k, v in scalars.items():
      self._writer.add_scalar(f"{prefix}/{k}", v, step)
    self._writer.flush()

  def close(self):
    if self._writer is not None:
      self._writer.close()


def window_means(host_metrics: list[dict[str, float]]) -> dict[str, float]:
  """Each metric's mean over the steps whose `finite` is true (all steps when none is).

  A skipped step's loss may be NaN; averaged in, it would hide the window's
  finite steps.
  """
  finite = [x for x in host_metrics if bool(x.get("finite", True))] or host_metrics
  return {k: float(np.mean([x[k] for x in finite])) for k in finite[0] if k != "finite"}


def real_token_rates(host_metrics: list[dict[str, float]], seconds: float) -> dict[str, float]:
  """real_tokens (mean per step) and real_tokens_per_second of a logging window.

  Every step of the window counts, skipped ones too: their tokens went
  through the devices as well. Empty when the steps count no real_tokens.
  """
  real = [float(x["real_tokens"]) for x in host_metrics if "real_tokens" in x]
  if not real:
    return {}
  return {"real_tokens": float(np.mean(real)), "real_tokens_per_second": sum(real) / seconds}


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
