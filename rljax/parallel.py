"""Meshes and shardings: one mesh with axes (data, fsdp, tensor), one rules table.

Every parameter carries logical axis names (`logical_axes` metadata on its `nnx.Param`);
`LOGICAL_RULES` maps each logical axis to mesh axes. Batches are split over
`("data", "fsdp")` on their leading dimension. A layout that does not divide fails here,
at start-up, with the tensor, its size and the mesh in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axis (or tuple of axes, or None = replicated)
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": BATCH_AXES,
    "length": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "layers": None,
}


class ShardingError(ValueError):
    """A tensor or batch that does not divide over the mesh."""


@dataclass
class MeshConfig:
    """Mesh shape; one of the three may be -1 (filled from the device count)."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        dims = [self.data, self.fsdp, self.tensor]
        if dims.count(-1) > 1:
            raise ShardingError(f"mesh {dims}: at most one of data/fsdp/tensor may be -1")
        known = math.prod(d for d in dims if d != -1)
        if -1 in dims:
            if num_devices % known:
                raise ShardingError(f"mesh {dims}: {num_devices} devices are not divisible by {known}")
            dims[dims.index(-1)] = num_devices // known
        if math.prod(dims) != num_devices:
            raise ShardingError(
                f"mesh data={dims[0]} fsdp={dims[1]} tensor={dims[2]} needs {math.prod(dims)} devices, "
                f"{num_devices} are available"
            )
        return tuple(dims)


def make_mesh(config: MeshConfig, devices=None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    shape = config.shape(len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)


def _mesh_desc(mesh: Mesh) -> str:
    return "mesh(" + ", ".join(f"{k}={v}" for k, v in mesh.shape.items()) + ")"


def logical_to_spec(logical_axes, shape, mesh: Mesh, name: str = "tensor") -> P:
    """PartitionSpec for a tensor with the given logical axes, checked for divisibility."""
    spec = []
    for axis, size in zip(logical_axes, shape):
        mesh_axes = LOGICAL_RULES.get(axis) if axis else None
        if mesh_axes is None:
            spec.append(None)
            continue
        group = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
        group = tuple(a for a in group if mesh.shape[a] > 1)
        if not group:
            spec.append(None)
            continue
        ways = math.prod(mesh.shape[a] for a in group)
        if size % ways:
            raise ShardingError(
                f"{name}: dimension {axis!r} of size {size} is not divisible by {ways} "
                f"(mesh axes {group}) on {_mesh_desc(mesh)}"
            )
        spec.append(group[0] if len(group) == 1 else group)
    return P(*spec)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def state_shardings(state, mesh: Mesh):
    """A tree like `state` (an nnx.State of Variables) whose leaves are NamedShardings."""

    def one(path, var):
        axes = var.get_metadata().get("logical_axes")
        shape = var.get_value().shape
        if axes is None:
            axes = (None,) * len(shape)
        name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        return var.replace(NamedSharding(mesh, logical_to_spec(axes, shape, mesh, name)))

    return jax.tree_util.tree_map_with_path(one, state, is_leaf=_is_variable)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_batch(batch_size: int, mesh: Mesh, name: str = "batch") -> None:
    ways = data_parallel_size(mesh)
    if batch_size % ways:
        raise ShardingError(
            f"{name} of size {batch_size} is not divisible by the data-parallel size {ways} "
            f"(data x fsdp) of {_mesh_desc(mesh)}"
        )


def shard_batch(batch: dict, mesh: Mesh) -> dict:
    """Assemble a global batch from each process's rows (dict of numpy arrays), split
    over data x fsdp. With one process the local rows are the whole batch."""
    sharding = batch_sharding(mesh)
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        global_shape = (value.shape[0] * jax.process_count(), *value.shape[1:])
        check_batch(global_shape[0], mesh, name=f"batch[{key!r}]")
        out[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return out
