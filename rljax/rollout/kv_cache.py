"""The paged KV cache's device side: the pool size and the pool.

One pool holds keys and values together, `[layers, num_pages, page_size, 2 * kv_heads,
head_dim]`, keys and values interleaved per kv head (index `2h` is head h's key, `2h + 1`
its value). A sequence's cache is the list of pages in its page table (the host-side
allocator and tables are in `rljax.rollout.pages`); page 0 is the null page that padding
points at.

Why this layout: it is what the TPU ragged paged-attention kernel
(`jax.experimental.pallas.ops.tpu.ragged_paged_attention`) reads, `[pages, page_size,
2 * kv_heads, head_dim]`, and `[L, P, S, 2K, D]` is that with `L*P` pages by a free
reshape (layer l's page p is page `l*P + p`). So decode, prefill and mixed steps read the
pool in place, with no per-step transpose or copy: one DMA brings a page's keys and values
for every head. Each step's keys and values go in with one scatter whose window, a token's
`[2K, D]`, is contiguous. Tensor parallelism splits the `2K` axis (whole key / value pairs:
the split divides kv heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from rljax.models.config import ModelConfig
from rljax.rollout.attention import cache_head_dim, resolve_paged_attention
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
        return (self.num_layers, self.num_pages, self.page_size, 2 * self.kv_heads, self.head_dim)  # [L, P, S, 2K, D]

    @property
    def bytes(self) -> int:
        """The whole pool's bytes."""
        return self.num_pages * self.bytes_per_page

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
    sequences (plus the null page). Its head_dim is the attention's (`cache_head_dim`)."""
    kv = config.kv_cache
    dtype = jnp.dtype(kv.dtype) if kv.dtype else jnp.dtype(dtype)
    base = CacheShape(
        num_layers=model_config.num_hidden_layers,
        num_pages=2,
        page_size=kv.page_size,
        kv_heads=model_config.num_key_value_heads,
        head_dim=cache_head_dim(resolve_paged_attention(config.attention), model_config.head_dim),
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
    """Where the pool lives: with single-device parameters, on that device; with
    parameters on a mesh, over the same mesh, kv heads (the `2K` axis, in whole key /
    value pairs) split over its "tensor" axis when that axis exists and divides them,
    replicated otherwise."""
    from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

    leaves = jax.tree.leaves(params_state)
    sharding = getattr(leaves[0], "sharding", None) if leaves else None
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        tensor = mesh.shape.get("tensor", 1)
        if tensor > 1 and kv_heads % tensor == 0:
            return NamedSharding(mesh, PartitionSpec(None, None, None, "tensor", None))
        return NamedSharding(mesh, PartitionSpec())
    if sharding is not None and len(sharding.device_set) == 1:
        return SingleDeviceSharding(next(iter(sharding.device_set)))
    return SingleDeviceSharding(jax.devices()[0])


def allocate_pool(shape: CacheShape, sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """A zeroed pool `[layers, num_pages, page_size, 2 * kv_heads, head_dim]`, created in
    place with `sharding` (no host copy)."""
    return jax.jit(lambda: jnp.zeros(shape.pool_shape, shape.dtype), out_shardings=sharding)()


class KVPool:
    """One replica's pool, with the shape and placement it was made with. The compiled
    steps take the pool donated and return the updated one, which the caller stores back
    in `kv`; `reset` makes a fresh zeroed pool (after a failed step that may have
    consumed the donated one)."""

    def __init__(self, shape: CacheShape, sharding: jax.sharding.Sharding):
        self.shape = shape
        self.sharding = sharding
        self.kv = allocate_pool(shape, sharding)  # [L, P, S, 2K, D]

    def reset(self) -> None:
        self.kv = allocate_pool(self.shape, self.sharding)
