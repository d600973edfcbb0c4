"""What dropout's keep-masks cost XLA: operations per element and time on this machine.

  python -m bertjax.benchmarks.mask_cost

compiles `dropout.keep_mask` (hidden dropout, [32, 128, 768]) and
`dropout.attention_keep_mask` (attention, [8, 12, 512, 512]) alone, prints
XLA's cost analysis per mask element and the median of timed runs (the
mask written out as booleans, so the time is mostly memory).
"""

import argparse
import statistics
import time

import jax

from bertjax.model import dropout


def measure(fn, shape, rate: float, runs: int) -> dict:
  key = jax.random.key(0)
  jitted = jax.jit(lambda k: fn(k, shape, rate))
  compiled = jitted.lower(key).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  elements = 1
  for s in shape:
    elements *= s
  jitted(key).block_until_ready()
  times = []
  for _ in range(runs):
    t0 = time.perf_counter()
    jitted(key).block_until_ready()
    times.append(time.perf_counter() - t0)
  return {"ops_per_element": cost.get("flops", 0.0) / elements,
          "ms": 1e3 * statistics.median(times), "ms_range": (1e3 * min(times), 1e3 * max(times))}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rate", type=float, default=0.1)
  parser.add_argument("--runs", type=int, default=5)
  args = parser.parse_args(argv)
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
  for name, fn, shape in (("hidden", dropout.keep_mask, (32, 128, 768)),
                          ("attention", dropout.attention_keep_mask, (8, 12, 512, 512))):
    m = measure(fn, shape, args.rate, args.runs)
    print(f"{name:9s} {list(shape)}: {m['ops_per_element']:.1f} operations per element "
          f"(XLA's cost analysis), {m['ms']:.1f} ms median ({m['ms_range'][0]:.1f}-"
          f"{m['ms_range'][1]:.1f}) over {args.runs} runs")


if __name__ == "__main__":
  main()
