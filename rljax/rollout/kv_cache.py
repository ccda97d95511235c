"""The paged KV cache: device page pools and the host-side page allocator.

Device side: one pool for keys and one for values, each `[layers, num_pages, page_size,
kv_heads, head_dim]`. A sequence's cache is the list of pages in its page table; token
at position t lives in page `table[t // page_size]`, slot `t % page_size`.

Host side (numpy / python, never traced): `PageAllocator` hands out pages from a free
list and counts references, so the n samples of one prompt can share the prompt's full
pages; a page returns to the free list when its last reference is released. Page 0 is
a reserved null page: it is never handed out; padded page-table entries and padded
batch rows point at it, and every read of it is masked out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from rljax.models.config import ModelConfig
from rljax.rollout.config import SamplerConfig

NULL_PAGE = 0


class OutOfPagesError(RuntimeError):
    """The allocator has fewer free pages than asked for."""


class PageAllocator:
    """Free list plus reference counts over pages 1 .. num_pages-1 (page 0 is reserved).

    `allocate` returns fresh pages with one reference each; `retain` adds a reference
    (sharing); `release` drops one and frees the page at zero. Releasing a free page or
    retaining a free page is a bug and raises."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (page 0 is reserved), got {num_pages}")
        self.num_pages = num_pages
        self.refcount = np.zeros(num_pages, np.int32)
        # Pop from the end: low page ids are handed out first.
        self._free = list(range(num_pages - 1, NULL_PAGE, -1))
        self.peak_used = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - 1 - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPagesError(f"asked for {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        self.refcount[pages] = 1
        self.peak_used = max(self.peak_used, self.num_used)
        return pages

    def retain(self, pages: list[int]) -> None:
        for p in pages:
            if p == NULL_PAGE or self.refcount[p] <= 0:
                raise RuntimeError(f"retain of page {p}, which is not allocated")
            self.refcount[p] += 1

    def release(self, pages: list[int]) -> None:
        for p in pages:
            if p == NULL_PAGE or self.refcount[p] <= 0:
                raise RuntimeError(f"release of page {p}, which is not allocated (double free)")
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self._free.append(p)

    def reset_peak(self) -> None:
        self.peak_used = self.num_used


class PageTable:
    """One sequence's pages, in order. Leading pages may be shared with other
    sequences (read only); the pages it writes are always its own (refcount 1)."""

    def __init__(self, allocator: PageAllocator):
        self.allocator = allocator
        self.pages: list[int] = []

    def __len__(self) -> int:
        return len(self.pages)

    def grow_to(self, num_pages: int) -> None:
        """Own at least `num_pages` pages (raises OutOfPagesError, changing nothing)."""
        extra = num_pages - len(self.pages)
        if extra > 0:
            self.pages.extend(self.allocator.allocate(extra))

    def adopt(self, pages: list[int]) -> None:
        """Start with `pages`, on which the caller already took one reference each."""
        if self.pages:
            raise RuntimeError("adopt on a non-empty page table")
        self.pages = list(pages)

    def share_from(self, other: "PageTable", num_pages: int) -> None:
        """Start as a reader of `other`'s first `num_pages` pages (one reference each)."""
        if self.pages:
            raise RuntimeError("share_from on a non-empty page table")
        shared = other.pages[:num_pages]
        self.allocator.retain(shared)
        self.pages = list(shared)

    def free(self) -> None:
        self.allocator.release(self.pages)
        self.pages = []

    def writable(self, first_page: int) -> bool:
        """True when every page from `first_page` on is owned by this sequence alone."""
        return all(self.allocator.refcount[p] == 1 for p in self.pages[first_page:])


# ---- device pools ---------------------------------------------------------------------


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
        return (self.num_layers, self.num_pages, self.page_size, self.kv_heads, self.head_dim)

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


def plan_cache(model_config: ModelConfig, config: SamplerConfig, dtype) -> CacheShape:
    """Decide the pool size: explicit `num_pages`, else `memory_fraction` of free device
    memory, else room for `max_num_seqs` full-length sequences (plus the null page)."""
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
        free = free_device_memory()
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
            return NamedSharding(mesh, PartitionSpec(None, None, None, "tensor", None))
        return NamedSharding(mesh, PartitionSpec())
    if sharding is not None and len(sharding.device_set) == 1:
        return SingleDeviceSharding(next(iter(sharding.device_set)))
    return SingleDeviceSharding(jax.devices()[0])


def allocate_pools(shape: CacheShape, sharding: jax.sharding.Sharding | None = None) -> tuple[jax.Array, jax.Array]:
    """Zeroed key and value pools `[layers, num_pages, page_size, kv_heads, head_dim]`,
    created in place with `sharding` (no host copy)."""
    make = jax.jit(lambda: jnp.zeros(shape.pool_shape, shape.dtype), out_shardings=sharding)
    return make(), make()


def pages_for(num_tokens: int, page_size: int) -> int:
    return math.ceil(num_tokens / page_size)
