"""The device mesh and the logical-axis rules that place parameters and activations.

The mesh has three axes: `data` (replicated parameters, split batch),
`fsdp` (parameters and optimizer state split too) and `tensor` (heads and
feed-forward split). config.mesh.rules maps the logical names that the model
puts on parameters and activations onto these axes; it is the only place
where placement is decided.
"""

import contextlib
import math
from typing import Any, Sequence

from absl import logging
import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, ...]:
  """Resolves the one -1 in config.mesh to the devices that remain."""
  sizes = [int(getattr(mesh_config, a)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh: at most one of {MESH_AXES} may be -1, got {sizes}")
  for axis, size in zip(MESH_AXES, sizes):
    if size == 0 or size < -1:
      raise ValueError(f"config.mesh.{axis}: must be a positive size or -1, got {size}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"config.mesh: {num_devices} devices do not divide into "
                       f"the fixed axes {dict(zip(MESH_AXES, sizes))}")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f"config.mesh: {dict(zip(MESH_AXES, sizes))} needs "
                     f"{math.prod(sizes)} devices, but {num_devices} are available")
  return tuple(sizes)


def make_mesh(mesh_config, devices: Sequence[Any] | None = None) -> Mesh:
  """A mesh over `devices` (default: all), laid out for the physical topology.

  Where mesh_utils cannot lay the shape out on the topology, the devices are
  reshaped in their listed order instead, with a warning: that mesh is
  correct, but its neighbours in an axis need not be neighbours on the
  interconnect.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  try:
    device_array = mesh_utils.create_device_mesh(
        shape, devices=devices, allow_split_physical_axes=True)
  except (AssertionError, ValueError, NotImplementedError) as e:
    logging.warning(
        "make_mesh: mesh_utils.create_device_mesh could not lay out the mesh %s over "
        "%d %s devices (%s: %s); using the devices in their listed order instead, "
        "which may put an axis's neighbours far apart on the interconnect.",
        dict(zip(MESH_AXES, shape)), len(devices),
        getattr(devices[0], "device_kind", "?"), type(e).__name__, e)
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES)


def rules(mesh_config) -> tuple[tuple[str, Any], ...]:
  """config.mesh.rules as the tuple of pairs that Flax expects."""
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
               for name, axes in mesh_config.rules)


def logical_to_sharding(logical_tree, mesh: Mesh, axis_rules) -> Any:
  """A tree of logical PartitionSpecs -> a tree of NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_tree, mesh, axis_rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches are split on their leading axis over every data-parallel axis."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


@contextlib.contextmanager
def mesh_context(mesh: Mesh, axis_rules):
  """The mesh and rules under which jitted steps trace and run."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(axis_rules):
    yield
