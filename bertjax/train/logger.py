"""Console lines, TensorBoard scalars and the throughput figures behind them."""

import time
from typing import Any, Optional

import jax
import numpy as np
from absl import logging

from bertjax.model.config import BertConfig
from bertjax.train import flops


class _LibraryInfoFilter:
  """Drops INFO lines from orbax, whose per-save chatter buries the run's own log."""

  def filter(self, record) -> bool:
    return record.levelno > 20 or "/orbax/" not in record.pathname


def quiet_library_logs():
  absl_logger = logging.get_absl_logger()
  if not any(isinstance(f, _LibraryInfoFilter) for f in absl_logger.filters):
    absl_logger.addFilter(_LibraryInfoFilter())


def first_nonfinite(step_metrics: list[tuple[int, dict[str, Any]]]) -> Optional[int]:
  """The step of the first metrics dict whose `finite` flag is off."""
  for step, m in step_metrics:
    if not bool(m["finite"]):
      return step
  return None


class MetricLogger:
  """Averages step metrics over a logging window and writes them out."""

  def __init__(self, workdir: str, model_config: BertConfig, total_steps: int,
               peak_tflops: float = 0.0):
    self.model_config = model_config
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
    self._t0 = None
    self._step0 = None

  def start_window(self, step: int):
    self._t0, self._step0 = time.perf_counter(), step

  def log_train(self, step: int, phase, host_metrics: list[dict[str, float]],
                learning_rate: float) -> dict[str, float]:
    """Averages the window's metrics, adds rates, prints and writes them."""
    now = time.perf_counter()
    steps = step - self._step0
    seconds = max(now - self._t0, 1e-9)
    m = {k: float(np.mean([x[k] for x in host_metrics])) for k in host_metrics[0]
         if k != "finite"}
    steps_per_s = steps / seconds
    seqs = steps_per_s * phase.global_batch_size
    m.update(learning_rate=learning_rate, step_time=1.0 / max(steps_per_s, 1e-9),
             sequences_per_second=seqs,
             tokens_per_second=seqs * phase.max_seq_length)
    util = flops.mfu(self.model_config, phase.max_seq_length, phase.max_predictions_per_seq,
                     seqs, self.num_chips, self.peak)
    if util is not None:
      m["mfu"] = util
    eta = (self.total_steps - step) / max(steps_per_s, 1e-9)
    mfu_text = f"{100 * util:.1f}%" if util is not None else "n/a"
    logging.info(
        "step %d/%d [%s] loss %.4f  mlm_acc %.4f  nsp_acc %.4f  lr %.3g  "
        "%.1f seq/s  MFU %s  ETA %s", step, self.total_steps, phase.name, m["loss"],
        m["mlm_accuracy"], m["nsp_accuracy"], learning_rate, seqs, mfu_text,
        _duration(eta))
    self.write(step, m, prefix="train")
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


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
