"""Attention over a paged KV cache.

Every paged attention function here takes
  q            `[B, T, N, D]`     queries of the tokens being computed this step,
  kv_cache     `[L, P, S, 2K, D]` the whole pool (all layers; keys and values interleaved
                                  per kv head, `rljax.rollout.kv_cache`),
  layer        int32 scalar        which layer's pages to read,
  page_table   `[B, W]` int32      each row's pages in order (unused entries: page 0),
  q_positions  `[B, T]` int32      the position of every query token,
  kv_lens      `[B]` int32         tokens in the cache for each row (this step's included),
and returns `[B, T, N, D]`. Query t of row b sees key position s iff s <= q_positions[b, t]
and s < kv_lens[b]. The current step's keys are written to the pool before attention.
A row's real queries are its first ones, at consecutive positions; padding queries follow
(their outputs are dropped).

A ragged attention function takes the queries of several sequences back to back instead,
as the TPU ragged paged-attention kernel does:
  q            `[T, N, D]`         sequence r's queries are `q[cu_q_lens[r]:cu_q_lens[r+1]]`,
                                   the last `q_len` tokens of its `kv_lens[r]`,
  kv_cache, layer                  as above,
  page_table   `[R, W]`, kv_lens `[R]`, cu_q_lens `[R + 1]`, num_seqs `[1]` (sequences
                                   past `num_seqs` and queries past `cu_q_lens[num_seqs]`
                                   are padding: outputs unspecified),
and returns `[T, N, D]`.

`paged_attention_reference` is the oracle: it gathers the pages through the page table
into a dense `[B, W*S, K, D]` view and runs the training forward's own attention
(`rljax.models.attention.xla_attention`) under a position mask, so the sampler's logits
match the trainer's. `ragged_attention_reference` is the same for the ragged form.
`paged_attention_blocked` walks the page table in blocks of keys with an online softmax
and stops after the longest live row (plain jnp; the CPU's decode steps).
`paged_decode_attention_pallas` is a Pallas kernel (Triton-style, for GPUs) for decode
steps (T == 1) that walks only the pages a sequence owns, with an online softmax; on other
backends it runs in Pallas interpret mode (for tests). `ragged_attention_tpu` runs JAX's
TPU ragged paged-attention kernel on the pool in place, for decode, prefill and mixed
steps alike (off a TPU, where the kernel cannot run, the ragged reference on the same
arguments). `paged_attention(name)` picks one set (registry `PAGED_ATTENTION`; "auto":
`choose_paged_attention`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rljax.models.attention import target_backend, xla_attention

PagedAttentionFn = Callable[..., jax.Array]  # (q, kv_cache, layer, page_table, q_positions, kv_lens) -> out
RaggedAttentionFn = Callable[..., jax.Array]  # (q, kv_cache, layer, page_table, cu_q_lens, kv_lens, num_seqs)


def _layer_pages(cache: jax.Array, layer: jax.Array, page_table: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The pool `[L, P, S, 2K, D]` viewed as `[L*P, S, 2K, D]` (a free reshape) and page
    ids offset into `layer`'s block (`layer * P + page`), so a layer's pages are read
    without slicing the layer out."""
    num_layers, num_pages = cache.shape[:2]
    flat = cache.reshape(num_layers * num_pages, *cache.shape[2:])
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


def split_kv(pages: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys and values `[..., K, D]` each from interleaved `[..., 2K, D]`."""
    *lead, two_k, d = pages.shape
    pairs = pages.reshape(*lead, two_k // 2, 2, d)
    return pairs[..., 0, :], pairs[..., 1, :]


def interleave_kv(k: jax.Array, v: jax.Array) -> jax.Array:
    """`[..., 2K, D]` from keys and values `[..., K, D]` (key 2h, value 2h + 1)."""
    *lead, kv_heads, d = k.shape
    return jnp.stack([k, v], axis=-2).reshape(*lead, 2 * kv_heads, d)


def gather_kv(cache: jax.Array, layer: jax.Array, page_table: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Dense `[B, W*S, K, D]` views of each row's cached keys and values."""
    flat, ids = _layer_pages(cache, layer, page_table)
    pages = flat[ids]  # [B, W, S, 2K, D]
    b, w, s = pages.shape[:3]
    return split_kv(pages.reshape(b, w * s, *pages.shape[3:]))


def _seen(key_pos: jax.Array, q_positions: jax.Array, kv_lens: jax.Array) -> jax.Array:
    """`[B, T, S]`: query t of row b sees key position `key_pos[s]` iff it is at or before
    the query's position and inside the row's cached length."""
    return (key_pos[None, None, :] <= q_positions[:, :, None]) & (key_pos[None, None, :] < kv_lens[:, None, None])


def paged_attention_reference(
    q: jax.Array,
    kv_cache: jax.Array,
    layer: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    kv_lens: jax.Array,
) -> jax.Array:
    """Gather the pages, mask by position and length, and attend (plain jnp)."""
    k, v = gather_kv(kv_cache, layer, page_table)
    mask = _seen(jnp.arange(k.shape[1], dtype=jnp.int32), q_positions, kv_lens)
    return xla_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask)


def ragged_attention_reference(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
) -> jax.Array:
    """Ragged paged attention in plain jnp, with the TPU kernel's arguments: q `[T, N, D]`,
    kv_pages `[pages, S, 2K, D']` (D' >= D: a padded pool's first D are read),
    page_indices `[R, W]` into it. Query i of sequence r
    (`cu_q_lens[r] + i`) sits at position `kv_lens[r] - q_len + i` and sees the keys at
    positions up to its own. Each query gathers its sequence's pages (`[T, W*S, 2K, D]`):
    a test oracle and the CPU path, not for long sequences. Queries past
    `cu_q_lens[num_seqs]` get zeros."""
    t = q.shape[0]
    r, w = page_indices.shape
    token = jnp.arange(t, dtype=jnp.int32)
    seq = jnp.clip(jnp.searchsorted(cu_q_lens, token, side="right") - 1, 0, r - 1)  # [T] each query's sequence
    kv_len = kv_lens[seq]  # [T]
    position = kv_len - (cu_q_lens[seq + 1] - token)  # [T]
    pages = kv_pages[page_indices[seq]]  # [T, W, S, 2K, D]
    k, v = split_kv(pages.reshape(t, w * pages.shape[2], *pages.shape[3:])[..., :q.shape[-1]])  # [T, W*S, K, D]
    key_pos = jnp.arange(k.shape[1], dtype=jnp.int32)
    mask = (key_pos[None, :] <= position[:, None]) & (key_pos[None, :] < kv_len[:, None])  # [T, W*S]
    out = xla_attention(q[:, None], k.astype(q.dtype), v.astype(q.dtype), mask[:, None, :])[:, 0]  # [T, N, D]
    return jnp.where((token < cu_q_lens[num_seqs[0]])[:, None, None], out, 0).astype(q.dtype)


# ---- blocked decode attention (plain jnp) ------------------------------------------------

BLOCK_KEYS = 128  # keys per block of `paged_attention_blocked` (pages per block: this / page_size)


def paged_attention_blocked(
    q: jax.Array,
    kv_cache: jax.Array,
    layer: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    kv_lens: jax.Array,
) -> jax.Array:
    """Paged attention that walks the page table in blocks of `BLOCK_KEYS` keys with an
    online softmax, for as many blocks as the longest row's `kv_lens` needs (a run-time
    trip count), in plain jnp.

    Per block j of keys K_j, V_j (scores in float32, masked as the reference masks them):

        s_j = q K_j^T / sqrt(D),   m_j = max(m_{j-1}, max s_j),
        l_j = e^(m_{j-1} - m_j) l_{j-1} + sum e^(s_j - m_j),
        o_j = e^(m_{j-1} - m_j) o_{j-1} + e^(s_j - m_j) V_j,     out = o / l

    (the online softmax of Milakov & Gimelshein 2018, as FlashAttention computes it). The
    reference gathers every row's whole padded table (`[B, W*S, 2K, D]` per layer) and
    scores it; this reads `[B, BLOCK_KEYS]` keys at a time and stops after the longest
    live row, so a decode step's work follows the batch's real context, not the width
    bucket. On this project's CPU the agent-shaped workloads of `rljax bench sampler`
    run 1.6-1.9x faster than on the reference (`docs/benchmarks.md`). A row with no keys
    (batch padding) gets zeros.

    Blocks are read as `kv_cache[layer, pages]`, not through the flat `[L*P, ...]` view
    the other functions use: at one row XLA:CPU turns the step's key / value scatter into
    a dynamic-update-slice, and a loop over a reshaped view of the updated pool then copies
    the whole pool in every layer."""
    b, t, n, d = q.shape
    page_size, two_k = kv_cache.shape[2], kv_cache.shape[3]
    kv_heads = two_k // 2
    per_block = min(max(1, BLOCK_KEYS // page_size), page_table.shape[1])
    width = -(-page_table.shape[1] // per_block) * per_block
    ids = jnp.pad(page_table.astype(jnp.int32), ((0, 0), (0, width - page_table.shape[1])))  # page 0: the null page
    block_keys = per_block * page_size
    qg = q.reshape(b, t, kv_heads, n // kv_heads, d)
    num_blocks = jnp.minimum(-(-jnp.max(kv_lens) // block_keys), width // per_block)

    def body(j, carry):
        m_prev, l_prev, o_prev = carry
        pages = kv_cache[layer, jax.lax.dynamic_slice_in_dim(ids, j * per_block, per_block, axis=1)]  # [B, blk, S, 2K, D]
        k, v = split_kv(pages.reshape(b, block_keys, two_k, d))
        s = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * (d**-0.5)
        seen = _seen(j * block_keys + jnp.arange(block_keys, dtype=jnp.int32), q_positions, kv_lens)
        s = jnp.where(seen[:, None, None], s, -jnp.inf)
        m = jnp.maximum(m_prev, s.max(-1))
        m_finite = jnp.where(jnp.isfinite(m), m, 0.0)
        p = jnp.exp(s - m_finite[..., None])
        correction = jnp.where(jnp.isfinite(m_prev), jnp.exp(m_prev - m_finite), 0.0)
        pv = jnp.einsum("bkgts,bskd->bkgtd", p.astype(q.dtype), v.astype(q.dtype), preferred_element_type=jnp.float32)
        return m, correction * l_prev + p.sum(-1), correction[..., None] * o_prev + pv

    stats = (b, kv_heads, n // kv_heads, t)
    init = (jnp.full(stats, -jnp.inf, jnp.float32), jnp.zeros(stats, jnp.float32), jnp.zeros((*stats, d), jnp.float32))
    _, l_sum, o = jax.lax.fori_loop(0, num_blocks, body, init)
    out = o / jnp.where(l_sum == 0.0, 1.0, l_sum)[..., None]  # [B, K, G, T, D]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, d).astype(q.dtype)


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
    kv_cache: jax.Array,
    layer: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    kv_lens: jax.Array,
    *,
    interpret: bool = False,
) -> jax.Array:
    """Decode attention (T == 1) as a Pallas kernel reading the pool in place.

    The grid is (batch, kv_heads); each program reads only the `ceil(kv_len / S)` pages
    of its sequence, the keys and the values of its kv head (columns `2h` and `2h + 1` of
    the pool's `2K` axis, strided reads). Grouped-query heads that share a kv head are one
    `[G, D]` block. `q_positions` is unused: for a decode token the causal bound equals
    `kv_len`."""
    del q_positions
    from jax.experimental.pallas import triton as plgpu

    b, t, n, d = q.shape
    if t != 1:
        raise ValueError(f"the Pallas kernel handles decode steps (T == 1), got T={t}")
    flat, ids = _layer_pages(kv_cache, layer, page_table)  # [L*P, S, 2K, D], [B, W]
    total_pages, page_size, two_k, _ = flat.shape
    kv_heads = two_k // 2
    groups = n // kv_heads
    g_pad = max(_MIN_BLOCK, pl.next_power_of_2(groups))
    qh = q.reshape(b, kv_heads, groups, d)
    if g_pad != groups:
        qh = jnp.pad(qh, ((0, 0), (0, 0), (0, g_pad - groups), (0, 0)))
    pages_per_block = _pages_per_block(page_table.shape[1], page_size)
    ids = _pad_to_blocks(ids, layer, kv_cache.shape[1], pages_per_block)
    width = ids.shape[1]
    kernel = functools.partial(_decode_kernel, pages_per_block=pages_per_block, scale=d**-0.5, dot=plgpu.dot)
    out = pl.pallas_call(
        kernel,
        grid=(b, kv_heads),
        in_specs=[
            pl.BlockSpec((None, None, g_pad, d), lambda i, h: (i, h, 0, 0)),
            pl.BlockSpec((total_pages, page_size, None, d), lambda i, h: (0, 0, 2 * h, 0)),  # head h's keys
            pl.BlockSpec((total_pages, page_size, None, d), lambda i, h: (0, 0, 2 * h + 1, 0)),  # its values
            pl.BlockSpec((None, width), lambda i, h: (i, 0)),
            pl.BlockSpec((None, 1), lambda i, h: (i, 0)),
        ],
        out_specs=pl.BlockSpec((None, None, g_pad, d), lambda i, h: (i, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((b, kv_heads, g_pad, d), q.dtype),
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        name="rljax_paged_decode_attention",
    )(qh, flat, flat, ids, kv_lens.astype(jnp.int32)[:, None])
    return out[:, :, :groups, :].reshape(b, 1, n, d)


# ---- the TPU ragged paged-attention kernel ---------------------------------------------

TPU_LANES = 128  # a TPU vector register's lane count: the kernel's last (head_dim) axis tiles by it
TPU_BLOCK_KEYS = 256  # keys per kernel block (num_kv_pages_per_block x page_size), about
TPU_BLOCK_QUERIES = 32  # queries per kernel block, at most


def tpu_pages_per_block(width: int, page_size: int) -> int:
    """`num_kv_pages_per_block` for the TPU kernel: about `TPU_BLOCK_KEYS` keys per block,
    a power of two, no more than the (power-of-two-padded) page-table width."""
    return max(1, min(pl.next_power_of_2(max(1, TPU_BLOCK_KEYS // page_size)), pl.next_power_of_2(width)))


def tpu_queries_per_block(tokens: int) -> int:
    """`num_queries_per_block`: the largest power of two up to `TPU_BLOCK_QUERIES` that
    divides the query count, so the blocks tile the queries exactly."""
    return math.gcd(tokens, TPU_BLOCK_QUERIES)


def cache_head_dim(name: str, head_dim: int) -> int:
    """The pool's head_dim under attention `name` (resolved). The TPU kernel takes head_dim
    in multiples of the 128 lanes (its softmax statistics are 128-lane tiles of the same
    rows), so `pallas_tpu` pads it up with zeros (a head_dim of 64 doubles the pool's
    bytes: a TPU packs a narrower last axis, so the padding is real HBM). Every other
    attention keeps the model's head_dim."""
    return -(-head_dim // TPU_LANES) * TPU_LANES if name == "pallas_tpu" else head_dim


def ragged_attention_tpu(
    q: jax.Array,
    kv_cache: jax.Array,
    layer: jax.Array,
    page_table: jax.Array,
    cu_q_lens: jax.Array,
    kv_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    on_tpu: bool = True,
    mesh=None,
) -> jax.Array:
    """Ragged attention with JAX's TPU ragged paged-attention kernel
    (`jax.experimental.pallas.ops.tpu.ragged_paged_attention`: decode rows, prefill chunks
    and mixes of both in one call; per query block it walks the sequences the block holds
    and DMAs `num_kv_pages_per_block` pages at a time, double-buffered, up to each
    sequence's length). It takes `[pages, S, 2K, D]`: our pool `[L, P, S, 2K, D]` reshaped
    (free) to `[L*P, S, 2K, D]` with the layer's page ids offset by `layer * P`, so the
    pool is read in place. The page table is padded with the layer's null page to a
    multiple of the block, and lengths are clamped to the padded table. A pool whose
    head_dim is padded past q's (`cache_head_dim`) meets q padded with zeros (scores
    unchanged, scaled by q's own head_dim) and the output's padding is dropped.

    `on_tpu=False`: `ragged_attention_reference` on the same arguments (TPU interpret
    mode cannot run this kernel). `mesh`: where the pool lives. On a mesh of several
    devices the kernel runs per shard in `shard_map` (GSPMD cannot partition a Mosaic
    call): kv heads (and their query heads) split over "tensor" when the pool is
    (`cache_sharding`), whole on every device otherwise. The kernel's grid is sequential
    ("arbitrary"), so on a megacore chip (v4, v5p) it runs on one of the two TensorCores."""
    t, _, d = q.shape
    flat, ids = _layer_pages(kv_cache, layer, page_table)  # [L*P, S, 2K, D'], [R, W]; D' >= D
    page_size = flat.shape[1]
    block = tpu_pages_per_block(ids.shape[1], page_size)
    ids = _pad_to_blocks(ids, layer, kv_cache.shape[1], block)
    lengths = jnp.minimum(kv_lens.astype(jnp.int32), ids.shape[1] * page_size)
    if on_tpu:
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

        q = jnp.pad(q, ((0, 0), (0, 0), (0, flat.shape[-1] - d)))
        kernel = functools.partial(ragged_paged_attention, sm_scale=d**-0.5, num_kv_pages_per_block=block,
                                   num_queries_per_block=tpu_queries_per_block(t))
    else:
        kernel = ragged_attention_reference
    if mesh is not None and mesh.size > 1:  # a Mosaic call is never partitioned by GSPMD: run it per shard
        tensor = mesh.shape.get("tensor", 1)
        heads = "tensor" if tensor > 1 and (flat.shape[2] // 2) % tensor == 0 else None  # as `cache_sharding` splits
        P = jax.sharding.PartitionSpec
        kernel = jax.shard_map(kernel, mesh=mesh, check_vma=False,
                               in_specs=(P(None, heads, None), P(None, None, heads, None), P(), P(), P(), P()),
                               out_specs=P(None, heads, None))
    out = kernel(q, flat, lengths, ids, cu_q_lens.astype(jnp.int32), num_seqs.astype(jnp.int32))
    return out[..., :d]


def paged_attention_tpu(
    q: jax.Array,
    kv_cache: jax.Array,
    layer: jax.Array,
    page_table: jax.Array,
    q_positions: jax.Array,
    kv_lens: jax.Array,
    *,
    on_tpu: bool = True,
    mesh=None,
) -> jax.Array:
    """`[B, T]` rows (decode steps, prefill chunks) through `ragged_attention_tpu`, each
    row one sequence of T queries. The kernel puts a sequence's queries at the last T
    positions of its length, so row b's length is `q_positions[b, 0] + T`: its real
    queries sit at their own positions (and see only keys up to them), its padding
    queries after them. The page table gets `ceil((T - 1) / S)` more null columns so those
    positions stay inside it. `kv_lens` is unused: a real query's bound is its position."""
    del kv_lens
    b, t, n, d = q.shape
    extra = -(-(t - 1) // kv_cache.shape[2])
    if extra:
        page_table = jnp.pad(page_table, ((0, 0), (0, extra)))  # page 0: the null page
    cu_q_lens = jnp.arange(b + 1, dtype=jnp.int32) * t
    out = ragged_attention_tpu(q.reshape(b * t, n, d), kv_cache, layer, page_table, cu_q_lens,
                               q_positions[:, 0] + t, jnp.full((1,), b, jnp.int32), on_tpu=on_tpu, mesh=mesh)
    return out.reshape(b, t, n, d)


# ---- the attention a sampler runs, by name ---------------------------------------------


@dataclass(frozen=True)
class PagedAttention:
    """The attention one sampler's programs run: `decode` for decode steps (T == 1),
    `prefill` for prefill chunks, and `ragged`, where the implementation has one, for a
    mixed step's decode rows and chunks in one call (without it a mixed step runs `decode`
    on its decode rows and `prefill` on its chunks)."""

    name: str
    decode: PagedAttentionFn
    prefill: PagedAttentionFn
    ragged: RaggedAttentionFn | None = None


PagedAttentionFactory = Callable[[int, int, object], PagedAttention]  # (head_dim, page_size, mesh) -> attention
PAGED_ATTENTION: dict[str, PagedAttentionFactory] = {}


def register_paged_attention(name: str):
    def wrap(factory: PagedAttentionFactory) -> PagedAttentionFactory:
        if name in PAGED_ATTENTION:
            raise ValueError(f"paged attention {name!r} is registered twice")
        PAGED_ATTENTION[name] = factory
        return factory

    return wrap


@register_paged_attention("reference")
def _reference(head_dim: int, page_size: int, mesh) -> PagedAttention:
    return PagedAttention("reference", paged_attention_reference, paged_attention_reference)


@register_paged_attention("blocked")
def _blocked(head_dim: int, page_size: int, mesh) -> PagedAttention:
    return PagedAttention("blocked", paged_attention_blocked, paged_attention_reference)


@register_paged_attention("pallas")
def _pallas_gpu(head_dim: int, page_size: int, mesh) -> PagedAttention:
    check_pallas_shapes(head_dim, page_size)
    decode = functools.partial(paged_decode_attention_pallas, interpret=target_backend() != "gpu")
    return PagedAttention("pallas", decode, paged_attention_reference)


@register_paged_attention("pallas_tpu")
def _pallas_tpu(head_dim: int, page_size: int, mesh) -> PagedAttention:
    on_tpu = target_backend() == "tpu"
    rows = functools.partial(paged_attention_tpu, on_tpu=on_tpu, mesh=mesh)
    return PagedAttention("pallas_tpu", rows, rows, functools.partial(ragged_attention_tpu, on_tpu=on_tpu, mesh=mesh))


def choose_paged_attention(backend: str) -> str:
    """What `auto` runs: the TPU ragged kernel on a TPU (any head_dim: the pool pads it to
    the lanes, `cache_head_dim`), the blocked decode on a CPU (1.6-1.9x the reference's
    throughput on agent-shaped workloads there, `docs/benchmarks.md`), else the
    reference. The GPU kernel ("pallas") is not chosen: it matches the reference in
    interpret mode and lowers to Triton, but has not been run on a GPU here
    (tests/rollout/test_attention.py runs it when one is present); nor is "blocked" on a
    GPU, where it has not been timed."""
    return {"tpu": "pallas_tpu", "cpu": "blocked"}.get(backend, "reference")


def resolve_paged_attention(name: str, backend: str | None = None) -> str:
    """`name`, or for "auto" what it runs on `backend` (default: the platform being
    compiled for, `target_backend`)."""
    return choose_paged_attention(backend or target_backend()) if name == "auto" else name


def paged_attention(name: str, head_dim: int, page_size: int, mesh=None) -> PagedAttention:
    """The attention for a `SamplerConfig.attention` value, for the platform being
    compiled for (`target_backend`). `mesh`: where the pool lives (its `NamedSharding`'s
    mesh), for the kernels that run per shard."""
    name = resolve_paged_attention(name)
    if name not in PAGED_ATTENTION:
        raise ValueError(f"unknown paged attention {name!r}; choose auto | {' | '.join(PAGED_ATTENTION)}")
    return PAGED_ATTENTION[name](head_dim, page_size, mesh)
