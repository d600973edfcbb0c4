"""The device mesh and the logical-axis rules that place parameters and activations.

The mesh has three axes: `data` (replicated parameters, split batch),
`fsdp` (parameters and optimizer state split too) and `tensor` (heads and
feed-forward split). config.mesh.rules maps the logical names that the model
puts on parameters and activations onto these axes; it is the only place
where placement is decided.

Each axis has a part inside a slice, over the chips' interconnect (ICI:
config.mesh.data, fsdp, tensor), and a part across slices, over the
data-center network (DCN: config.mesh.dcn_data, dcn_fsdp, dcn_tensor). The
mesh axis is their product, the DCN part outermost, so the rules table is
the same for one slice and for many. By default the slices split the batch
(data parallelism across slices: one gradient all-reduce per step crosses
the DCN) and each config's ICI sizes apply inside every slice.
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
DCN_FIELDS = tuple(f"dcn_{a}" for a in MESH_AXES)
# A config without the DCN fields (one written before they existed) reads with
# configs/base.py's defaults: data parallel across however many slices there are.
_DCN_DEFAULTS = {"dcn_data": -1, "dcn_fsdp": 1, "dcn_tensor": 1}


def _resolve(sizes: list[int], total: int, fields: Sequence[str], what: str) -> tuple[int, ...]:
  """Fills the one -1 in `sizes` so that their product is `total`."""
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh: at most one of {tuple(fields)} may be -1, got {sizes}")
  for field, size in zip(fields, sizes):
    if size == 0 or size < -1:
      raise ValueError(f"config.mesh.{field}: must be a positive size or -1, got {size}")
  named = lambda s: dict(zip(fields, s))
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if total % known:
      raise ValueError(f"config.mesh: {total} {what} do not divide into "
                       f"the fixed axes {named(sizes)}")
    sizes[sizes.index(-1)] = total // known
  if math.prod(sizes) != total:
    raise ValueError(f"config.mesh: {named(sizes)} needs "
                     f"{math.prod(sizes)} {what}, but {total} are available")
  return tuple(sizes)


def dcn_sizes(mesh_config) -> list[int]:
  """config.mesh's DCN sizes as written (-1 unresolved), in MESH_AXES order."""
  return [int(getattr(mesh_config, f, _DCN_DEFAULTS[f])) for f in DCN_FIELDS]


def hybrid_mesh_shape(mesh_config, num_devices: int,
                      num_slices: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(ICI shape, DCN shape) of config.mesh over `num_devices` in `num_slices` slices.

  A -1 among the DCN sizes takes the slices that remain, a -1 among the ICI
  sizes the devices of one slice that remain.
  """
  if num_devices % num_slices:
    raise ValueError(f"config.mesh: {num_devices} devices do not split into "
                     f"{num_slices} equal slices")
  dcn = _resolve(dcn_sizes(mesh_config), num_slices, DCN_FIELDS, "slices")
  ici = _resolve([int(getattr(mesh_config, a)) for a in MESH_AXES], num_devices // num_slices,
                 MESH_AXES, "devices" if num_slices == 1 else "devices of a slice")
  return ici, dcn


def mesh_shape(mesh_config, num_devices: int, num_slices: int = 1) -> tuple[int, ...]:
  """The sizes of the mesh's axes: each ICI size times its DCN size.

  The data-parallel size (data x fsdp) and the tensor size do not depend on
  `num_slices` unless a -1 sits on an axis that the slices do not split.
  """
  ici, dcn = hybrid_mesh_shape(mesh_config, num_devices, num_slices)
  return tuple(i * d for i, d in zip(ici, dcn))


def device_slices(devices: Sequence[Any], mesh_config=None,
                  num_slices: int | None = None) -> tuple[list[list[Any]], str]:
  """The devices grouped into slices, in slice order, and what groups them.

  TPU devices of a multi-slice job name their slice (`slice_index`).
  Devices that name one slice or none (CPU and GPU devices name slice 0)
  are one slice, unless `num_slices` splits them in their listed order into
  that many equal slices, or config.mesh fixes DCN sizes above 1: then each
  process is a slice (a multi-process run on one machine plays a
  multi-slice job that way).
  """
  devices = list(devices)
  groups: dict[int, list[Any]] = {}
  if hasattr(devices[0], "slice_index"):
    for d in devices:
      groups.setdefault(d.slice_index, []).append(d)
  if len(groups) > 1:
    how = "slice_index"
  elif num_slices:
    if len(devices) % num_slices:
      raise ValueError(f"{len(devices)} devices do not split into {num_slices} equal slices")
    per = len(devices) // num_slices
    return [devices[i * per:(i + 1) * per] for i in range(num_slices)], "listed"
  elif mesh_config is not None and math.prod(s for s in dcn_sizes(mesh_config) if s > 0) > 1:
    groups, how = {}, "process_index"
    for d in devices:
      groups.setdefault(d.process_index, []).append(d)
  else:
    return [devices], "one slice"
  if num_slices and num_slices != len(groups):
    raise ValueError(f"num_slices={num_slices}, but the devices are in {len(groups)} slices")
  return [groups[k] for k in sorted(groups)], how


def listed_device_array(slices: Sequence[Sequence[Any]], ici: Sequence[int],
                        dcn: Sequence[int]) -> np.ndarray:
  """The mesh's devices laid out in their listed order within each slice.

  Slice s sits at position s of the DCN shape (row-major), and each axis
  runs over the DCN part outermost, as mesh_utils.create_hybrid_device_mesh
  lays them out.
  """
  n = len(ici)
  blocks = np.asarray([list(s) for s in slices], dtype=object).reshape(tuple(dcn) + tuple(ici))
  order = [k for a in range(n) for k in (a, n + a)]  # (dcn_0, ici_0, dcn_1, ici_1, ...)
  return blocks.transpose(order).reshape(tuple(i * d for i, d in zip(ici, dcn)))


def make_mesh(mesh_config, devices: Sequence[Any] | None = None, *,
              num_slices: int | None = None) -> Mesh:
  """A mesh over `devices` (default: all), laid out for the physical topology.

  One slice is laid out by mesh_utils.create_device_mesh; several (see
  device_slices; `num_slices` splits devices that name no slice) by
  mesh_utils.create_hybrid_device_mesh, each axis's DCN part across slices
  and its ICI part inside them. Where mesh_utils cannot lay the shape out
  on the topology, the devices are placed in their listed order within
  each slice instead, with a warning: that mesh is correct, but its
  neighbours in an axis need not be neighbours on the interconnect.
  """
  devices = list(jax.devices() if devices is None else devices)
  slices, grouped_by = device_slices(devices, mesh_config, num_slices)
  ici, dcn = hybrid_mesh_shape(mesh_config, len(devices), len(slices))
  shape = tuple(i * d for i, d in zip(ici, dcn))
  try:
    if len(slices) == 1:
      device_array = mesh_utils.create_device_mesh(
          shape, devices=devices, allow_split_physical_axes=True)
    elif grouped_by == "listed":
      device_array = listed_device_array(
          [mesh_utils.create_device_mesh(ici, devices=s, allow_split_physical_axes=True).ravel()
           for s in slices], ici, dcn)
    else:
      device_array = mesh_utils.create_hybrid_device_mesh(
          ici, dcn, devices=devices, process_is_granule=grouped_by == "process_index",
          allow_split_physical_axes=True)
  except (AssertionError, ValueError, NotImplementedError) as e:
    layout = dict(zip(MESH_AXES, shape)) if len(slices) == 1 else (
        f"{dict(zip(MESH_AXES, ici))} in each of {dict(zip(DCN_FIELDS, dcn))} slices")
    logging.warning(
        "make_mesh: mesh_utils could not lay out the mesh %s over "
        "%d %s devices (%s: %s); using the devices in their listed order instead, "
        "which may put an axis's neighbours far apart on the interconnect.",
        layout, len(devices), getattr(devices[0], "device_kind", "?"), type(e).__name__, e)
    device_array = listed_device_array(slices, ici, dcn)
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
