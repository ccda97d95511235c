"""Rollout replicas: which devices form each replica, and the meshes they run on.

A replica is `tp` devices (`rollout.tensor_parallel_size`) holding a full copy of the
weights, heads / MLP / vocab split over its "tensor" axis, everything else replicated in
it; it has its own KV pool and its own scheduler. `dp` replicas
(`rollout.data_parallel_size`, default: devices / tp) cover the rollout's devices.

Why the layout is built this way:
- SPMD: the layout is a pure function of the device list (`jax.devices()` by default),
  which every process sees identically, so every process derives the same replicas in
  the same order without talking.
- Locality: devices are ordered process-major, then by id, and cut into consecutive runs
  of `tp`. When every process's device count divides by `tp` each replica lies on one
  process, so its programs and its scheduler need no other host. A replica spanning
  hosts is refused unless `allow_cross_host` asks for it.
- One global mesh (`mesh`: data = dp, fsdp = 1, tensor = tp, row r = replica r) over all
  replicas lets the weight hand-off (`rljax.rollout.handoff`) reshard from the training
  layout in one program; each replica's mesh (`replicas[r]`: 1 x 1 x tp) holds the same
  devices in the same tensor order, so a replica's arrays are views of that row's shards.
  Both use the axis names of `rljax.parallel`, so `state_shardings` and `constrain` work
  on them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from rljax.parallel import MESH_AXES, ShardingError
from rljax.rollout.kv_cache import CacheShape

_AUTO = (AxisType.Auto,) * len(MESH_AXES)


class DeviceLike(Protocol):
    """What grouping reads of a device (a `jax.Device`, or a stand-in in tests)."""

    id: int
    process_index: int


def group_devices(
    devices: Sequence[DeviceLike],
    tensor_parallel_size: int,
    data_parallel_size: int | None = None,
    allow_cross_host: bool = False,
) -> list[list[DeviceLike]]:
    """The devices of each replica: `[dp][tp]`, process-major then by id.

    Raises ShardingError (one line, naming the config keys) for a size that does not
    divide the devices, a dp x tp that is not the device count, a replica that would
    span processes without `allow_cross_host`, or one that would span TPU slices (its
    collectives would cross the data-center network: never)."""
    tp, n = tensor_parallel_size, len(devices)
    if tp < 1:
        raise ShardingError(f"rollout.tensor_parallel_size={tp}: must be >= 1")
    if n % tp:
        raise ShardingError(f"rollout.tensor_parallel_size={tp} does not divide the {n} rollout devices")
    dp = n // tp if data_parallel_size is None else data_parallel_size
    if dp < 1 or dp * tp != n:
        raise ShardingError(
            f"rollout.data_parallel_size={dp} x rollout.tensor_parallel_size={tp} = {dp * tp} replica devices, "
            f"but the rollout has {n} devices"
        )
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    if len({(d.process_index, d.id) for d in ordered}) != n:
        raise ShardingError("the rollout device list names a device twice")
    groups = [ordered[i : i + tp] for i in range(0, n, tp)]
    for r, group in enumerate(groups):
        slices = sorted({d.slice_index for d in group if getattr(d, "slice_index", None) is not None})
        if len(slices) > 1:
            raise ShardingError(f"replica {r} of rollout.tensor_parallel_size={tp} devices spans slices {slices}; "
                                "a replica stays inside a slice")
    if not allow_cross_host:
        for r, group in enumerate(groups):
            processes = sorted({d.process_index for d in group})
            if len(processes) > 1:
                raise ShardingError(
                    f"replica {r} of rollout.tensor_parallel_size={tp} devices spans processes {processes} "
                    "(set rollout.allow_cross_host_replicas=true to allow it)"
                )
    return groups


@dataclass(frozen=True)
class ReplicaLayout:
    """The rollout replicas over a set of devices (see the module docstring).

    mesh: every replica's devices, `[data = dp, fsdp = 1, tensor = tp]`, row r = replica r.
    replicas: replica r's own mesh, `[1, 1, tp]`, the devices of `mesh`'s row r in order.
    """

    mesh: Mesh
    replicas: tuple[Mesh, ...]

    @classmethod
    def create(
        cls,
        devices: Sequence[jax.Device] | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int | None = None,
        allow_cross_host: bool = False,
    ) -> "ReplicaLayout":
        """Replicas over `devices` (default: every device of every process)."""
        devices = list(jax.devices() if devices is None else devices)
        groups = group_devices(devices, tensor_parallel_size, data_parallel_size, allow_cross_host)
        tp = tensor_parallel_size
        grid = np.empty((len(groups), 1, tp), dtype=object)  # [dp, fsdp = 1, tp]
        for r, group in enumerate(groups):
            grid[r, 0, :] = group
        mesh = Mesh(grid, MESH_AXES, axis_types=_AUTO)
        replicas = tuple(Mesh(grid[r : r + 1], MESH_AXES, axis_types=_AUTO) for r in range(len(groups)))
        return cls(mesh, replicas)

    @property
    def num_replicas(self) -> int:
        return len(self.replicas)

    @property
    def tensor_parallel_size(self) -> int:
        return self.mesh.shape["tensor"]

    def local_replicas(self, process_index: int | None = None) -> tuple[int, ...]:
        """Replicas this process takes part in (owns at least one of their devices);
        with replicas inside hosts, exactly those whose devices it owns."""
        process = jax.process_index() if process_index is None else process_index
        return tuple(
            r for r, mesh in enumerate(self.replicas) if any(d.process_index == process for d in mesh.devices.flat)
        )


def kv_bytes_per_device(shape: CacheShape, tensor_parallel_size: int) -> int:
    """Bytes of one replica's KV pool on each of its devices: the pool split over the
    replica's tp devices by kv heads when they divide (what `kv_cache.cache_sharding`
    chooses for a replica's parameters), whole otherwise."""
    total = shape.bytes
    split = tensor_parallel_size if shape.kv_heads % tensor_parallel_size == 0 else 1
    return total // split
