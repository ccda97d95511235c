"""Attention kernels for full sequences (training forward, prefill), by name.

Every kernel takes q `[B, T, N, D]`, k and v `[B, S, K, D]` (grouped-query: N is a
multiple of K) and a boolean mask `[B, T, S]` (True = may attend), and returns `[B, T, N, D]`.
The `xla` kernel is the oracle every faster kernel is tested against.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

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


@register_attention("xla")
def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(D) + mask) v in plain jnp; scores and softmax in float32.

    A fully masked query row (a padding token) gets a finite, meaningless output
    instead of NaN, so padded rows never poison a reduction.
    """
    b, t, n, d = q.shape
    kv = k.shape[2]
    q = q.reshape(b, t, kv, n // kv, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (d**-0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, n, d)


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """Causal mask within segments: query t may see key s iff s <= t, both in the same
    segment, and the key is not padding (segment id 0). `[B, T]` -> `[B, T, T]`."""
    t = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal[None] & same & (segment_ids[:, None, :] != 0)


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Position ids that restart at 0 at the start of every segment (left padding,
    right padding and packed rows alike)."""
    t = segment_ids.shape[1]
    idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids.shape)
    prev = jnp.concatenate([jnp.full_like(segment_ids[:, :1], -1), segment_ids[:, :-1]], axis=1)
    starts = jnp.where(segment_ids != prev, idx, 0)
    starts = jax.lax.cummax(starts, axis=1)
    return idx - starts
