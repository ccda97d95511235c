"""Choosing the next token from logits: pure, jittable functions of per-row arrays.

Per row: temperature (0 = greedy), top_k (<= 0: off), top_p (1: off), min_p (0: off),
and the (seed, stream, sample index, position) its random key is derived from, so a
row's token depends on its own logits and key only, never on the rest of the batch.

The key of one sampled token is

    fold_in(fold_in(fold_in(fold_in(fold_in(key(seed), stream_hi), stream_lo), sample_index), position)

with `stream` a 64-bit request id unique within a run (`SamplingParams.stream`: the RL
loop numbers its requests by (step, prompt)), `sample_index` which of the request's n
samples, and `position` the absolute position of the token being sampled in its
sequence (prompt included). Distinct requests, samples and positions draw independent
noise; an agent episode's later turns (one request stream, longer prompts) sample at
later positions, so they continue its stream instead of repeating it; and a token's
noise depends on nothing the scheduler decides (batching, preemption, replica).

The reported log_prob of a sampled token is log_softmax(logits / temperature)[token] on
the full vocabulary, before top-k / top-p / min-p filtering (as the trainer computes
it); greedy rows report log_softmax(logits)[token].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def row_keys(seeds: jax.Array, streams: jax.Array, sample_index: jax.Array, positions: jax.Array) -> jax.Array:
    """One PRNG key per row from `seeds` `[B]` uint32, `streams` `[B, 2]` uint32 (the
    request id's high and low 32 bits), `sample_index` `[B]` and `positions` `[B]` (the
    absolute position of the token being sampled); see the module docstring."""

    def one(seed, stream, idx, position):
        key = jax.random.key(seed)
        key = jax.random.fold_in(jax.random.fold_in(key, stream[0]), stream[1])
        return jax.random.fold_in(jax.random.fold_in(key, idx), position)

    return jax.vmap(one)(seeds, streams, sample_index, positions)


def filter_logits(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array) -> jax.Array:
    """Set to -inf the logits a row's top-k, then top-p (on the top-k renormalised
    distribution), then min-p would drop. `scaled` `[B, V]` is already divided by the
    temperature. A token tied with the last kept one is kept too."""
    vocab = scaled.shape[-1]
    sorted_desc = -jnp.sort(-scaled, axis=-1)
    ranks = jnp.arange(vocab)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    keep = ranks < k[:, None]
    probs = jax.nn.softmax(jnp.where(keep, sorted_desc, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = keep & (mass_before < top_p[:, None])  # the first token is always kept
    n_keep = jnp.maximum(keep.sum(axis=-1), 1)
    threshold = jnp.take_along_axis(sorted_desc, (n_keep - 1)[:, None], axis=-1)[:, 0]
    min_p_floor = jnp.where(min_p > 0, sorted_desc[:, 0] + jnp.log(jnp.maximum(min_p, 1e-30)), -jnp.inf)
    threshold = jnp.maximum(threshold, min_p_floor)
    return jnp.where(scaled >= threshold[:, None], scaled, -jnp.inf)


def sample_tokens(
    logits: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    min_p: jax.Array,
    seeds: jax.Array,
    streams: jax.Array,
    sample_index: jax.Array,
    positions: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Sample one token per row of float32 `logits` `[B, V]`; returns (tokens `[B]`
    int32, log_probs `[B]` float32). Sampling is Gumbel-max on the filtered,
    temperature-scaled logits, which draws from their softmax."""
    greedy = temperature <= 0.0
    t = jnp.where(greedy, 1.0, temperature)
    scaled = logits / t[:, None]
    logp = jax.nn.log_softmax(scaled, axis=-1)
    greedy_tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def draw() -> jax.Array:
        needs_filter = ~greedy & ((top_k > 0) | (top_p < 1.0) | (min_p > 0.0))
        filtered = jax.lax.cond(
            needs_filter.any(), lambda: filter_logits(scaled, top_k, top_p, min_p), lambda: scaled
        )
        keys = row_keys(seeds, streams, sample_index, positions)
        gumbel = jax.vmap(lambda key: jax.random.gumbel(key, scaled.shape[-1:], jnp.float32))(keys)
        sampled = jnp.argmax(filtered + gumbel, axis=-1).astype(jnp.int32)
        return jnp.where(greedy, greedy_tokens, sampled)

    tokens = jax.lax.cond(greedy.all(), lambda: greedy_tokens, draw)
    log_probs = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, log_probs
