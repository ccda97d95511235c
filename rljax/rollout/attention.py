"""Attention over a paged KV cache.

Every function here takes
  q            `[B, T, N, D]`   queries of the tokens being computed this step,
  k_cache      `[K, L, P, S, D]` the whole key pool (all layers), v_cache likewise,
  layer        int32 scalar      which layer's pages to read,
  page_table   `[B, W]` int32    each row's pages in order (unused entries: page 0),
  q_positions  `[B, T]` int32    the position of every query token,
  kv_lens      `[B]` int32       tokens in the cache for each row (this step's included),
and returns `[B, T, N, D]`. Query t of row b sees key position s iff s <= q_positions[b, t]
and s < kv_lens[b]. The current step's keys are written to the pool before attention.

`paged_attention_reference` is the oracle: it gathers the pages through the page table
into a dense `[B, W*S, K, D]` view and runs the training forward's own attention
(`rljax.models.attention.xla_attention`) under a position mask, so the sampler's logits
match the trainer's. `paged_decode_attention_pallas` is a Pallas kernel (Triton-style,
for GPUs) for decode steps (T == 1) that walks only the pages a sequence owns, with an
online softmax; on other backends it runs in Pallas interpret mode (for tests).
`paged_decode_attention_tpu` runs JAX's TPU paged-attention kernel on the pool in place
(TPU interpret mode off TPU). `decode_attention(name)` picks one (registry
`DECODE_ATTENTION`; "auto": `choose_decode_attention`).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rljax.models.attention import target_backend, xla_attention

PagedAttentionFn = Callable[..., jax.Array]


def _layer_pages(cache: jax.Array, layer: jax.Array, page_table: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The pool `[K, L, P, S, D]` viewed as `[K, L*P, S, D]` (a free reshape) and page ids
    offset into `layer`'s block (`layer * P + page`), so a layer's pages are read without
    slicing the layer out."""
    kv_heads, num_layers, num_pages = cache.shape[:3]
    flat = cache.reshape(kv_heads, num_layers * num_pages, *cache.shape[3:])
    return flat, page_table + layer.astype(page_table.dtype) * num_pages


def _pad_to_blocks(ids: jax.Array, layer: jax.Array, num_pages: int, block: int) -> jax.Array:
    """Offset page ids `[B, W]` (from `_layer_pages`) as int32, padded with `layer`'s null
    page (`layer * num_pages`) to a multiple of `block` columns, so a kernel's blocks of
    pages divide the table."""
    ids = ids.astype(jnp.int32)
    b, w = ids.shape
    width = -(-w // block) * block
    if width == w:
        return ids
    null = (layer * num_pages).astype(jnp.int32)
    return jnp.concatenate([ids, jnp.full((b, width - w), null, jnp.int32)], axis=1)


def gather_kv(cache: jax.Array, layer: jax.Array, page_table: jax.Array) -> jax.Array:
    """A dense `[B, W*S, K, D]` view of each row's cached keys (or values)."""
    flat, ids = _layer_pages(cache, layer, page_table)
    b, w = page_table.shape
    pages = flat[:, ids]  # [K, B, W, S, D]
    kv_heads, _, _, s, d = pages.shape
    return pages.transpose(1, 2, 3, 0, 4).reshape(b, w * s, kv_heads, d)


def paged_attention_reference(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    layer: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    kv_lens: jax.Array,
) -> jax.Array:
    """Gather the pages, mask by position and length, and attend (plain jnp)."""
    k = gather_kv(k_cache, layer, page_table).astype(q.dtype)
    v = gather_kv(v_cache, layer, page_table).astype(q.dtype)
    key_pos = jnp.arange(k.shape[1], dtype=jnp.int32)
    mask = (key_pos[None, None, :] <= q_positions[:, :, None]) & (key_pos[None, None, :] < kv_lens[:, None, None])
    return xla_attention(q, k, v, mask)


# ---- Pallas decode kernel --------------------------------------------------------------

_MIN_BLOCK = 16  # Triton's dot needs every block dimension >= 16


def _decode_kernel(q_ref, k_ref, v_ref, table_ref, len_ref, o_ref, *, pages_per_block: int, scale: float, dot):
    """One program = one sequence x one kv head: q block `[G, D]` (the query heads that
    share this kv head, padded to 16), pages read `pages_per_block` at a time through
    the page table, online softmax in float32, masked by the sequence length."""
    q = q_ref[...]
    page_size = k_ref.shape[1]
    block_k = pages_per_block * page_size
    length = len_ref[0]
    width = table_ref.shape[0]
    num_blocks = jnp.minimum(pl.cdiv(pl.cdiv(length, page_size), pages_per_block), width // pages_per_block)
    g, d = q.shape

    def body(i, carry):
        acc, m_prev, l_prev = carry
        pages = table_ref[pl.ds(i * pages_per_block, pages_per_block)]
        k = k_ref[pages].reshape(block_k, d)
        v = v_ref[pages].reshape(block_k, d)
        s = dot(q, k.T).astype(jnp.float32) * scale  # [G, block_k]
        key_pos = i * block_k + jnp.arange(block_k)
        s = jnp.where((key_pos < length)[None, :], s, -jnp.inf)
        m_next = jnp.maximum(m_prev, s.max(axis=-1))
        correction = jnp.exp(m_prev - m_next)
        p = jnp.exp(s - m_next[:, None])
        l_next = correction * l_prev + p.sum(axis=-1)
        acc = correction[:, None] * acc + dot(p.astype(v.dtype), v).astype(jnp.float32)
        return acc, m_next, l_next

    init = (
        jnp.zeros((g, d), jnp.float32),
        jnp.full((g,), -jnp.inf, jnp.float32),
        jnp.zeros((g,), jnp.float32),
    )
    acc, _, l_sum = jax.lax.fori_loop(0, num_blocks, body, init)
    l_sum = jnp.where(l_sum == 0.0, 1.0, l_sum)  # an empty row (padding) gives zeros, not NaN
    o_ref[...] = (acc / l_sum[:, None]).astype(o_ref.dtype)


def _pages_per_block(width: int, page_size: int) -> int:
    """Pages per kernel block: about 64 keys, at least 16 (Triton's dot), a power of two."""
    ppb = max(1, 64 // page_size)
    ppb = min(ppb, pl.next_power_of_2(width))
    return max(ppb, pl.next_power_of_2(-(-_MIN_BLOCK // page_size)))


def check_pallas_shapes(head_dim: int, page_size: int) -> None:
    """The Triton-style kernel needs power-of-two blocks of at least 16 lanes."""
    if head_dim < _MIN_BLOCK or head_dim & (head_dim - 1):
        raise ValueError(f"attention='pallas' needs a power-of-two head_dim >= 16, got {head_dim}")
    if page_size & (page_size - 1):
        raise ValueError(f"attention='pallas' needs a power-of-two page_size, got {page_size}")


@functools.partial(jax.jit, static_argnames=("interpret",))
def paged_decode_attention_pallas(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    layer: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    kv_lens: jax.Array,
    *,
    interpret: bool = False,
) -> jax.Array:
    """Decode attention (T == 1) as a Pallas kernel reading the pool in place.

    The grid is (batch, kv_heads); each program reads only the `ceil(kv_len / S)` pages
    of its sequence. Grouped-query heads that share a kv head are one `[G, D]` block.
    `q_positions` is unused: for a decode token the causal bound equals `kv_len`."""
    del q_positions
    from jax.experimental.pallas import triton as plgpu

    b, t, n, d = q.shape
    if t != 1:
        raise ValueError(f"the Pallas kernel handles decode steps (T == 1), got T={t}")
    flat_k, ids = _layer_pages(k_cache, layer, page_table)
    flat_v, _ = _layer_pages(v_cache, layer, page_table)
    kv_heads, total_pages, page_size, _ = flat_k.shape
    groups = n // kv_heads
    g_pad = max(_MIN_BLOCK, pl.next_power_of_2(groups))
    qh = q.reshape(b, kv_heads, groups, d)
    if g_pad != groups:
        qh = jnp.pad(qh, ((0, 0), (0, 0), (0, g_pad - groups), (0, 0)))
    pages_per_block = _pages_per_block(page_table.shape[1], page_size)
    ids = _pad_to_blocks(ids, layer, k_cache.shape[2], pages_per_block)
    width = ids.shape[1]
    kernel = functools.partial(_decode_kernel, pages_per_block=pages_per_block, scale=d**-0.5, dot=plgpu.dot)
    out = pl.pallas_call(
        kernel,
        grid=(b, kv_heads),
        in_specs=[
            pl.BlockSpec((None, None, g_pad, d), lambda i, h: (i, h, 0, 0)),
            pl.BlockSpec((None, total_pages, page_size, d), lambda i, h: (h, 0, 0, 0)),
            pl.BlockSpec((None, total_pages, page_size, d), lambda i, h: (h, 0, 0, 0)),
            pl.BlockSpec((None, width), lambda i, h: (i, 0)),
            pl.BlockSpec((None, 1), lambda i, h: (i, 0)),
        ],
        out_specs=pl.BlockSpec((None, None, g_pad, d), lambda i, h: (i, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((b, kv_heads, g_pad, d), q.dtype),
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        name="rljax_paged_decode_attention",
    )(qh, flat_k, flat_v, ids, kv_lens.astype(jnp.int32)[:, None])
    return out[:, :, :groups, :].reshape(b, 1, n, d)


# ---- the TPU paged-attention kernel ----------------------------------------------------

TPU_LANES = 128  # a TPU vector register's lane count: the kernel's last (head_dim) axis tiles by it
TPU_BLOCK_KEYS = 256  # keys per kernel block (pages_per_compute_block x page_size), about


def tpu_pages_per_block(width: int, page_size: int) -> int:
    """`pages_per_compute_block` for the TPU kernel: about `TPU_BLOCK_KEYS` keys per
    block, a power of two, no more than the (power-of-two-padded) page-table width."""
    return max(1, min(pl.next_power_of_2(max(1, TPU_BLOCK_KEYS // page_size)), pl.next_power_of_2(width)))


def check_tpu_shapes(head_dim: int) -> None:
    """On a TPU the kernel's `[page_size, head_dim]` tiles put head_dim on the 128 lanes."""
    if head_dim % TPU_LANES:
        raise ValueError(f"attention='pallas_tpu' needs head_dim a multiple of {TPU_LANES} on a TPU, got {head_dim} "
                         "(use attention=auto or reference)")


def paged_decode_attention_tpu(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    layer: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    kv_lens: jax.Array,
    *,
    interpret: bool = False,
    mesh=None,
    cores: int = 1,
) -> jax.Array:
    """Decode attention (T == 1) with JAX's TPU paged-attention kernel
    (`jax.experimental.pallas.ops.tpu.paged_attention`, a flash-decoding kernel that DMAs
    `pages_per_compute_block` pages of one kv head at a time from HBM, double-buffered,
    and skips blocks past each row's length). It takes `[K, pages, S, D]` pools: ours,
    `[K, L, P, S, D]`, reshaped (free) to `[K, L*P, S, D]` with the layer's page ids
    offset by `layer * P`, so the pool is read in place. The kernel does not scale
    scores: q is multiplied by 1/sqrt(D) first. Grouped-query heads are native (the
    kernel groups N // K query heads per kv head). The page table is padded with the
    layer's null page to a multiple of the block. The kernel reads K / V through bfloat16
    (it casts the loaded pages), exact for the bfloat16 pools a run uses.

    `mesh`: where the pools live. On a mesh of several devices the kernel runs per shard
    in `shard_map` (GSPMD cannot partition a Mosaic call): kv heads (and their query
    heads) split over "tensor" when the pools are (`cache_sharding`), whole on every
    device otherwise. `cores`: TensorCores per device (2 on megacore chips, v4 / v5p):
    with 2 the kernel's grid splits kv heads (or rows, when the shard has one kv head)
    over both cores (`megacore_mode`), which the kernel says to set only on such chips.
    `interpret`: TPU interpret mode (CPU tests), simulating `cores` cores."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    del q_positions  # a decode token's causal bound is kv_len
    b, t, n, d = q.shape
    if t != 1:
        raise ValueError(f"the TPU paged kernel handles decode steps (T == 1), got T={t}")
    flat_k, ids = _layer_pages(k_cache, layer, page_table)  # [K, L*P, S, D], [B, W]
    flat_v, _ = _layer_pages(v_cache, layer, page_table)
    page_size = flat_k.shape[2]
    block = tpu_pages_per_block(ids.shape[1], page_size)
    ids = _pad_to_blocks(ids, layer, k_cache.shape[2], block)
    qs = q[:, 0] * jnp.asarray(d**-0.5, q.dtype)  # [B, N, D]
    lengths = kv_lens.astype(jnp.int32)

    def kernel(qs, flat_k, flat_v, lengths, ids):  # per shard
        megacore = None
        if cores == 2:
            megacore = "kv_head" if flat_k.shape[0] % 2 == 0 else "batch" if qs.shape[0] % 2 == 0 else None
        return paged_attention(qs, flat_k, flat_v, lengths, ids, pages_per_compute_block=block,
                               megacore_mode=megacore)

    if mesh is not None and mesh.size > 1:  # a Mosaic call is never partitioned by GSPMD: run it per shard
        tensor = mesh.shape.get("tensor", 1)
        heads = "tensor" if tensor > 1 and flat_k.shape[0] % tensor == 0 else None  # as `cache_sharding` splits
        P = jax.sharding.PartitionSpec
        kernel = jax.shard_map(kernel, mesh=mesh, check_vma=False,
                               in_specs=(P(None, heads, None), P(heads), P(heads), P(), P()),
                               out_specs=P(None, heads, None))
    if interpret:
        with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams(num_cores_or_threads=cores)):
            out = kernel(qs, flat_k, flat_v, lengths, ids)
    else:
        out = kernel(qs, flat_k, flat_v, lengths, ids)
    return out[:, None].astype(q.dtype)  # [B, 1, N, D]


# ---- the decode attention a sampler runs, by name --------------------------------------

DecodeAttentionFactory = Callable[[int, int, object], PagedAttentionFn]  # (head_dim, page_size, mesh) -> fn
DECODE_ATTENTION: dict[str, DecodeAttentionFactory] = {}


def register_decode_attention(name: str):
    def wrap(factory: DecodeAttentionFactory) -> DecodeAttentionFactory:
        if name in DECODE_ATTENTION:
            raise ValueError(f"decode attention {name!r} is registered twice")
        DECODE_ATTENTION[name] = factory
        return factory

    return wrap


@register_decode_attention("reference")
def _reference(head_dim: int, page_size: int, mesh) -> PagedAttentionFn:
    return paged_attention_reference


@register_decode_attention("pallas")
def _pallas_gpu(head_dim: int, page_size: int, mesh) -> PagedAttentionFn:
    check_pallas_shapes(head_dim, page_size)
    return functools.partial(paged_decode_attention_pallas, interpret=target_backend() != "gpu")


def tensor_cores(mesh) -> int:
    """TensorCores per device of `mesh` (default: this process's first device): 2 on
    megacore chips (v4, v5p), 1 otherwise. libtpu's topology devices report it too."""
    device = next(iter(mesh.devices.flat)) if mesh is not None else jax.devices()[0]
    return int(getattr(device, "num_cores", 1) or 1) if device.platform == "tpu" else 1


@register_decode_attention("pallas_tpu")
def _pallas_tpu(head_dim: int, page_size: int, mesh) -> PagedAttentionFn:
    on_tpu = target_backend() == "tpu"
    if on_tpu:
        check_tpu_shapes(head_dim)
    cores = tensor_cores(mesh) if on_tpu else 1
    return functools.partial(paged_decode_attention_tpu, interpret=not on_tpu, mesh=mesh, cores=cores)


def choose_decode_attention(backend: str, head_dim: int) -> str:
    """What `auto` runs: the TPU paged kernel on a TPU when head_dim fills the 128 lanes
    (`check_tpu_shapes`), else the reference. The GPU kernel ("pallas") is not chosen:
    it matches the reference in interpret mode and lowers to Triton, but has not been
    run on a GPU here (tests/rollout/test_attention.py runs it when one is present)."""
    if backend == "tpu" and head_dim % TPU_LANES == 0:
        return "pallas_tpu"
    return "reference"


def resolve_decode_attention(name: str, head_dim: int) -> str:
    """`name`, or for "auto" what it runs on the platform being compiled for."""
    return choose_decode_attention(target_backend(), head_dim) if name == "auto" else name


def decode_attention(name: str, head_dim: int, page_size: int, mesh=None) -> PagedAttentionFn:
    """The attention used by decode steps for a `SamplerConfig.attention` value, for the
    platform being compiled for (`target_backend`). `mesh`: where the pools live (their
    `NamedSharding`'s mesh), for the kernels that run per shard."""
    name = resolve_decode_attention(name, head_dim)
    if name not in DECODE_ATTENTION:
        raise ValueError(f"unknown paged attention {name!r}; choose auto | {' | '.join(DECODE_ATTENTION)}")
    return DECODE_ATTENTION[name](head_dim, page_size, mesh)
