"""The paged KV cache's device side: the pool size and the key / value pools.

One pool for keys and one for values, each `[kv_heads, layers, num_pages, page_size,
head_dim]` (kv-heads-major). A sequence's cache is the list of pages in its page table
(the host-side allocator and tables are in `rljax.rollout.pages`); page 0 is the null
page that padding points at.

Why kv heads first: the TPU paged-attention kernel
(`jax.experimental.pallas.ops.tpu.paged_attention`) reads `[kv_heads, pages, page_size,
head_dim]`, and `[K, L, P, S, D]` is that with `L*P` pages by a free reshape (layer l's
page p is page `l*P + p`), so decode attention reads the pool in place, with no
per-step transpose or copy. A page of one head is a contiguous `[S, D]` tile, which is
what the kernel's DMAs copy. Tensor parallelism splits the first axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from rljax.models.config import ModelConfig
from rljax.rollout.config import SamplerConfig


@dataclass(frozen=True)
class CacheShape:
    num_layers: int
    num_pages: int
    page_size: int
    kv_heads: int
    head_dim: int
    dtype: jnp.dtype

    @property
    def pool_shape(self) -> tuple[int, ...]:
        return (self.kv_heads, self.num_layers, self.num_pages, self.page_size, self.head_dim)  # [K, L, P, S, D]

    @property
    def bytes_per_page(self) -> int:
        return 2 * self.num_layers * self.page_size * self.kv_heads * self.head_dim * jnp.dtype(self.dtype).itemsize

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_page // self.page_size


def free_device_memory(device: jax.Device | None = None) -> int | None:
    """Free bytes on `device` as the backend reports them, or None (e.g. on CPU)."""
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def plan_cache(model_config: ModelConfig, config: SamplerConfig, dtype, device: jax.Device | None = None) -> CacheShape:
    """Decide the pool size: explicit `num_pages`, else `memory_fraction` of `device`'s
    free memory (default: the first device), else room for `max_num_seqs` full-length
    sequences (plus the null page)."""
    kv = config.kv_cache
    dtype = jnp.dtype(kv.dtype) if kv.dtype else jnp.dtype(dtype)
    base = CacheShape(
        num_layers=model_config.num_hidden_layers,
        num_pages=2,
        page_size=kv.page_size,
        kv_heads=model_config.num_key_value_heads,
        head_dim=model_config.head_dim,
        dtype=dtype,
    )
    if kv.num_pages is not None:
        num_pages = kv.num_pages
    else:
        free = free_device_memory(device)
        if free is not None:
            num_pages = int(free * kv.memory_fraction) // base.bytes_per_page
        else:
            num_pages = config.max_num_seqs * config.max_pages_per_seq + 1
    if num_pages - 1 < config.max_pages_per_seq:
        raise ValueError(
            f"the KV cache has {num_pages - 1} usable pages of {kv.page_size} tokens, fewer than one "
            f"sequence of max_model_len={config.max_model_len} needs ({config.max_pages_per_seq}); "
            "raise num_pages / memory_fraction or lower max_model_len"
        )
    return CacheShape(base.num_layers, num_pages, base.page_size, base.kv_heads, base.head_dim, dtype)


def cache_sharding(params_state, kv_heads: int) -> jax.sharding.Sharding:
    """Where the pools live: with single-device parameters, on that device; with
    parameters on a mesh, over the same mesh, kv heads split over its "tensor" axis
    when that axis exists and divides them, replicated otherwise."""
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

    leaves = jax.tree.leaves(params_state)
    sharding = getattr(leaves[0], "sharding", None) if leaves else None
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        tensor = mesh.shape.get("tensor", 1)
        if tensor > 1 and kv_heads % tensor == 0:
            return NamedSharding(mesh, PartitionSpec("tensor", None, None, None, None))
        return NamedSharding(mesh, PartitionSpec())
    if sharding is not None and len(sharding.device_set) == 1:
        return SingleDeviceSharding(next(iter(sharding.device_set)))
    return SingleDeviceSharding(jax.devices()[0])


def allocate_pools(shape: CacheShape, sharding: jax.sharding.Sharding | None = None) -> tuple[jax.Array, jax.Array]:
    """Zeroed key and value pools `[kv_heads, layers, num_pages, page_size, head_dim]`,
    created in place with `sharding` (no host copy)."""
    make = jax.jit(lambda: jnp.zeros(shape.pool_shape, shape.dtype), out_shardings=sharding)
    return make(), make()


class KVPool:
    """One replica's key and value pools, with the shape and placement they were made
    with. The compiled steps take the pools donated and return the updated ones, which
    the caller stores back in `k` / `v`; `reset` makes fresh zeroed pools (after a
    failed step that may have consumed the donated ones)."""

    def __init__(self, shape: CacheShape, sharding: jax.sharding.Sharding):
        self.shape = shape
        self.sharding = sharding
        self.k, self.v = allocate_pools(shape, sharding)  # [K, L, P, S, D] each

    def reset(self) -> None:
        self.k, self.v = allocate_pools(self.shape, self.sharding)
