"""Weights from the trainer's devices to a disjoint set of rollout devices, as one SPMD
program over the union of both: the transfer multi-controller JAX allows
(`jax.device_put` between meshes over disjoint multi-host device sets is not supported,
and `jax.jit` refuses arguments and results on different device sets).

    union mesh  [role = 2, *trainer mesh shape]: row 0 the trainer's devices, row 1 the
                rollout devices in the same arrangement (`union_mesh`)
    leaf x      (trainer sharding `spec`)  ─► [2, *x.shape] on the union, P("role", *spec):
                row 0 = x's shards (views), row 1 = a placeholder on the rollout devices
    one program x2 -> broadcast(x2[0]) (same sharding): row 0 is copied onto row 1, device
                to matching device (a collective over `role`); every byte crosses once
    row 1       read back as x on the rollout devices laid out like the trainer (`mirror`)

Every process calls `UnionTransfer.__call__` with the same arguments; each supplies the
shards of its own devices of both rows, so every process must own as many devices of
each role (`rljax.rl.async_config.split_devices` with `async.rollout_devices: 0` gives
each process half and half).
The result then goes into the replicas' layout with `rljax.rollout.handoff` (a reshard
within the rollout devices). On one process the same program runs; there a plain
`jax.device_put` would also do.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from rljax.parallel import ShardingError


def union_mesh(trainer_mesh: Mesh, rollout_devices: Sequence) -> Mesh:
    """`[role = 2, *trainer_mesh.shape]`: row 0 `trainer_mesh`, row 1 `rollout_devices`
    (as many, disjoint) in the same arrangement, each trainer device paired with a rollout
    device of its own process (that process's rollout devices by id, in the order its
    trainer devices appear in the trainer mesh), so each process supplies both blocks of
    every pair it holds."""
    grid = trainer_mesh.devices
    rollout = list(rollout_devices)
    if len(rollout) != grid.size:
        raise ShardingError(f"the union transfer needs as many rollout devices as trainer devices "
                            f"({len(rollout)} vs {grid.size}; async.rollout_devices: 0 gives each process half)")
    if {d.id for d in rollout} & {d.id for d in grid.flat}:
        raise ShardingError("the rollout and trainer devices overlap")
    free: dict[int, list] = {}
    for d in sorted(rollout, key=lambda d: (d.process_index, d.id)):
        free.setdefault(d.process_index, []).append(d)
    paired = []
    for d in grid.flat:
        if not free.get(d.process_index):
            raise ShardingError(f"process {d.process_index} has more trainer devices than rollout devices; the "
                                "union transfer needs as many of each on every process (async.rollout_devices: 0)")
        paired.append(free[d.process_index].pop(0))
    rows = np.empty((2, *grid.shape), dtype=object)
    rows[0] = grid
    rows[1] = np.asarray(paired, dtype=object).reshape(grid.shape)
    return Mesh(rows, ("role", *trainer_mesh.axis_names), axis_types=(AxisType.Auto,) * (1 + grid.ndim))


def _copy_row0(xs):
    """Each `[2, ...]` array with row 0 in both rows."""
    return [jnp.broadcast_to(x[:1], x.shape) for x in xs]


class UnionTransfer:
    """Moves arrays laid out on `trainer_mesh` onto `rollout_devices` (module docstring);
    `mirror` is the mesh of the rollout devices shaped like the trainer's."""

    def __init__(self, trainer_mesh: Mesh, rollout_devices: Sequence):
        self.trainer_mesh = trainer_mesh
        self.union = union_mesh(trainer_mesh, rollout_devices)
        self.mirror = Mesh(self.union.devices[1], trainer_mesh.axis_names,
                           axis_types=(AxisType.Auto,) * trainer_mesh.devices.ndim)
        # rollout device -> the trainer device whose block it receives
        self._source = dict(zip(self.union.devices[1].flat, self.union.devices[0].flat))
        self._programs: dict = {}  # output shardings -> the jitted copy
        self._placeholders: dict = {}  # (device, shape, dtype) -> a zero block kept on that device

    def __call__(self, tree):
        """`tree` (leaves: arrays sharded over `trainer_mesh`) with the same values on the
        rollout devices, each leaf laid out on `mirror` as it was on `trainer_mesh`."""
        leaves, treedef = jax.tree.flatten(tree)
        with jax.set_mesh(None):  # the caller's mesh (the trainer's) is not the devices these programs run on
            stacked = [self._stack(x) for x in leaves]
            shardings = tuple(x.sharding for x in stacked)
            program = self._programs.get(shardings)
            if program is None:
                program = self._programs[shardings] = jax.jit(_copy_row0, out_shardings=list(shardings))
            copied = program(stacked)
            return jax.tree.unflatten(treedef, [self._row1(y, x) for y, x in zip(copied, leaves)])

    def _stack(self, x: jax.Array) -> jax.Array:
        spec = x.sharding.spec
        by_device = {s.device: s.data for s in x.addressable_shards}
        arrays = []
        for d in self.union.devices.flat:
            if d.process_index != jax.process_index():
                continue
            if d in by_device:  # row 0: the trainer's shard
                arrays.append(by_device[d][None])
            else:  # row 1: a placeholder block shaped like the matching trainer device's
                block = by_device[self._source[d]]
                key = (d, block.shape, block.dtype)
                if key not in self._placeholders:
                    self._placeholders[key] = jax.device_put(np.zeros((1, *block.shape), block.dtype), d)
                arrays.append(self._placeholders[key])
        sharding = NamedSharding(self.union, P("role", *spec))
        return jax.make_array_from_single_device_arrays((2, *x.shape), sharding, arrays)

    def _row1(self, y: jax.Array, x: jax.Array) -> jax.Array:
        rollout = set(self.union.devices[1].flat)
        arrays = [s.data[0] for s in y.addressable_shards if s.device in rollout]
        return jax.make_array_from_single_device_arrays(x.shape, NamedSharding(self.mirror, x.sharding.spec), arrays)
