"""Weight hand-off: the trainer's parameters, in device memory, into each rollout replica.

Two moves, neither through the host:
1. One reshard of the whole state, from the training layout (any NamedSharding on the
   training mesh) to the rollout layout over `layout.mesh` (replicated over replicas,
   heads / MLP / vocab over "tensor"): a single `jax.device_put` of the tree, which every
   process makes with the same arguments (it is one SPMD program when the two meshes
   span several processes). A leaf whose training sharding already puts the same blocks
   on the same devices is not moved at all (zero copy).
2. Per replica, its arrays are assembled from that result's shards on its devices
   (`make_array_from_single_device_arrays`): views, no copy, local to each process.

With several processes the reshard of step 1 must stay within one device set (JAX
reshards across hosts within one device set, not between disjoint ones): either the
rollout devices are the training mesh's devices, or a `transfer` first carries the moving
leaves onto the rollout devices (`rljax.rollout.cross_transfer.UnionTransfer`: one program
over the union of both sets, laid out like the trainer), and step 1 reshards from there.
On one process any devices will do (e.g. rollout replicas on devices the trainer does not
use) without a transfer.

With a `HandOffCache` a leaf whose source is the very array handed off last time (LoRA's
frozen base: only the adapters change between updates) is not moved again: each replica
keeps its previous copy. Which leaves are reused follows from the program's own objects,
the same on every process (the trainer holds the same base arrays on each), so the
reshard of step 1 stays one program with the same arguments everywhere.

`timed_hand_off` also reports the seconds it took and the bytes it allocated on each
device (measured from the arrays' shards: buffers of the result that are not buffers of
the input), the `timing_s/update_weights` of a training step and its transient memory.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from rljax.parallel import state_shardings
from rljax.rollout.replicas import ReplicaLayout


def rollout_shardings(params: nnx.State, layout: ReplicaLayout) -> list[NamedSharding]:
    """The rollout layout of each leaf of `params` (in `jax.tree.leaves` order), on
    `layout.mesh`, from the parameters' logical axes."""
    return jax.tree.leaves(state_shardings(params, layout.mesh), is_leaf=lambda x: isinstance(x, NamedSharding))


def _to_rollout_layout(leaves: list[jax.Array], targets: list[NamedSharding]) -> list[jax.Array]:
    """Each leaf in its target layout: moved by one batched `device_put`, or kept as it
    is when its sharding is equivalent (same blocks on the same devices)."""
    moving = [i for i, (x, t) in enumerate(zip(leaves, targets)) if not x.sharding.is_equivalent_to(t, x.ndim)]
    moved = jax.device_put([leaves[i] for i in moving], [targets[i] for i in moving])
    out = list(leaves)
    for i, x in zip(moving, moved):
        out[i] = x
    return out


def _replica_view(x: jax.Array, spec, mesh) -> jax.Array:
    """The array `x` (laid out on the global rollout mesh) as an array on one replica's
    mesh, built from x's shards on that replica's devices (no copy)."""
    devices = set(mesh.devices.flat)
    shards = [s.data for s in x.addressable_shards if s.device in devices]
    return jax.make_array_from_single_device_arrays(x.shape, NamedSharding(mesh, spec), shards)


@dataclass
class HandOffCache:
    """The last hand-off's source leaves and, per replica, its result leaves."""

    sources: list = field(default_factory=list)
    outputs: dict[int, list] = field(default_factory=dict)

    def reusable(self, leaves: list, replicas: tuple[int, ...]) -> list[bool]:
        """Per leaf: the same array as last time's source, and every replica still holds
        its copy (a replica's copy can be a view of the source's buffers, deleted when a
        train step donates that source)."""
        if len(leaves) != len(self.sources) or any(r not in self.outputs for r in replicas):
            return [False] * len(leaves)
        return [x is y and not any(self.outputs[r][i].is_deleted() for r in replicas)
                for i, (x, y) in enumerate(zip(leaves, self.sources))]


@functools.lru_cache(maxsize=None)
def _caster(dtype) -> Callable[[list], list]:
    """One jitted cast per dtype (an elementwise program keeps each input's sharding)."""
    return jax.jit(lambda xs: [x.astype(dtype) for x in xs])


def cast_floats(leaves: list[jax.Array], dtype) -> list[jax.Array]:
    """Each floating-point leaf of another dtype cast to `dtype` where it lies (same
    sharding; one program), the others as they are; None: all as they are."""
    if dtype is None:
        return list(leaves)
    dtype = jnp.dtype(dtype)
    cast = [i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype]
    if not cast:
        return list(leaves)
    out = list(leaves)
    for i, x in zip(cast, _caster(dtype)([leaves[i] for i in cast])):
        out[i] = x
    return out


def cast_shapes(tree, dtype):
    """Abstract `tree` (ShapeDtypeStructs or arrays) as `cast_floats` leaves it: every
    floating-point leaf in `dtype`, with its sharding."""
    dtype = jnp.dtype(dtype)

    def cast(x):
        floating = jnp.issubdtype(x.dtype, jnp.floating)
        return jax.ShapeDtypeStruct(x.shape, dtype if floating else x.dtype, sharding=getattr(x, "sharding", None))

    return jax.tree.map(cast, tree)


def hand_off(params: nnx.State, layout: ReplicaLayout, replicas: Sequence[int] | None = None,
             cache: HandOffCache | None = None, transfer: Callable[[list], list] | None = None,
             dtype=None) -> list[nnx.State]:
    """`params` (an nnx.State of the policy, in the training layout) laid out for each of
    `replicas` (default: this process's `layout.local_replicas()`), in that order. With
    `cache`, leaves unchanged since its last hand-off are not moved (and it is updated).
    With `transfer` (a list of leaves -> the same values on `layout.mesh`'s devices), the
    leaves that move are carried by it before the reshard. `dtype` (e.g. bfloat16, the
    rollout's compute dtype): floating-point leaves are cast to it first, where they lie,
    so that the transfer and the reshard move, and the replicas hold, that many bytes.

    Every process must call it with the same `params` and `layout` (step 1 of the module
    docstring is one program over all of them). Values are the source's (cast to `dtype`),
    bit for bit."""
    replicas = layout.local_replicas() if replicas is None else tuple(replicas)
    leaves, treedef = jax.tree.flatten(params)
    targets = rollout_shardings(params, layout)
    reuse = cache.reusable(leaves, replicas) if cache is not None else [False] * len(leaves)
    moving = [i for i, kept in enumerate(reuse) if not kept]
    sources = cast_floats([leaves[i] for i in moving], dtype)
    with jax.set_mesh(None):  # its programs run on the rollout devices, not on the caller's (training) mesh
        if transfer is not None and sources:
            sources = transfer(sources)
        placed = dict(zip(moving, _to_rollout_layout(sources, [targets[i] for i in moving])))
    outputs = {r: [cache.outputs[r][i] if reuse[i] else _replica_view(placed[i], targets[i].spec, layout.replicas[r])
                   for i in range(len(leaves))] for r in replicas}
    if cache is not None:
        cache.sources, cache.outputs = list(leaves), outputs
    return [jax.tree.unflatten(treedef, outputs[r]) for r in replicas]


@dataclass(frozen=True)
class HandOffReport:
    """What one hand-off cost.

    seconds: wall time until every replica's arrays were ready.
    allocated_bytes: per addressable device id, bytes of buffers the hand-off created
        (held until the previous rollout weights are dropped; 0 where it aliased).
    """

    seconds: float
    allocated_bytes: dict[int, int]

    def metrics(self) -> dict[str, float]:
        peak = max(self.allocated_bytes.values(), default=0)
        return {"timing_s/update_weights": self.seconds, "memory/update_weights_GiB": peak / 2**30}


def _buffers(tree) -> dict[tuple[int, int], int]:
    """(device id, buffer address) -> bytes, over every addressable shard of `tree`'s live
    arrays (a donated array holds no buffer)."""
    out = {}
    for leaf in jax.tree.leaves(tree):
        if leaf.is_deleted():
            continue
        for shard in leaf.addressable_shards:
            out[(shard.device.id, shard.data.unsafe_buffer_pointer())] = shard.data.nbytes
    return out


def timed_hand_off(
    params: nnx.State, layout: ReplicaLayout, replicas: Sequence[int] | None = None,
    cache: HandOffCache | None = None, transfer: Callable[[list], list] | None = None, dtype=None,
) -> tuple[list[nnx.State], HandOffReport]:
    """`hand_off`, timed to completion, with the bytes it allocated on each device (the
    replicas' arrays; a `transfer`'s intermediate copy, freed once resharded, is not
    counted)."""
    held = _buffers([x for leaves in cache.outputs.values() for x in leaves]) if cache is not None else {}
    start = time.perf_counter()
    out = jax.block_until_ready(hand_off(params, layout, replicas, cache, transfer, dtype))
    seconds = time.perf_counter() - start
    before = {**_buffers(params), **held}
    allocated: dict[int, int] = {}
    for (device, address), nbytes in _buffers(out).items():  # views share buffers: counted once
        allocated.setdefault(device, 0)
        if (device, address) not in before:
            allocated[device] += nbytes
    return out, HandOffReport(seconds, allocated)
