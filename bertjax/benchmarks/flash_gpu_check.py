"""Does each flash kernel compile on this GPU, and where does it stop if not?

  python -m bertjax.benchmarks.flash_gpu_check [--out=DIR] [--timeout_s=60]
      [--rows=reference,forward_p0,...]

Compiles, one row at a time, each in a process of its own, at BERT-LARGE's
attention (B=32, L=128, N=16, H=64, bf16; segment ids from a padding mask):

  reference   jax's own Pallas kernel (pallas/ops/gpu/attention.py's mha),
              forward and backward: a control for jaxlib's Triton pipeline
  forward_p0  flash_gpu's forward kernel alone, dropout 0
  forward     the same, attention dropout 0.1
  dkv_p0      the dk/dv kernel alone, dropout 0
  dkv         the same, dropout 0.1
  dq_p0       the dq kernel alone, dropout 0
  dq          the same, dropout 0.1
  grad_p0     attention.flash_attention's gradient (all three kernels and
              the XLA around them), dropout 0
  grad        the same, dropout 0.1: what BERT-LARGE's train step holds

Each row lowers (on jaxlib after 0.10.2 Triton compiles each kernel here),
compiles (XLA; on jaxlib 0.10.2 Triton too) and runs once, and prints one
JSON line: status "ok" with lower_s, compile_s and run_s; or, for a child
that has not finished within --timeout_s, which prints every thread's
Python stack (faulthandler.dump_traceback_later) and exits, status
"stopped", the stage it was in, its innermost frames and whose code they
are ("triton": jax's Pallas-to-Triton lowering or Triton's compile; "xla":
jax's compiler.py); or status "failed" with the error. Each row is written
to DIR/flash_gpu_check/ROW.json as it finishes (the child's stderr beside
it when it did not finish); DIR defaults to $OUT, else /tmp. A row takes
its start-up (about 10 s) and at most --timeout_s + 30 s. Imports only
jax, flax and numpy (with bertjax.model), so it runs where TensorFlow and
ml_collections are absent.
"""

import argparse
import faulthandler
import functools
import json
import os
import re
import subprocess
import sys
import time

from bertjax.benchmarks import row_process

B, L, N, H = 32, 128, 16, 64
RATE = 0.1
ROWS = ("reference", "forward_p0", "forward", "dkv_p0", "dkv", "dq_p0", "dq", "grad_p0", "grad")
GRACE_S = 30  # For the child's stack dump and exit after its own timeout.


def _program(row: str):
  """(function, arguments) of a row. Imports JAX here: the parent never does."""
  # pylint: disable=g-import-not-at-top
  import jax
  from jax.experimental.pallas.ops.gpu import attention as reference
  import jax.numpy as jnp
  import numpy as np
  from bertjax.model import attention
  from bertjax.model import dropout
  from bertjax.model import flash_gpu

  rng = np.random.default_rng(0)
  q, k, v, d_out = (jnp.asarray(rng.normal(size=(B, L, N, H)), jnp.bfloat16) for _ in range(4))
  mask = jnp.asarray(np.arange(L)[None, :] < rng.integers(L // 4, L + 1, B)[:, None])
  rate = 0.0 if row.endswith("_p0") or row == "reference" else RATE
  key = jax.random.key(0)
  scale = H ** -0.5

  def gradients(attend):
    loss = lambda q, k, v: jnp.sum((attend(q, k, v) * d_out).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2)), (q, k, v)

  if row == "reference":
    return gradients(lambda q, k, v: reference.mha(q, k, v, mask.astype(jnp.int32),
                                                   sm_scale=scale))
  if row.startswith("grad"):
    return gradients(lambda q, k, v: attention.flash_attention(
        q, k, v, mask, key=key, rate=rate, platform="gpu"))
  name = row.removesuffix("_p0")
  lse = jnp.zeros((B, N, L), jnp.float32)
  words = dropout.attention_words(key, B, N, L, jnp.int32) if rate else ()
  fn = functools.partial(flash_gpu.kernel, name, dropout_rate=rate, sm_scale=scale)
  return fn, (q, k, v, mask.astype(jnp.int32), d_out, lse, lse, *words)


def _stage(name: str):
  print(f"stage={name}", file=sys.stderr, flush=True)


def run_row(row: str, timeout_s: float) -> dict:
  """In the child: lower, compile and run one row, the stack dumped and the
  process ended if it takes over timeout_s."""
  import jax  # pylint: disable=g-import-not-at-top
  _stage("setup")
  fn, args = _program(row)
  faulthandler.dump_traceback_later(timeout_s, exit=True)
  times = {}
  start = time.perf_counter()
  _stage("lower")
  lowered = jax.jit(fn).lower(*args)
  times["lower_s"] = time.perf_counter() - start
  _stage("compile")
  compiled = lowered.compile()
  times["compile_s"] = time.perf_counter() - start - times["lower_s"]
  _stage("run")
  jax.block_until_ready(compiled(*args))
  times["run_s"] = time.perf_counter() - start - times["lower_s"] - times["compile_s"]
  faulthandler.cancel_dump_traceback_later()
  device = jax.devices()[0]
  return {"row": row, "status": "ok", **{k: round(t, 2) for k, t in times.items()},
          "jax": jax.__version__, "device": getattr(device, "device_kind", str(device))}


def _where(frames: list[str]) -> str:
  """Whose code a stalled child was in, from its innermost frames."""
  text = " ".join(frames)
  if "triton" in text:  # jax/_src/pallas/triton/..., jax/_src/lib/triton.py.
    return "triton"
  if "_src/compiler.py" in text:
    return "xla"
  return ""


def check_row(row: str, timeout_s: float, out_dir: str) -> dict:
  """Runs a row in a child process; returns (and writes) its result."""
  start = time.perf_counter()
  try:
    done = subprocess.run([sys.executable, "-m", "bertjax.benchmarks.flash_gpu_check",
                           "--child", row, f"--timeout_s={timeout_s}"],
                          capture_output=True, text=True, timeout=timeout_s + GRACE_S,
                          check=False, env=_child_env())
    stdout, stderr, code = done.stdout, done.stderr, done.returncode
  except subprocess.TimeoutExpired as stopped:
    stdout, stderr, code = (_text(stopped.stdout), _text(stopped.stderr), None)
  lines = stdout.strip().splitlines()
  before_dump = stderr.split("Timeout (", 1)[0]
  timed_out = code is None or ("Timeout (" in stderr
                               and "Traceback (most recent call last)" not in before_dump)
  if code == 0 and lines:
    result = json.loads(lines[-1])
  else:
    stages = re.findall(r"^stage=(\w+)$", stderr, re.MULTILINE)
    frames = row_process.innermost(stderr) if timed_out else []
    result = {"row": row, "status": "stopped" if timed_out else "failed",
              "stage": stages[-1] if stages else "start", "where": _where(frames),
              "seconds": round(time.perf_counter() - start, 1), "exit_code": code,
              "innermost": frames, "error": "" if timed_out else _error(stderr)}
    with open(os.path.join(out_dir, f"{row}.stderr.txt"), "w") as f:
      f.write(stderr)
  with open(os.path.join(out_dir, f"{row}.json"), "w") as f:
    json.dump(result, f, indent=1)
  return result


def _child_env() -> dict[str, str]:
  """This environment, the child allocating GPU memory as it goes (a parent
  that runs JAX, a test process, may hold most of it already)."""
  return dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")


def _error(stderr: str) -> str:
  """The last exception line of a child's stderr (else its last line)."""
  errors = re.findall(r"^[\w.]*(?:Error|Exception)\b.*$", stderr, re.MULTILINE)
  lines = stderr.strip().splitlines()
  return (errors[-1] if errors else lines[-1] if lines else "")[:600]


def _text(output) -> str:
  if output is None:
    return ""
  return output.decode(errors="replace") if isinstance(output, bytes) else output


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=os.environ.get("OUT") or "/tmp",
                      help="rows go to OUT/flash_gpu_check/ (default: $OUT, else /tmp)")
  parser.add_argument("--timeout_s", type=float, default=60.0,
                      help="seconds a row may take to lower, compile and run (default 60)")
  parser.add_argument("--rows", default=",".join(ROWS),
                      help=f"comma-separated, from {', '.join(ROWS)} (default: all, in that order)")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(run_row(args.child, args.timeout_s)), flush=True)
    return
  rows = [r for r in args.rows.split(",") if r]
  unknown = [r for r in rows if r not in ROWS]
  if unknown:
    parser.error(f"--rows: unknown row(s) {', '.join(unknown)}; choose from {', '.join(ROWS)}")
  out_dir = os.path.join(args.out, "flash_gpu_check")
  os.makedirs(out_dir, exist_ok=True)
  for row in rows:
    print(json.dumps(check_row(row, args.timeout_s, out_dir)), flush=True)


if __name__ == "__main__":
  main()
