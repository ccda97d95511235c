"""Per-token log-probabilities and entropies, aligned with `input_ids` (the label shift
happens here, once), including a chunked path from hidden states that never materialises
the [B, T, vocab] logits.

The data contract (docs/design.md): a per-token array x [B, T] is aligned with `input_ids`;
x[:, t] is about token input_ids[:, t] given the tokens before it, so it is computed from
the model output at position t - 1; x[:, 0] = 0 (the first token has no prediction).
Masks for such arrays must therefore be 0 at t = 0 (a response never starts at 0).

Log-probabilities use temperature-scaled logits, logits / temperature, as the sampler does.
All reductions run in float32 whatever the input dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.aggregation import AggTerms, agg_loss_terms, finish_loss

DEFAULT_CHUNK_SIZE = 256  # sequence positions per chunk (all rows at once), at most
LOGITS_CHUNK_BYTES = 2**30  # one chunk's float32 logits on an accelerator device, at most (`positions_per_chunk`)
# On CPU the host's memory is the limit and a laptop's is small: smaller chunks. XLA's
# compiled temporaries of the log-probs' forward + backward for SmolLM2's vocabulary, 64
# rows x 112 positions: 2.63 GiB unchunked, 1.45 GiB in 1 GiB chunks (56 positions), 0.58
# GiB in 256 MiB chunks (19). On an accelerator 1 GiB keeps the 256-position chunks for
# up to 7 rows per device at a 152k vocabulary.
CPU_LOGITS_CHUNK_BYTES = 256 * 2**20


def logits_chunk_bytes(platform: str) -> int:
    """The budget of one chunk's float32 logits per device on `platform` ("cpu", "gpu", "tpu")."""
    return CPU_LOGITS_CHUNK_BYTES if platform == "cpu" else LOGITS_CHUNK_BYTES


def positions_per_chunk(length: int, rows: int, vocab: int, budget: int = LOGITS_CHUNK_BYTES,
                        most: int = DEFAULT_CHUNK_SIZE) -> int | None:
    """The chunk of the log-prob computation over `length` positions: at most `most`
    positions, and fewer where their float32 logits block, rows x chunk x vocab x 4 bytes
    (a device's rows and vocabulary share), would pass `budget` bytes; None when all
    `length` positions fit at once (no chunking).

    The chunk count is the fewest that fit, n = ceil(length / min(most, floor(budget /
    (4 rows vocab)))), and the positions are spread evenly over them, ceil(length / n), so
    padding the last chunk costs less than n positions. E.g. 64 rows x 49,152 vocabulary
    (12 MiB a position) over 112 positions: 85 fit in 1 GiB, so 2 chunks of 56."""
    fit = min(most, max(1, budget // (4 * max(rows, 1) * max(vocab, 1))))
    if fit >= length:
        return None
    return -(-length // -(-length // fit))


def align_next_token(per_position: ArrayLike) -> jax.Array:
    """Shift a per-position quantity of the *next-token* distribution to input_ids alignment.

    per_position[:, t] is about the distribution at position t (which predicts token t + 1);
    the result r has r[:, t] = per_position[:, t - 1] and r[:, 0] = 0.
    """
    x = jnp.asarray(per_position)  # [B, T]
    return jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)


def entropy_from_logits(logits: ArrayLike) -> jax.Array:
    """Entropy of softmax(logits) over the last axis, numerically stable:

        H = logsumexp(z) - sum_v softmax(z)_v z_v

    (verl `torch_functional.entropy_from_logits`). [..., V] -> [...], float32.
    """
    z = jnp.asarray(logits).astype(jnp.float32)  # [..., V]
    lse = jax.nn.logsumexp(z, axis=-1)  # [...]
    return lse - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)


def _target_log_probs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log softmax(logits)[target] over the last axis; float32 logits."""
    lse = jax.nn.logsumexp(logits, axis=-1)  # [...]
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]  # [...]
    return picked - lse


def token_log_probs(logits: ArrayLike, input_ids: ArrayLike, temperature: float = 1.0) -> jax.Array:
    """log p(input_ids[t] | input_ids[<t]) from full logits, aligned: [B, T, V] -> [B, T].

    out[:, t] = log_softmax(logits[:, t - 1] / temperature)[input_ids[:, t]],  out[:, 0] = 0
    """
    z = jnp.asarray(logits)[:, :-1].astype(jnp.float32) / temperature  # [B, T-1, V]
    return jnp.pad(_target_log_probs(z, jnp.asarray(input_ids)[:, 1:]), ((0, 0), (1, 0)))


def token_entropy(logits: ArrayLike, temperature: float = 1.0) -> jax.Array:
    """Entropy of the distribution each token was drawn from, aligned: [B, T, V] -> [B, T]."""
    return align_next_token(entropy_from_logits(jnp.asarray(logits).astype(jnp.float32) / temperature))


def compute_entropy_loss(
    logits: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    *,
    loss_scale_factor: float | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> jax.Array | AggTerms:
    """agg(entropy_from_logits(logits)) (verl `compute_entropy_loss`); `logits` [B, T, V]
    already aligned with `response_mask` (use `token_entropy` for next-token alignment)."""
    terms = agg_loss_terms(entropy_from_logits(logits), response_mask, loss_agg_mode, loss_scale_factor)
    return finish_loss(terms, global_denominator, return_terms)


def _chunk_stats(
    hidden: jax.Array, targets: jax.Array, unembed: jax.Array, temperature: float, compute_entropy: bool
) -> tuple[jax.Array, jax.Array]:
    """Target log-prob and entropy of a block of positions: hidden [..., H] -> ([...], [...])."""
    logits = jnp.dot(hidden, unembed.astype(hidden.dtype), preferred_element_type=jnp.float32)  # [..., V]
    logits = logits / temperature
    log_probs = _target_log_probs(logits, targets)  # [...]
    entropy = entropy_from_logits(logits) if compute_entropy else jnp.zeros_like(log_probs)  # [...]
    return log_probs, entropy


def map_position_chunks(fn, weights, per_position: tuple, chunk_size: int | None):
    """`fn(weights, *per_position)` computed chunk by chunk along the position axis.

    `per_position` are arrays [B, T, ...]; `fn` maps blocks [B, c, ...] of them to a tuple
    of [B, c] float arrays, and the result is those outputs for all T positions. The axis
    is cut into chunks of `chunk_size` positions (every row at once, so a batch sharded
    over devices stays sharded); `lax.map` walks the chunks and `jax.checkpoint` on the
    body makes the backward pass recompute a chunk instead of storing it, so neither pass
    holds more than one chunk's intermediates (e.g. [B, chunk, V] logits) at a time.
    `chunk_size=None` (or >= T) is one block: the unchunked computation.

    `weights` (a pytree, e.g. the unembedding) is closed over as an fp32 view and handed to
    `fn` in its own dtype, so the backward pass accumulates its gradient over chunks in fp32
    rather than in a bf16 carry; in a forward-only program XLA folds the round trip away.
    """
    length = per_position[0].shape[1]
    if chunk_size is None or chunk_size >= length:
        return fn(weights, *per_position)
    n_chunks = -(-length // chunk_size)
    pad = n_chunks * chunk_size - length

    def split(x):  # [B, T, ...] -> [n_chunks, B, chunk, ...]: lax.map walks the (unsharded) chunk axis
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(x.shape[0], n_chunks, chunk_size, *x.shape[2:]).swapaxes(0, 1)

    dtypes = jax.tree.map(lambda w: w.dtype, weights)
    weights_acc = jax.tree.map(lambda w: w.astype(jnp.promote_types(w.dtype, jnp.float32)), weights)
    body = jax.checkpoint(lambda xs: fn(jax.tree.map(lambda w, d: w.astype(d), weights_acc, dtypes), *xs))
    outputs = jax.lax.map(body, tuple(split(x) for x in per_position))  # [n_chunks, B, chunk] each

    def merge(y):  # [n_chunks, B, chunk] -> [B, T]
        return y.swapaxes(0, 1).reshape(y.shape[1], n_chunks * chunk_size)[:, :length]

    return jax.tree.map(merge, outputs)


def log_probs_from_hidden(
    hidden: ArrayLike,
    unembed: ArrayLike,
    input_ids: ArrayLike,
    *,
    temperature: float = 1.0,
    chunk_size: int | None | str = "auto",
    compute_entropy: bool = False,
    chunk_bytes: int = LOGITS_CHUNK_BYTES,
    segment_ids: ArrayLike | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Aligned token log-probs (and entropies) from final hidden states and the unembedding.

        logits[:, t] = hidden[:, t] @ unembed / temperature     (float32 accumulation)
        out[:, t]    = log_softmax(logits[:, t - 1])[input_ids[:, t]],   out[:, 0] = 0

    In packed rows (`segment_ids`) a sequence's first token has no prediction either:
    out = 0 wherever the segment id changes.

    The sequence axis is cut into chunks of `chunk_size` positions (every row at once, so a
    batch sharded over devices stays sharded and all devices work on every step);
    `lax.map` walks the chunks and `jax.checkpoint` on the chunk body makes the backward
    pass recompute a chunk's logits instead of storing them, so neither pass holds more
    than [B, chunk_size, V] float32 logits at a time (instead of [B, T, V]). Values and
    gradients equal the unchunked computation (`chunk_size=None`) up to float rounding;
    the gradient of `unembed` is accumulated over chunks in float32 even for bf16 inputs.

    Args:
        hidden: [B, T, H] final hidden states (after the final norm), any float dtype.
        unembed: [H, V] output projection (the transposed embedding when tied).
        input_ids: [B, T] int token ids.
        temperature: logits are divided by it (as the sampler does).
        chunk_size: sequence positions per chunk; None computes all logits at once; "auto":
            `positions_per_chunk` (at most `DEFAULT_CHUNK_SIZE` positions, all B rows'
            logits within `chunk_bytes`; `rljax.models.Decoder.hidden_log_probs` chooses
            by a device's share under the mesh instead).
        compute_entropy: also return the aligned entropies.
        segment_ids: [B, T] int segment ids of packed rows (`rljax.rl.packing`), or None.

    Returns:
        log_probs [B, T] float32, or (log_probs, entropy) when `compute_entropy`.
    """
    hidden = jnp.asarray(hidden)
    unembed = jnp.asarray(unembed)
    input_ids = jnp.asarray(input_ids)
    # position t predicts token t + 1; the last position's "target" is dropped by the shift
    targets = jnp.roll(input_ids, -1, axis=1)  # [B, T]
    if chunk_size == "auto":
        rows, length = input_ids.shape
        chunk_size = positions_per_chunk(length, rows, unembed.shape[-1], chunk_bytes)
    stats = functools.partial(_chunk_stats, temperature=temperature, compute_entropy=compute_entropy)
    log_probs, entropy = map_position_chunks(  # [B, T] each, about the next token
        lambda w, h, t: stats(h, t, w), unembed, (hidden, targets), chunk_size)
    aligned = align_next_token if segment_ids is None else functools.partial(_align_in_segments, segment_ids)
    log_probs = aligned(log_probs)  # [B, T], about input_ids[:, t]
    if not compute_entropy:
        return log_probs
    return log_probs, aligned(entropy)


def _align_in_segments(segment_ids: ArrayLike, per_position: jax.Array) -> jax.Array:
    """`align_next_token`, and 0 at each segment's first token."""
    ids = jnp.asarray(segment_ids)
    starts = ids != jnp.concatenate([jnp.full_like(ids[:, :1], -1), ids[:, :-1]], axis=1)  # [B, T]
    return jnp.where(starts, 0.0, align_next_token(per_position))


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "CPU_LOGITS_CHUNK_BYTES",
    "LOGITS_CHUNK_BYTES",
    "align_next_token",
    "compute_entropy_loss",
    "entropy_from_logits",
    "log_probs_from_hidden",
    "logits_chunk_bytes",
    "map_position_chunks",
    "positions_per_chunk",
    "token_entropy",
    "token_log_probs",
]
