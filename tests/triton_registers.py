"""Registers, spills and matrix instructions of Triton kernels compiled for
Hopper (sm_90) on any host, no GPU needed.

  .venv/bin/python tests/flash_sizes.py --ttir /tmp/ttir
  python3 -m venv /tmp/triton && /tmp/triton/bin/pip install triton==3.9.0
  /tmp/triton/bin/python tests/triton_registers.py /tmp/ttir

compiles each NAME.wWARPSsSTAGES.ttir that flash_sizes.py wrote with the
triton package (not one of bertjax's dependencies: run it with a Python that
has it), reads the cubin's resource usage with the cuobjdump that the
package ships, and prints one JSON line per kernel: registers per thread,
stack bytes (where registers spill), wgmma and mma.sync instructions in the
PTX, shared memory, seconds to compile. jaxlib's own pipeline compiles with another Triton, so this
says what Triton makes of the kernels, not how long jaxlib takes.
"""

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

# A fresh cache, so that compile_s is a compile; fused multiply-adds, Triton's default.
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton_cache_"))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # pylint: disable=wrong-import-position
from triton.backends.compiler import GPUTarget  # pylint: disable=wrong-import-position


def compile_one(path: str) -> dict:
  warps, stages = map(int, re.search(r"\.w(\d+)s(\d+)\.ttir$", path).groups())
  start = time.time()
  kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})
  seconds = time.time() - start
  cubin = path[:-len(".ttir")] + ".cubin"
  with open(cubin, "wb") as f:
    f.write(kernel.asm["cubin"])
  cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                           "cuobjdump")
  usage = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True,
                         check=True).stdout
  field = lambda name: int(re.search(rf"\b{name}:(\d+)", usage.split("Function")[1]).group(1))
  ptx = kernel.asm["ptx"]
  return {"kernel": os.path.basename(path), "registers": field("REG"),
          "stack_bytes": field("STACK"), "wgmma": ptx.count("wgmma.mma_async"),
          "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
          "shared_bytes": kernel.metadata.shared, "compile_s": round(seconds, 2)}


if __name__ == "__main__":
  for ttir in sorted(glob.glob(os.path.join(sys.argv[1], "*.ttir"))):
    print(json.dumps(compile_one(ttir)), flush=True)
