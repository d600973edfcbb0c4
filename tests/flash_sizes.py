"""The size of each Triton kernel in a program lowered for CUDA, on any host.

A Pallas kernel for GPU lowers to a custom call whose backend_config holds
the kernel's Triton module, serialized as MLIR bytecode (the `ir` field,
jaxlib up to 0.10.2; later releases compile it while lowering and keep
PTX instead). Its size is the number of operations in that module (tt.,
arith., scf. and math. operations): deterministic for a jax release, and
compared with jax's own reference kernel lowered by the same release at the
same shape, a ratio that shows when a kernel grows. test_flash_attention.py
bounds the ratios; run as a script, this prints them (docs/attention.md):

  .venv/bin/python tests/flash_sizes.py

and with `--ttir DIR` writes each kernel's Triton module as text, for
Triton itself to compile on any host (tests/triton_registers.py).
"""

import json
import os
import sys

import jax
from jax import export
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib.mlir import ir
from jax.experimental.pallas.ops.gpu import attention as reference
import jax.numpy as jnp
from jaxlib.triton import dialect as triton_dialect

from bertjax.model import attention
from bertjax.model import flash_gpu

SHAPE = (4, 128, 16, 64)  # [B, L, N, H]: BERT-LARGE's heads at 128, four batch rows.


def _triton_modules(fn, *args) -> dict[str, tuple[str, int, int]]:
  """{kernel name: (its Triton module as text, warps, stages)} of
  jax.jit(fn)(*args) lowered for CUDA; empty where the calls carry no
  Triton module (jaxlib after 0.10.2)."""
  exported = export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=[
      export.DisabledSafetyCheck.custom_call(t) for t in flash_gpu.TRITON_CALL_TARGETS])(*args)
  kernels = {}
  with _context():
    def find(op):
      op = op.operation
      config = (op.attributes["mhlo.backend_config"]
                if "mhlo.backend_config" in op.attributes else None)
      if isinstance(config, ir.DictAttr) and "ir" in config:
        kernels[ir.StringAttr(config["name"]).value] = (
            str(ir.Module.parse(ir.StringAttr(config["ir"]).value_bytes)),
            ir.IntegerAttr(config["num_warps"]).value, ir.IntegerAttr(config["num_stages"]).value)
      return ir.WalkResult.ADVANCE
    ir.Module.parse(exported.mlir_module()).operation.walk(find)
  return kernels


def _context():
  context = jax_mlir.make_ir_context()
  triton_dialect.register_dialect(context)
  return context


def kernel_sizes(fn, *args) -> dict[str, int]:
  """{kernel name: operations in its Triton module} of jax.jit(fn)(*args)
  lowered for CUDA (see _triton_modules)."""
  with _context():
    return {name: _operations(ir.Module.parse(text))
            for name, (text, _, _) in _triton_modules(fn, *args).items()}


def _operations(module) -> int:
  count = 0
  def visit(op):
    nonlocal count
    count += op.operation.name != "builtin.module"
    return ir.WalkResult.ADVANCE
  module.operation.walk(visit)
  return count


def _gradients(attend):
  def grads(q, k, v):
    loss = lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  arg = jax.ShapeDtypeStruct(SHAPE, jnp.bfloat16)
  return grads, arg, arg, arg


def _ours(rate: float, causal: bool):
  mask = jnp.ones(SHAPE[:2], bool)
  return _gradients(lambda q, k, v: attention.flash_attention(
      q, k, v, mask, key=jax.random.key(0), rate=rate, causal=causal, platform="gpu"))


def _jax_reference(causal: bool):
  segment_ids = jnp.ones(SHAPE[:2], jnp.int32)
  scale = SHAPE[3] ** -0.5
  return _gradients(lambda q, k, v: reference.mha(q, k, v, segment_ids, sm_scale=scale,
                                                  causal=causal))


def ours(rate: float = 0.1, causal: bool = False) -> dict[str, int]:
  """flash_gpu's kernels (forward, dk/dv, dq) at SHAPE, bf16, the padding mask
  as segment ids, its default block sizes."""
  return kernel_sizes(*_ours(rate, causal))


def jax_reference(causal: bool = False) -> dict[str, int]:
  """jax.experimental.pallas.ops.gpu.attention.mha's kernels (forward,
  o . do, and one backward for dq, dk and dv) at SHAPE, bf16, with segment
  ids and its default block sizes."""
  return kernel_sizes(*_jax_reference(causal))


def write_triton_modules(directory: str):
  """Writes each kernel of both (dropout 0.1, not causal) as NAME.wWARPSsSTAGES.ttir,
  for tests/triton_registers.py."""
  os.makedirs(directory, exist_ok=True)
  for program in (_ours(0.1, False), _jax_reference(False)):
    for name, (text, warps, stages) in _triton_modules(*program).items():
      with open(os.path.join(directory, f"{name}.w{warps}s{stages}.ttir"), "w") as f:
        f.write(text)


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--ttir":
    write_triton_modules(sys.argv[2])
  else:
    print(json.dumps({"jax": jax.__version__, "shape": SHAPE,
                      "ours, dropout 0.1": ours(0.1), "ours, dropout 0": ours(0.0),
                      "ours, dropout 0.1, causal": ours(0.1, causal=True),
                      "jax reference": jax_reference(),
                      "jax reference, causal": jax_reference(causal=True)}, indent=1))
