"""Meshes and shardings: one mesh with axes (data, fsdp, tensor), one rules table.

Conventions
- Mesh axes, outermost first: `data` (pure data parallel: params replicated across it),
  `fsdp` (data parallel whose params, gradients and optimizer state are split across it,
  ZeRO-3 style), `tensor` (heads / MLP columns / vocab split across it). `MeshConfig`
  gives their sizes; one may be -1 (filled from the device count).
- Every parameter carries logical axis names (`logical_axes` metadata on its
  `nnx.Param`); `LOGICAL_RULES` maps each logical axis to mesh axes. Parameters,
  optimizer state, gradients, batches and activation constraints all read this one table.
- Batches are split over `("data", "fsdp")` on their leading dimension. Activations keep
  `embed` unsplit (`act_embed`); their batch dimension is split like the batch.
- A layout that does not divide fails here, at start-up, with the tensor, its size and
  the mesh in the message (`ShardingError`).
- Several slices (TPU slices joined by the data-center network, DCN): `mesh.dcn_data` /
  `mesh.dcn_fsdp` of the data / fsdp ways run across slices, every other split inside a
  slice (`jax.experimental.mesh_utils.create_hybrid_device_mesh`). A device's slice is
  its `slice_index`; where the devices name at most one slice (CPU), each process stands
  in for a slice.
- Meshes use `AxisType.Auto` (classic GSPMD propagation). `constrain` is a no-op unless
  a mesh is active (`with jax.set_mesh(mesh):`), so model code can call it everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec as P

from rljax.config import Bounds, FieldError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axis (or tuple of axes, or None = replicated)
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    # parameters
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "layers": None,
    # mixture of experts: whole experts over fsdp (they stay split, see STAY_SPLIT),
    # each expert's MLP width over tensor, its hidden dimension and the router unsplit
    "expert": "fsdp",
    "expert_embed": None,
    "expert_mlp": "tensor",
    "router_experts": None,
    # activations (with `mlp`, `heads`, `kv_heads`, `head_dim`, `vocab` as above)
    "batch": BATCH_AXES,
    "length": None,
    "act_embed": None,
}

# Logical axes whose fsdp split is kept in the forward (not all-gathered by
# `gather_weight`): experts are computed where they live (`rljax.models.moe`).
STAY_SPLIT = frozenset({"expert"})

AnyMesh = Mesh | AbstractMesh


class ShardingError(ValueError):
    """A tensor or batch that does not divide over the mesh."""


MeshSize = Annotated[int, Bounds(ge=-1, le=65536)]  # >= 1, or -1: the devices left over
SliceCount = Annotated[int, Bounds(ge=1, le=4096)]


@dataclass(frozen=True)
class MeshConfig:
    """Mesh shape; one of the three may be -1 (filled from the device count)."""

    data: MeshSize = 1  # pure data-parallel ways (parameters replicated across them)
    fsdp: MeshSize = -1  # data-parallel ways with parameters, gradients and optimizer state split (ZeRO-3)
    tensor: MeshSize = 1  # ways heads, MLP columns and the vocabulary are split
    # of the data ways, how many run across slices (over the data-center network; MaxText's
    # dcn_data_parallelism): the slices = dcn_data x dcn_fsdp
    dcn_data: SliceCount = 1
    dcn_fsdp: SliceCount = 1  # of the fsdp ways, how many run across slices (MaxText's dcn_fsdp_parallelism)

    @property
    def num_slices(self) -> int:
        return self.dcn_data * self.dcn_fsdp

    def check(self) -> None:
        """Run by `rljax.config.check_config`: each size >= 1 or -1, at most one -1; the
        ways across slices divide their axis."""
        for name in ("data", "fsdp", "tensor"):
            if getattr(self, name) == 0:
                raise FieldError(name, "must be >= 1 or -1 (the devices left over), got 0")
        filled = [name for name in ("data", "fsdp", "tensor") if getattr(self, name) == -1]
        if len(filled) > 1:
            raise FieldError(filled[1], f"-1 like {filled[0]}: at most one of data / fsdp / tensor may be -1")
        for axis in ("data", "fsdp"):
            size, dcn = getattr(self, axis), getattr(self, f"dcn_{axis}")
            if size != -1 and size % dcn:
                raise FieldError(f"dcn_{axis}", f"{dcn} slices do not divide mesh.{axis}={size}")

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        dims = [self.data, self.fsdp, self.tensor]
        if dims.count(-1) > 1:
            raise ShardingError(f"mesh {dims}: at most one of data/fsdp/tensor may be -1")
        if any(d == 0 or d < -1 for d in dims):
            raise ShardingError(f"mesh data={dims[0]} fsdp={dims[1]} tensor={dims[2]}: sizes must be >= 1 or -1")
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
        for axis, size, dcn in (("data", dims[0], self.dcn_data), ("fsdp", dims[1], self.dcn_fsdp)):
            if size % dcn:
                raise ShardingError(f"mesh.dcn_{axis}={dcn}: the slices do not divide mesh.{axis}={size}")
        return tuple(dims)

    def slice_shape(self, num_devices: int) -> tuple[int, int, int]:
        """The (data, fsdp, tensor) ways inside one slice."""
        data, fsdp, tensor = self.shape(num_devices)
        return data // self.dcn_data, fsdp // self.dcn_fsdp, tensor


_AUTO = (AxisType.Auto,) * len(MESH_AXES)


def slices_by_process(devices) -> bool:
    """Whether `devices` name at most one slice (CPU devices carry none, or all the same
    index): then each process stands in for a slice."""
    return len({getattr(d, "slice_index", None) for d in devices} - {None}) <= 1


def make_mesh(config: MeshConfig, devices=None) -> Mesh:
    """The concrete mesh over `devices` (default: every device of every process). With
    several slices (`config.num_slices`), a hybrid mesh: each slice holds a contiguous
    block of the data and fsdp ways, and only `dcn_data` x `dcn_fsdp` of them cross slices."""
    devices = list(devices if devices is not None else jax.devices())
    shape = config.shape(len(devices))
    if config.num_slices == 1:
        spanned = {d.slice_index for d in devices if getattr(d, "slice_index", None) is not None}
        if len(spanned) > 1:
            raise ShardingError(f"the {len(devices)} devices are on {len(spanned)} slices: set mesh.dcn_data x "
                                f"mesh.dcn_fsdp = {len(spanned)} (the data / fsdp ways that cross slices)")
        return jax.make_mesh(shape, MESH_AXES, axis_types=_AUTO, devices=devices)
    from jax.experimental import mesh_utils

    by_process = slices_by_process(devices)
    slices = {d.process_index if by_process else d.slice_index for d in devices}
    if len(slices) != config.num_slices:
        raise ShardingError(f"mesh.dcn_data={config.dcn_data} x mesh.dcn_fsdp={config.dcn_fsdp} = "
                            f"{config.num_slices} slices, but the {len(devices)} devices are on {len(slices)}"
                            + (" (processes stand in for slices here)" if by_process else ""))
    grid = mesh_utils.create_hybrid_device_mesh(
        config.slice_shape(len(devices)), (config.dcn_data, config.dcn_fsdp, 1), devices,
        process_is_granule=by_process, allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=_AUTO)


def abstract_mesh(config: MeshConfig, num_devices: int) -> AbstractMesh:
    """The mesh's shape without devices: for planning a run larger than this machine."""
    return AbstractMesh(config.shape(num_devices), MESH_AXES, axis_types=_AUTO)


def mesh_desc(mesh: AnyMesh) -> str:
    return "mesh(" + ", ".join(f"{k}={v}" for k, v in mesh.shape.items()) + ")"


def _mesh_group(axis: str | None, mesh: AnyMesh) -> tuple[str, ...]:
    """The mesh axes (of size > 1) a logical axis is split over."""
    mesh_axes = LOGICAL_RULES.get(axis) if axis else None
    if mesh_axes is None:
        return ()
    group = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
    return tuple(a for a in group if mesh.shape.get(a, 1) > 1)


def logical_to_spec(logical_axes, shape, mesh: AnyMesh, name: str = "tensor", strict: bool = True) -> P:
    """PartitionSpec for a tensor with the given logical axes, checked for divisibility.

    `strict=False` (activations) replicates a dimension that does not divide instead of
    raising."""
    if len(logical_axes) != len(shape):
        raise ShardingError(f"{name}: {len(logical_axes)} logical axes {tuple(logical_axes)} for shape {tuple(shape)}")
    spec = []
    for axis, size in zip(logical_axes, shape):
        group = _mesh_group(axis, mesh)
        if not group:
            spec.append(None)
            continue
        ways = math.prod(mesh.shape[a] for a in group)
        if size % ways:
            if not strict:
                spec.append(None)
                continue
            raise ShardingError(
                f"{name}: dimension {axis!r} of size {size} is not divisible by {ways} "
                f"(mesh axes {group}) on {mesh_desc(mesh)}"
            )
        spec.append(group[0] if len(group) == 1 else group)
    return P(*spec)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def state_shardings(state, mesh: AnyMesh):
    """A tree like `state` (an nnx.State of Variables) whose leaves are NamedShardings.
    Works on concrete and abstract (`nnx.eval_shape`) state alike."""

    def one(path, var):
        axes = var.get_metadata().get("logical_axes")
        shape = var.get_value().shape
        if axes is None:
            axes = (None,) * len(shape)
        return var.replace(NamedSharding(mesh, logical_to_spec(axes, shape, mesh, _path_name(path))))

    return jax.tree_util.tree_map_with_path(one, state, is_leaf=_is_variable)


def replicated(mesh: AnyMesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: AnyMesh) -> NamedSharding:
    """Leading (batch) dimension over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES))


def data_parallel_size(mesh: AnyMesh) -> int:
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_batch(batch_size: int, mesh: AnyMesh, name: str = "batch") -> None:
    ways = data_parallel_size(mesh)
    if batch_size % ways:
        raise ShardingError(
            f"{name} of size {batch_size} is not divisible by the data-parallel size {ways} "
            f"(data x fsdp) of {mesh_desc(mesh)}"
        )


def agree_lengths(batch: dict, allgather=None) -> dict:
    """Pad every process's `[rows, T, ...]` arrays to the longest T any process has.

    Each process buckets its own rows, so with ragged data processes can pick different
    lengths, while a global array needs one shape. One small allgather of the lengths per
    batch (host side, not in a jitted step); a no-op with one process. Padding is 0 in
    every array (masks, segment ids, positions: "padding"; token ids there are masked out).
    `allgather` (local int32 vector -> `[processes, n]`) is for tests."""
    if allgather is None:
        if jax.process_count() == 1:
            return batch
        from jax.experimental import multihost_utils

        allgather = multihost_utils.process_allgather
    keys = [k for k, v in batch.items() if np.ndim(v) >= 2]
    local = np.asarray([np.shape(batch[k])[1] for k in keys], np.int32)
    longest = np.max(np.asarray(allgather(local)).reshape(-1, len(keys)), axis=0) if keys else []
    out = dict(batch)
    for key, length in zip(keys, longest):
        value = np.asarray(batch[key])
        extra = int(length) - value.shape[1]
        if extra:
            out[key] = np.pad(value, [(0, 0), (0, extra)] + [(0, 0)] * (value.ndim - 2))
    return out


def shard_local_batch(batch: dict, mesh: Mesh) -> dict:
    """Assemble a global batch from each process's rows (dict of numpy arrays), split
    over data x fsdp. With one process the local rows are the whole batch; with several,
    their sequence lengths are first made to agree (`agree_lengths`)."""
    sharding = batch_sharding(mesh)
    batch = agree_lengths(batch)
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        global_shape = (value.shape[0] * jax.process_count(), *value.shape[1:])
        check_batch(global_shape[0], mesh, name=f"batch[{key!r}]")
        out[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return out


# ---- activations -----------------------------------------------------------------------


def _active_mesh():
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(MESH_AXES) <= set(mesh.axis_names):
        return None
    return mesh


def active_mesh():
    """The (data, fsdp, tensor) mesh set with `jax.set_mesh`, or None."""
    return _active_mesh()


def activation_block(shape: Sequence[int], logical_axes: Sequence[str | None]) -> tuple[int, ...]:
    """A device's block of an activation of `shape` laid out by logical axis names under
    the active mesh (as `constrain` lays it out); `shape` itself without one."""
    mesh = _active_mesh()
    if mesh is None:
        return tuple(shape)
    return shard_shape(shape, logical_to_spec(tuple(logical_axes), tuple(shape), mesh, "activation", strict=False),
                       mesh)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Pin an activation's layout by logical axis names, e.g.
    `constrain(h, ("batch", "length", "act_embed"))`.

    A no-op when no mesh is active (`jax.set_mesh`) or the active mesh is not a
    (data, fsdp, tensor) mesh, so model code may call it unconditionally. Dimensions that
    do not divide stay replicated."""
    mesh = _active_mesh()
    if mesh is None:
        return x
    spec = logical_to_spec(tuple(logical_axes), x.shape, mesh, "activation", strict=False)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def gather_weight(w: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """A parameter (or one layer's slice of it) as the forward pass uses it under FSDP:
    its layout by the rules with the `fsdp` axis dropped, so XLA all-gathers the weight
    (ZeRO-3) right before use instead of moving activations. Tensor-parallel splits stay,
    and so does the fsdp split of `STAY_SPLIT` axes (experts).
    A no-op without an active mesh, like `constrain`."""
    mesh = _active_mesh()
    if mesh is None:
        return w
    spec = logical_to_spec(tuple(logical_axes), w.shape, mesh, "weight", strict=False)
    kept = []
    for entry, logical in zip(spec, logical_axes):
        axes = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
        axes = tuple(a for a in axes if a != "fsdp" or logical in STAY_SPLIT)
        kept.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return jax.lax.with_sharding_constraint(w, NamedSharding(mesh, P(*kept)))


# ---- sharded creation ------------------------------------------------------------------


def sharded_init(create: Callable[[], nnx.Module], mesh: AnyMesh) -> nnx.Module:
    """Build `create()` directly in its sharded layout: shapes come from `nnx.eval_shape`
    (no memory), then one jitted call materialises every parameter with its
    `out_shardings`, so no device ever holds more than its shards. Random values do not
    depend on the mesh (JAX's random bits are defined independently of sharding)."""
    abstract = nnx.eval_shape(create)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = state_shardings(abstract_state, mesh)
    state = jax.jit(lambda: nnx.split(create())[1], out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def optimizer_shardings(optimizer: optax.GradientTransformation, param_shardings, mesh: AnyMesh):
    """Shardings for `optimizer.init(params)`: every parameter-shaped part (AdamW's mu
    and nu) takes its parameter's sharding, the rest (step counts) is replicated.

    Pass these as `out_shardings` when initialising the optimizer: inside `jit` the
    zeros optax creates do not inherit the parameters' sharding on their own (XLA
    replicates them)."""
    placeholders = jax.tree.map(lambda s: jax.ShapeDtypeStruct((), np.float32), param_shardings)
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        jax.eval_shape(optimizer.init, placeholders),
        param_shardings,
        transform_non_params=lambda _: replicated(mesh),
    )


# ---- memory accounting -----------------------------------------------------------------


def shard_shape(shape: Sequence[int], spec: P, mesh: AnyMesh) -> tuple[int, ...]:
    """The per-device block of a tensor of `shape` laid out by `spec` (ceil division)."""
    out = []
    for i, size in enumerate(shape):
        entry = spec[i] if i < len(spec) else None
        axes = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
        ways = math.prod(mesh.shape[a] for a in axes)
        out.append(-(-size // ways))
    return tuple(out)


def planned_bytes(shapes, shardings) -> int:
    """Bytes one device holds of a tree of shapes (anything with .shape and .dtype)
    laid out by a matching tree of NamedShardings."""
    leaves = jax.tree.leaves(shapes)
    layouts = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
    if len(leaves) != len(layouts):
        raise ValueError(f"{len(leaves)} shapes but {len(layouts)} shardings")
    total = 0
    for s, sh in zip(leaves, layouts):
        total += math.prod(shard_shape(s.shape, sh.spec, sh.mesh)) * np.dtype(s.dtype).itemsize
    return total


def measured_bytes(tree) -> dict[Any, int]:
    """Bytes each addressable device actually holds of a tree of jax.Arrays (read from
    the arrays' `addressable_shards`)."""
    out: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            for shard in leaf.addressable_shards:
                out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
    return out
