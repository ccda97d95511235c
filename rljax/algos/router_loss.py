"""The mixture-of-experts auxiliary load-balancing loss.

Switch Transformer (Fedus et al. 2021, arXiv:2101.03961, eqs. 4-6), in the top-k form
Mixtral and Qwen3-MoE train with (transformers' `load_balancing_loss_func`): over the N
valid (layer, token) rows of every MoE layer, pooled,

    f_e = (1 / N) * #{(l, t, j): expert_j(l, t) = e}     (top-k assignments; sum_e f_e = k)
    P_e = (1 / N) * sum_{l, t} p_e(l, t)                 (mean router probability)
    L_aux = X * sum_e f_e * P_e

X experts. Minimal (= k) when both are uniform. The gradient flows through P only (f
counts discrete choices). The decoder gathers the per-layer sums in its scan
(`rljax.models.moe.Routing`: counts and prob_sum `[L, X]`), so no `[L, B, T, X]` array
of router probabilities is kept for this loss.

Router logits never enter the KL: the KL terms (`rljax.algos.kl`) read token
log-probabilities only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def load_balancing_loss(counts: jax.Array, prob_sum: jax.Array, num_rows: jax.Array) -> jax.Array:
    """L_aux from per-layer sums: `counts` `[L, X]` (top-k assignments per expert),
    `prob_sum` `[L, X]` (router probabilities summed over tokens), `num_rows` N = valid
    tokens x L. Float32 scalar."""
    num_experts = counts.shape[-1]
    n = jnp.maximum(jnp.asarray(num_rows, jnp.float32), 1.0)
    f = jnp.sum(counts, axis=0) / n  # [X]
    p = jnp.sum(prob_sum, axis=0) / n  # [X]
    return num_experts * jnp.sum(f * p)


def load_balancing_loss_from_logits(router_logits: jax.Array, top_k: int, mask: jax.Array | None = None) -> jax.Array:
    """L_aux from router logits `[L, B, T, X]` and a 0/1 `mask` `[B, T]` (None: all
    tokens): the module's formula written directly (softmax, top-k, pooled means)."""
    num_layers, num_experts = router_logits.shape[0], router_logits.shape[-1]
    mask = jnp.ones(router_logits.shape[1:3], jnp.float32) if mask is None else mask.astype(jnp.float32)
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)  # [L, B, T, X]
    _, chosen = jax.lax.top_k(probs, top_k)  # [L, B, T, k]
    assigned = jnp.sum(jax.nn.one_hot(chosen, num_experts), axis=-2)  # [L, B, T, X]
    counts = jnp.einsum("lbtx,bt->lx", assigned, mask)  # [L, X]
    prob_sum = jnp.einsum("lbtx,bt->lx", probs, mask)  # [L, X]
    return load_balancing_loss(counts, prob_sum, num_layers * jnp.sum(mask))
