"""Attention kernels for full sequences (training forward, prefill), by name.

Interface: every kernel is `kernel(q, k, v, segments) -> out` with q `[B, T, N, D]`, k and
v `[B, S, K, D]` (grouped-query: N is a multiple of K) and out `[B, T, N, D]` in q's dtype.
`segments` is one of

- int `[B, T]` segment ids (self-attention, T == S; 0 = padding): query t may see key s
  iff s <= t and ids[s] == ids[t] != 0, i.e. causal within a segment (`segment_mask`).
  This is what flash kernels need: they build the mask tile by tile from the ids and
  never hold a `[T, S]` array.
- bool `[B, T, S]` dense mask (True = may attend). The `xla` kernel takes any pattern
  (the sampler's paged attention passes position masks this way). The other kernels take
  it only in the form `segment_mask` builds and recover the ids from it
  (`segments_from_mask`, O(B T S) per call): a bridge for callers that still pass masks.

Kernels (`get_attention(name)`):

    xla         plain jnp, scores and softmax in float32: the oracle every kernel is
                tested against. Materialises the [B, K, G, T, S] scores.
    cudnn       cuDNN flash attention (`jax.nn.dot_product_attention(implementation=
                "cudnn")`), GPU only, bf16 / fp16 inputs. Rows that are one segment plus
                right padding use cuDNN's causal + sequence-length mask (nothing
                [T, S]-sized); any other layout (packed rows, left padding) passes the
                same-segment mask as a [B, 1, T, S] bias (exact, O(B T S) memory). A
                `lax.cond` on the ids picks the path at run time.
    pallas_gpu  the Pallas (Triton) flash-attention kernel of
                `jax.experimental.pallas.ops.gpu.attention` (forward and backward, native
                segment ids); K/V heads are repeated to N for grouped-query attention.
                Runs in Pallas interpret mode off GPU (tests).
    splash      the Pallas TPU splash-attention kernel (causal mask + `SegmentIds`,
                grouped-query native), vmapped over the batch. Interpret mode off TPU.
    auto        chosen at trace time by `choose_attention(target_backend(), ...)`:
                cudnn on GPU (bf16 / fp16, head_dim a multiple of 8 and <= 128, else
                xla), splash on TPU, xla elsewhere.

The Pallas kernels pad the sequence to their block multiple with segment id 0 and drop
the padding afterwards. Under an active mesh (`jax.set_mesh`) with the rljax axes they
run inside `shard_map` (batch over data x fsdp, heads over tensor), since a Pallas call
cannot be partitioned by GSPMD; without one they see the whole arrays.

Outputs at padding queries (segment id 0) are meaningless but finite in every kernel,
so padded rows never poison a reduction; kernels agree on the non-padding queries.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

AttentionFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]

ATTENTION_KERNELS: dict[str, AttentionFn] = {}


def register_attention(name: str):
    def wrap(fn: AttentionFn) -> AttentionFn:
        ATTENTION_KERNELS[name] = fn
        return fn

    return wrap


def get_attention(name: str) -> AttentionFn:
    if name not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; choose from {sorted(ATTENTION_KERNELS)}")
    return ATTENTION_KERNELS[name]


# ---- the platform programs are traced for ----------------------------------------------

_TARGET_BACKEND: contextvars.ContextVar[str | None] = contextvars.ContextVar("rljax_target_backend", default=None)


def target_backend() -> str:
    """The platform the program being traced will run on: `jax.default_backend()`, unless
    `compiling_for` says otherwise (ahead-of-time compilation for devices this process does
    not run on, e.g. a TPU topology from a CPU host: `rljax compile`)."""
    return _TARGET_BACKEND.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str) -> Iterator[None]:
    """Trace kernels (`auto`'s choice, Pallas interpret mode) for `platform` inside the block."""
    token = _TARGET_BACKEND.set(platform)
    try:
        yield
    finally:
        _TARGET_BACKEND.reset(token)


# ---- masks and segment ids -------------------------------------------------------------


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """Causal mask within segments: query t may see key s iff s <= t, both in the same
    segment, and the key is not padding (segment id 0). `[B, T]` -> `[B, T, T]`."""
    t = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal[None] & same & (segment_ids[:, None, :] != 0)


def branch_mask(segment_ids: jax.Array, branch_ids: jax.Array) -> jax.Array:
    """`segment_mask` for rows whose segments share a prefix among branches: within a
    segment, query t may see key s <= t iff s is in the shared prefix (branch 0) or in t's
    own branch. `[B, T]` ids -> `[B, T, T]` bool. (Packed samples of one prompt,
    `rljax.rl.packing`: the prompt once, then each sample's tokens as a branch.)"""
    same_branch = (branch_ids[:, None, :] == 0) | (branch_ids[:, None, :] == branch_ids[:, :, None])
    return segment_mask(segment_ids) & same_branch


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Position ids that restart at 0 at the start of every segment (left padding,
    right padding and packed rows alike)."""
    t = segment_ids.shape[1]
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids.shape)
    prev = jnp.concatenate([jnp.full_like(segment_ids[:, :1], -1), segment_ids[:, :-1]], axis=1)
    starts = jnp.where(segment_ids != prev, idx, 0)
    starts = jax.lax.cummax(starts, axis=1)
    return idx - starts


def segments_from_mask(mask: jax.Array) -> jax.Array:
    """Segment ids that give back `mask` under `segment_mask`, for a mask built by it.

        ids[b, t] = 1 + min{s : mask[b, t, s]}   (0 when the row is empty: padding)

    Query t of segment g sees exactly the keys of g at or before t, the first of which is
    g's first token, so every token of g maps to the same id and different segments to
    different ids. `[B, T, T]` bool -> `[B, T]` int32."""
    if mask.ndim != 3 or mask.shape[1] != mask.shape[2]:
        raise ValueError(f"a segment mask is [B, T, T]; got {mask.shape} (use the xla kernel for other masks)")
    first = jnp.argmax(mask, axis=-1).astype(jnp.int32)
    return jnp.where(jnp.any(mask, axis=-1), first + 1, 0)


def as_segment_ids(segments: jax.Array) -> jax.Array:
    """int `[B, T]` segment ids from either form a kernel accepts."""
    if segments.dtype == jnp.bool_:
        return segments_from_mask(segments)
    if segments.ndim != 2:
        raise ValueError(f"segment ids are [B, T]; got {segments.shape}")
    return segments.astype(jnp.int32)


def as_mask(segments: jax.Array) -> jax.Array:
    """bool `[B, T, S]` mask from either form a kernel accepts."""
    return segments if segments.dtype == jnp.bool_ else segment_mask(segments.astype(jnp.int32))


# ---- xla: the oracle -------------------------------------------------------------------


@register_attention("xla")
@functools.partial(jax.checkpoint, prevent_cse=False)
def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(D) + mask) v in plain jnp; scores and softmax in float32.

    `mask` is a bool `[B, T, S]` mask or int `[B, T]` segment ids (then
    `segment_mask(ids)`). A fully masked query row (a padding token) gets a finite,
    meaningless output instead of NaN, so padded rows never poison a reduction.

    The backward keeps q, k, v and the mask and recomputes the scores and probabilities
    from them (`jax.checkpoint`), as the flash kernels do: the `[B, N, T, S]` float32
    probabilities are never held from the forward to the backward.
    """
    mask = as_mask(mask)
    b, t, n, d = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, n // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (d**-0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, n, d)


# ---- shared plumbing for the flash kernels ---------------------------------------------

_MESH_AXES = ("data", "fsdp", "tensor")  # rljax.parallel.MESH_AXES (models/ does not import it)
_BATCH_AXES = ("data", "fsdp")


def _check_self_attention(q: jax.Array, k: jax.Array, segment_ids: jax.Array) -> None:
    if q.shape[1] != k.shape[1] or segment_ids.shape != q.shape[:2]:
        raise ValueError(
            f"flash kernels do causal self-attention: q {q.shape}, k {k.shape}, segment ids "
            f"{segment_ids.shape} (T == S and ids [B, T] required)"
        )


def _pad_sequence(q, k, v, segment_ids, length: int):
    """Pad the sequence axis to `length`; padded tokens get segment id 0 (never seen by a
    real token, dropped afterwards)."""
    extra = length - q.shape[1]
    if extra == 0:
        return q, k, v, segment_ids
    pad4 = ((0, 0), (0, extra), (0, 0), (0, 0))
    return (jnp.pad(q, pad4), jnp.pad(k, pad4), jnp.pad(v, pad4), jnp.pad(segment_ids, ((0, 0), (0, extra))))


def _over_mesh(fn: Callable, q, k, v, segment_ids) -> jax.Array:
    """`fn(q, k, v, ids)` per shard when a (data, fsdp, tensor) mesh is active: batch
    over data x fsdp and heads over tensor where they divide, else replicated. Pallas
    calls are opaque to GSPMD, so this is how they run on a sharded batch."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(_MESH_AXES) <= set(mesh.axis_names) or mesh.size == 1:
        return fn(q, k, v, segment_ids)
    batch = tuple(a for a in _BATCH_AXES if mesh.shape[a] > 1)
    if batch and q.shape[0] % int(np.prod([mesh.shape[a] for a in batch])):
        batch = ()
    t = mesh.shape["tensor"]
    heads = "tensor" if t > 1 and q.shape[2] % t == 0 and k.shape[2] % t == 0 else None
    batch_spec = batch or None
    qkv = P(batch_spec, None, heads, None)
    return jax.shard_map(
        fn, mesh=mesh, in_specs=(qkv, qkv, qkv, P(batch_spec, None)), out_specs=qkv, check_vma=False
    )(q, k, v, segment_ids)


# ---- cuDNN (GPU) -----------------------------------------------------------------------

CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def is_single_right_padded(segment_ids: jax.Array) -> jax.Array:
    """True (a bool scalar) iff every row is one segment followed by padding:
    ids = [g, ..., g, 0, ..., 0]. Such rows need only a causal + length mask."""
    valid = segment_ids != 0
    lengths = jnp.sum(valid, axis=-1, keepdims=True)
    prefix = valid == (jnp.arange(segment_ids.shape[1])[None, :] < lengths)
    one_id = ~valid | (segment_ids == segment_ids[:, :1])
    return jnp.all(prefix & one_id)


def cudnn_attention_impl(q, k, v, segments, *, implementation: str = "cudnn") -> jax.Array:
    """The `cudnn` kernel with the implementation of `jax.nn.dot_product_attention` as a
    parameter, so its argument plumbing runs on CPU with `implementation="xla"`.

        right-padded single segments:  is_causal, q/kv_seq_lengths = tokens per row
        anything else:                 is_causal, mask = same segment & key not padding
    """
    segment_ids = as_segment_ids(segments)
    _check_self_attention(q, k, segment_ids)
    if implementation == "cudnn" and q.dtype not in CUDNN_DTYPES:
        raise ValueError(f"cudnn attention takes bfloat16 / float16 inputs, got {q.dtype}; use xla or set "
                         "model.compute_dtype=bfloat16")
    t = q.shape[1]
    q, k, v, segment_ids = _pad_sequence(q, k, v, segment_ids, t + t % 2)  # cuDNN: even T with a bias
    valid = segment_ids != 0
    # A fully padded row gets length 1 (its first token sees itself); its output is dropped.
    lengths = jnp.maximum(jnp.sum(valid, axis=-1), 1).astype(jnp.int32)

    def right_padded(q, k, v, ids):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, query_seq_lengths=lengths,
                                            key_value_seq_lengths=lengths, implementation=implementation)

    def general(q, k, v, ids):
        same = (ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] != 0)
        return jax.nn.dot_product_attention(q, k, v, mask=same[:, None], is_causal=True,
                                            implementation=implementation)

    out = jax.lax.cond(is_single_right_padded(segment_ids), right_padded, general, q, k, v, segment_ids)
    return jnp.where(valid[:, :, None, None], out, jnp.zeros((), out.dtype))[:, :t]


@register_attention("cudnn")
def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array) -> jax.Array:
    """cuDNN flash attention (GPU, bf16 / fp16); see `cudnn_attention_impl`."""
    return cudnn_attention_impl(q, k, v, segments)


# ---- Pallas GPU (Triton) flash attention -----------------------------------------------


def _gpu_padded_length(t: int) -> int:
    """Triton blocks are powers of two: a short sequence pads to the next power of two
    (>= 16), a long one to a multiple of 128."""
    if t <= 128:
        return max(16, 1 << (t - 1).bit_length())
    return -(-t // 128) * 128


def pallas_gpu_attention_impl(q, k, v, segments, *, interpret: bool | None = None, block_q: int = 128,
                              block_k: int = 128, block_bwd: int = 32) -> jax.Array:
    """Flash attention (FlashAttention-2 forward, Dao 2023; Triton-style backward) from
    `jax.experimental.pallas.ops.gpu.attention.mha` with `causal=True` and segment ids.
    Its segment mask is `ids[t] == ids[s]`; with causality that is `segment_mask` on
    every non-padding query."""
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention

    segment_ids = as_segment_ids(segments)
    _check_self_attention(q, k, segment_ids)
    interpret = target_backend() != "gpu" if interpret is None else interpret

    def run(q, k, v, ids):
        b, t, n, d = q.shape
        length = _gpu_padded_length(t)
        q, k, v, ids = _pad_sequence(q, k, v, ids, length)
        groups = n // k.shape[2]
        if groups > 1:
            k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        sizes = gpu_attention.BlockSizes(
            block_q=min(block_q, length), block_k=min(block_k, length),
            block_q_dkv=min(block_bwd, length), block_kv_dkv=min(block_bwd, length),
            block_q_dq=min(block_bwd, length), block_kv_dq=min(block_bwd, length),
        )
        out = gpu_attention.mha(q, k, v, ids, sm_scale=d**-0.5, causal=True, block_sizes=sizes,
                                interpret=interpret)
        return out[:, :t]

    return _over_mesh(run, q, k, v, segment_ids)


@register_attention("pallas_gpu")
def pallas_gpu_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array) -> jax.Array:
    """Pallas (Triton) flash attention on GPU; interpret mode elsewhere."""
    return pallas_gpu_attention_impl(q, k, v, segments)


# ---- splash attention (TPU) ------------------------------------------------------------


def _splash_block(length: int) -> int:
    """The largest of 512, 256, 128 dividing `length` (a multiple of 128)."""
    return next(b for b in (512, 256, 128) if length % b == 0)


@functools.lru_cache(maxsize=32)
def _splash_kernel(length: int, heads: int, block: int, interpret: bool):
    """A causal splash kernel for `heads` query heads of `length` tokens, built once per
    shape (building it walks the mask's blocks on the host)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    mask = sm.MultiHeadMask([sm.CausalMask((length, length)) for _ in range(heads)])
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    # Concrete mask metadata even when first built inside a trace (the kernel is cached).
    with jax.ensure_compile_time_eval():
        return sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention_impl(q, k, v, segments, *, interpret: bool | None = None) -> jax.Array:
    """Splash attention (block-sparse flash attention for TPU): causal `CausalMask`
    and'ed with `SegmentIds(q=ids, kv=ids)`; blocks above the diagonal are skipped.
    Splash does not scale scores, so q is multiplied by 1/sqrt(D) first."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    segment_ids = as_segment_ids(segments)
    _check_self_attention(q, k, segment_ids)
    interpret = target_backend() != "tpu" if interpret is None else interpret

    def run(q, k, v, ids):
        b, t, n, d = q.shape
        length = -(-t // 128) * 128
        q, k, v, ids = _pad_sequence(q, k, v, ids, length)
        kernel = _splash_kernel(length, n, _splash_block(length), interpret)
        scale = jnp.asarray(d**-0.5, q.dtype)

        def one(q, k, v, ids):  # [T, N, D] -> heads-major layout the kernel takes
            out = kernel((q * scale).swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1),
                         segment_ids=sk.SegmentIds(q=ids, kv=ids))
            return out.swapaxes(0, 1)

        return jax.vmap(one)(q, k, v, ids)[:, :t].astype(q.dtype)

    return _over_mesh(run, q, k, v, segment_ids)


@register_attention("splash")
def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array) -> jax.Array:
    """Pallas splash attention on TPU; interpret mode elsewhere."""
    return splash_attention_impl(q, k, v, segments)


# ---- auto ------------------------------------------------------------------------------


def choose_attention(backend: str, dtype, head_dim: int, self_attention: bool = True) -> str:
    """The kernel `auto` runs: cudnn on GPU for bf16 / fp16 and a head_dim cuDNN's flash
    attention takes (a multiple of 8, <= 128), splash on TPU, xla otherwise (CPU, fp32 on
    GPU, masks that are not causal self-attention)."""
    if not self_attention:
        return "xla"
    if backend == "gpu" and jnp.dtype(dtype) in CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= 128:
        return "cudnn"
    if backend == "tpu":
        return "splash"
    return "xla"


def resolve_attention(name: str, backend: str, dtype, head_dim: int) -> str:
    """The kernel a self-attention forward with kernel `name` runs on `backend` (`auto`:
    `choose_attention`)."""
    return choose_attention(backend, dtype, head_dim) if name == "auto" else name


@register_attention("auto")
def auto_attention(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array) -> jax.Array:
    """The platform's fast kernel (`choose_attention`), decided when traced."""
    square = segments.dtype != jnp.bool_ or segments.shape[1] == segments.shape[2]
    self_attention = q.shape[1] == k.shape[1] and square
    name = choose_attention(target_backend(), q.dtype, q.shape[-1], self_attention)
    return get_attention(name)(q, k, v, segments)
