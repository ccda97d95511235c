"""Perplexity of reference answers from aligned token log-probs (pure, jittable).

With ``log_probs[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`` and a 0/1
``mask`` selecting the reference-answer tokens::

    nll_b     = -sum_t mask[b, t] * log_probs[b, t]       tokens_b = sum_t mask[b, t]
    ppl_b     = exp(nll_b / tokens_b)                       (NaN for a row with no tokens)
    ppl_corpus = exp(sum_b nll_b / sum_b tokens_b)          (token-mean NLL over the corpus)

The corpus value is a token mean, not a mean of per-sequence perplexities. Over several
batches, add up `nll_sums` and call `perplexity_from_sums`.
"""

from __future__ import annotations

import jax.numpy as jnp


def nll_sums(log_probs, mask) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Per-sequence summed NLL and token count, float32 ``[B]`` each."""
    mask = jnp.asarray(mask, jnp.float32)
    log_probs = jnp.asarray(log_probs, jnp.float32)
    if log_probs.shape != mask.shape:
        raise ValueError(f"log_probs {log_probs.shape} and mask {mask.shape} differ in shape")
    nll = -jnp.sum(jnp.where(mask > 0, log_probs, 0.0) * mask, axis=-1)
    return nll, jnp.sum(mask, axis=-1)


def perplexity_from_sums(nll_sum, num_tokens) -> jnp.ndarray:
    """``exp(sum(nll_sum) / sum(num_tokens))`` (NaN when there are no tokens)."""
    total = jnp.sum(jnp.asarray(num_tokens, jnp.float32))
    return jnp.exp(jnp.sum(jnp.asarray(nll_sum, jnp.float32)) / jnp.where(total > 0, total, jnp.nan))


def perplexity(log_probs, mask) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(per-sequence perplexity ``[B]``, corpus perplexity ``[]``) — see the module docstring."""
    nll, tokens = nll_sums(log_probs, mask)
    per_sequence = jnp.exp(nll / jnp.where(tokens > 0, tokens, jnp.nan))
    return per_sequence, perplexity_from_sums(nll, tokens)
