"""What a fit check compiles for: the devices of a TPU topology, on any host, or
this machine's own, and the memory a program may use on one of them.

A topology (e.g. v5e:2x4, v4:2x2x1) is compiled for on a CPU host with
libtpu (`pip install "jax[tpu]"`, JAX_PLATFORMS=cpu), which describes its
devices and stops a program larger than a device's HBM; no topology ("")
means this machine's devices, whose backend may report the memory a program
may use (a GPU does; the CPU does not).
"""

import functools
import re

import jax
import jax.numpy as jnp


# Options of jax.experimental.topologies.get_topology_desc by TPU generation. A
# v4 topology lists each chip's two TensorCores as two devices unless asked
# for megacore, where one device is the whole chip, as the v4 runtime runs it.
# v5p topologies list one device per chip without being asked.
TOPOLOGY_OPTIONS = {"v4": {"chip_config_name": "megacore"}}


def topology_devices(topology: str, num_slices: int = 1) -> list:
  """The compile-only devices of `num_slices` slices of a TPU topology (e.g. v4:2x2x1,
  v5e:1x1), one per chip.

  With several slices the devices are listed slice by slice, each naming its
  slice (slice_index) as the devices of a multi-slice job do.
  """
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  options = dict(TOPOLOGY_OPTIONS.get(topology.split(":")[0], {}))
  if all(n == "1" for n in topology.split(":")[-1].split("x")):
    # One chip: libtpu's default host of 2x2 chips would not divide it.
    options["chips_per_host_bounds"] = (1, 1, 1)
  if num_slices > 1:
    options["num_slices"] = num_slices
  return topologies.get_topology_desc(platform="tpu", topology_name=topology,
                                      **options).devices


# libtpu's RESOURCE_EXHAUSTED messages name the HBM a program may use in one of
# two forms: "... exceeds available HBM (15.75G)." and "Used 17.20G of 15.75G hbm."
_AVAILABLE_HBM = re.compile(
    r"exceeds available HBM \((?P<a>[0-9.]+) ?(?P<a_unit>[KMGT]?)i?B?\)"
    r"|Used [0-9.]+ ?[KMGT]?i?B? of (?P<b>[0-9.]+) ?(?P<b_unit>[KMGT]?)i?B? hbm",
    re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_available_hbm(message: str) -> int | None:
  """Bytes of available HBM named by a libtpu out-of-memory message; None if it names none.

  libtpu prints sizes in binary units rounded to two decimals (15.75G is
  15.75 GiB), so the figure is within 0.005 of its unit of the compiler's.
  """
  match = _AVAILABLE_HBM.search(message)
  if match is None:
    return None
  number, unit = (match["a"], match["a_unit"]) if match["a"] else (match["b"], match["b_unit"])
  return int(float(number) * _UNITS[unit.upper()])


OVERSIZED_BYTES = 2**40  # 1 TiB: more than the HBM of any TPU chip.


@functools.cache
def available_hbm_bytes(topology: str) -> int | None:
  """HBM the compiler lets a program use on one device of `topology`, in bytes.

  It differs from the chip's nominal HBM (flops.HBM_GIB): 15.75 GiB on a v5e
  chip, for one, against 16 nominal. Read from the RESOURCE_EXHAUSTED message
  of a compile for one of the topology's devices that needs OVERSIZED_BYTES;
  None when the compiler does not stop it or its message names no figure. Cached per
  topology (the compile takes under a second).
  """
  sharding = jax.sharding.SingleDeviceSharding(topology_devices(topology)[0])
  oversized = jax.jit(lambda: jnp.zeros((OVERSIZED_BYTES,), jnp.uint8),
                      out_shardings=sharding)
  try:
    oversized.lower().compile()
  except jax.errors.JaxRuntimeError as e:
    if not is_out_of_memory(e):
      raise
    return parse_available_hbm(str(e))
  return None


def devices(topology: str, num_slices: int = 1) -> list:
  """The devices a fit check compiles for: `num_slices` slices of `topology`, or
  with no topology ("") this machine's."""
  return topology_devices(topology, num_slices) if topology else jax.devices()


def available_bytes(topology: str) -> int | None:
  """The memory a program may use on one device: the compiler's figure for a
  topology (available_hbm_bytes), the backend's `bytes_limit` for this
  machine's devices; None where neither is known (the CPU reports none)."""
  if topology:
    return available_hbm_bytes(topology)
  return (jax.devices()[0].memory_stats() or {}).get("bytes_limit")


def is_out_of_memory(error: Exception) -> bool:
  """Whether a compile failed because the program needs more HBM than the device has."""
  return "RESOURCE_EXHAUSTED" in str(error)
