"""Policy-gradient losses of RL post-training, registered by name (verl's `loss_mode`).

Every loss has verl's signature

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
       rollout_is_weights=None, *, key=None, global_denominator=None, return_terms=False)
       -> (pg_loss, metrics)

where all arrays are [B, T] and aligned with `input_ids` (entry t is about token t, see
`rljax.algos.logprobs.token_log_probs`), `config` is any object or mapping with verl's
actor fields (`clip_ratio`, `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`,
`loss_scale_factor`, and `policy_loss.clip_cov_ratio` etc.; `PolicyLossConfig` is a
ready-made one, and it is the default), `rollout_is_weights` are per-token importance
weights (rollout correction) multiplied into the per-token loss as constants.

With `return_terms=True` the first result is an `AggTerms(numerator, denominator)` instead
of the scalar (see `rljax.algos.aggregation` for the micro-batch protocol); with
`global_denominator=D` it is numerator / D. Metrics are jnp scalars named as in verl
(`actor/pg_loss`, `actor/pg_clipfrac`, `actor/pg_clipfrac_lower`, `actor/ppo_kl`); they
are means over this (micro-)batch. `loss_agg_mode` and `config` are static (Python values).

Log-ratios log pi - log pi_old are clamped to [-20, 20] before `exp` where verl does so
(vanilla, CISPO); GSPO clamps its sequence log-ratio at 10, as verl.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.aggregation import AggTerms, agg_loss_terms, finish_loss
from rljax.algos.masked import as_float, masked_mean, masked_sum
from rljax.algos.registry import get_policy_loss_fn, register_policy_loss

Metrics = dict[str, jax.Array]
LossOut = tuple[jax.Array | AggTerms, Metrics]

LOG_RATIO_CLAMP = 20.0  # verl clamps negative_approx_kl to [-20, 20] before exp


@dataclass(frozen=True)
class PolicyLossConfig:
    """The knobs of the policy losses, with verl's defaults (`actor` and `actor.policy_loss`)."""

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None  # None: clip_ratio
    clip_ratio_high: float | None = None  # None: clip_ratio
    clip_ratio_c: float = 3.0  # dual-clip lower bound (Ye et al. 2020, arXiv:1912.09729)
    loss_scale_factor: float | None = None  # C of "seq-mean-token-sum-norm"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 1.0


def _lookup(source: Any, name: str) -> Any:
    if source is None:
        return None
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def config_value(config: Any, name: str, default: Any = None) -> Any:
    """`config.name`, else `config.policy_loss.name` (verl nests some keys), else `default`,
    else the `PolicyLossConfig` default. A `None` value counts as unset."""
    config = PolicyLossConfig() if config is None else config
    for source in (config, _lookup(config, "policy_loss")):
        value = _lookup(source, name)
        if value is not None:
            return value
    return getattr(PolicyLossConfig, name, default) if default is None else default


def clip_ratios(config: Any) -> tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high), each defaulting to `clip_ratio` (verl)."""
    clip_ratio = config_value(config, "clip_ratio")
    low = config_value(config, "clip_ratio_low")
    high = config_value(config, "clip_ratio_high")
    return (clip_ratio if low is None else low), (clip_ratio if high is None else high)


def _arrays(*xs: ArrayLike) -> list[jax.Array]:
    return [as_float(x) for x in xs]


def _finish(
    pg_losses: jax.Array,
    response_mask: ArrayLike,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: ArrayLike | None,
    global_denominator: ArrayLike | None,
    return_terms: bool,
    metrics: Metrics,
) -> LossOut:
    """Weight by rollout IS weights, aggregate, and record `actor/pg_loss`."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * jax.lax.stop_gradient(as_float(rollout_is_weights))
    terms = agg_loss_terms(
        pg_losses, response_mask, loss_agg_mode, loss_scale_factor=config_value(config, "loss_scale_factor")
    )
    out = finish_loss(terms, global_denominator, return_terms)
    metrics["actor/pg_loss"] = jax.lax.stop_gradient(terms.value if return_terms else out)
    return out, metrics


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: ArrayLike | None = None,
    *,
    key: jax.Array | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> LossOut:
    """PPO clipped surrogate with asymmetric clipping and dual-clip.

        r     = exp(clamp(log pi - log pi_old, -20, 20))
        L1    = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        L     = min(L1, -A clip_ratio_c)   if A < 0   (dual-clip)
                L1                         otherwise

    Sources: PPO (Schulman et al. 2017, arXiv:1707.06347); asymmetric "clip-higher"
    (DAPO, arXiv:2503.14476); dual-clip (Ye et al. 2020, arXiv:1912.09729); verl
    `compute_policy_loss_vanilla`. Metrics: pg_clipfrac = fraction of tokens where the
    clipped term is the larger; pg_clipfrac_lower = fraction where the dual clip binds;
    ppo_kl = mean(log pi_old - log pi).
    """
    old_log_prob, log_prob, advantages = _arrays(old_log_prob, log_prob, advantages)
    clip_low, clip_high = clip_ratios(config)
    clip_ratio_c = config_value(config, "clip_ratio_c")
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_ratio_c}")

    negative_approx_kl = jnp.clip(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_pg_losses1 = jnp.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = jnp.minimum(pg_losses3, clip_pg_losses1)
    pg_losses = jnp.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    sg = jax.lax.stop_gradient
    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(pg_losses2 > pg_losses1, response_mask)),
        "actor/pg_clipfrac_lower": sg(masked_mean((clip_pg_losses1 > pg_losses3) & (advantages < 0), response_mask)),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, response_mask)),
    }
    return _finish(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_denominator, return_terms, metrics
    )


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: ArrayLike | None = None,
    *,
    key: jax.Array | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> LossOut:
    """GSPO: clipped surrogate on the length-normalised *sequence* ratio (GSPO-token form).

        log s_i   = (1/|y_i|) sum_t m (log pi - log pi_old)              (sequence ratio)
        log s_i,t = sg(log s_i) + log pi_t - sg(log pi_t)    (clamped at 10)
        L_i,t     = max(-A s_i,t, -A clip(s_i,t, 1 - clip_ratio_low, 1 + clip_ratio_high))

    The value of s_i,t is s_i; its gradient is s_i * grad log pi_t. Aggregated with
    "seq-mean-token-mean" whatever `loss_agg_mode` says, as the paper's objective and verl
    do (the returned terms carry that mode's denominator). Sources: Zheng et al. 2025,
    "Group Sequence Policy Optimization", arXiv:2507.18071; verl `compute_policy_loss_gspo`.
    """
    old_log_prob, log_prob, advantages = _arrays(old_log_prob, log_prob, advantages)
    clip_low, clip_high = clip_ratios(config)
    sg = jax.lax.stop_gradient

    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = jnp.maximum(jnp.sum(as_float(response_mask), axis=-1), 1.0)
    negative_approx_kl_seq = masked_sum(negative_approx_kl, response_mask, axis=-1) / seq_lengths
    log_seq_ratio = log_prob - sg(log_prob) + sg(negative_approx_kl_seq)[:, None]
    seq_importance_ratio = jnp.exp(jnp.minimum(log_seq_ratio, 10.0))

    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * jnp.clip(seq_importance_ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_losses = jnp.maximum(pg_losses1, pg_losses2)
    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(pg_losses2 > pg_losses1, response_mask)),
        "actor/pg_clipfrac_lower": jnp.zeros((), jnp.float32),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, response_mask)),
    }
    return _finish(
        pg_losses,
        response_mask,
        "seq-mean-token-mean",
        config,
        rollout_is_weights,
        global_denominator,
        return_terms,
        metrics,
    )


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: ArrayLike | None = None,
    *,
    key: jax.Array | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> LossOut:
    """GPG: plain policy gradient, no ratio and no clipping:  L = -A log pi.

    Source: Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning", arXiv:2504.02546; verl `compute_policy_loss_gpg`. (Its advantage,
    with the batch-level correction alpha, is the "gpg" advantage estimator.)
    """
    log_prob, advantages = _arrays(log_prob, advantages)
    pg_losses = -log_prob * advantages
    return _finish(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_denominator, return_terms, {}
    )


@register_policy_loss("reinforce")
def compute_policy_loss_reinforce(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: ArrayLike | None = None,
    *,
    key: jax.Array | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> LossOut:
    """REINFORCE:  L = -w A log pi, with w the (constant) rollout IS weight when given.

    `old_log_prob` (the behaviour / rollout policy) only feeds the `actor/ppo_kl` metric.
    Source: Williams 1992; verl `compute_policy_loss_reinforce` (its default aggregation
    "seq-mean-token-sum" is kept as this function's default).
    """
    old_log_prob, log_prob, advantages = _arrays(old_log_prob, log_prob, advantages)
    pg_losses = -advantages * log_prob
    metrics = {"actor/ppo_kl": jax.lax.stop_gradient(masked_mean(old_log_prob - log_prob, response_mask))}
    return _finish(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_denominator, return_terms, metrics
    )


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: ArrayLike | None = None,
    *,
    key: jax.Array | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> LossOut:
    """CISPO: clipped, stop-gradient importance weight times the log-probability.

        r = exp(clamp(log pi - log pi_old, -20, 20))
        L = -sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) A log pi

    Every token keeps a gradient (only the weight is clipped). Source: MiniMax-M1 report
    (arXiv:2506.13585); verl `compute_policy_loss_cispo`. pg_clipfrac = fraction of tokens
    whose weight was clipped.
    """
    old_log_prob, log_prob, advantages = _arrays(old_log_prob, log_prob, advantages)
    clip_low, clip_high = clip_ratios(config)
    sg = jax.lax.stop_gradient
    negative_approx_kl = jnp.clip(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(negative_approx_kl)
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_losses = -sg(clipped_ratio) * advantages * log_prob
    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(ratio != clipped_ratio, response_mask)),
        "actor/pg_clipfrac_lower": jnp.zeros((), jnp.float32),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, response_mask)),
    }
    return _finish(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_denominator, return_terms, metrics
    )


def _rank_descending(priority: jax.Array) -> jax.Array:
    """rank[i] = position of priority[i] in a descending sort (0 = largest), any shape."""
    flat = priority.reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    ranks = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
    return ranks.reshape(priority.shape)


def _select_top(candidates: jax.Array, priority: jax.Array, k: jax.Array) -> jax.Array:
    """A bool mask of the (at most) k candidates of highest priority; static shapes."""
    ranked = _rank_descending(jnp.where(candidates, priority, -jnp.inf))
    return candidates & (ranked < k)


def _count_fraction(n: jax.Array, fraction: float) -> jax.Array:
    """max(floor(n * fraction), 1), as verl's `max(int(n * ratio), 1)` (1e-6 absorbs fp32 rounding)."""
    return jnp.maximum(jnp.floor(n * fraction + 1e-6), 1.0)


def _centered_product(advantages: jax.Array, log_prob: jax.Array, mask: jax.Array) -> jax.Array:
    """(A - mean_m A)(log pi - mean_m log pi): the per-token covariance term (no gradient)."""
    log_prob = jax.lax.stop_gradient(log_prob)
    advantages = jax.lax.stop_gradient(advantages)
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: ArrayLike | None = None,
    *,
    key: jax.Array | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> LossOut:
    """Clip-Cov: PPO clip, plus detaching the gradient of a few high-covariance tokens.

        cov_t = (A_t - mean A)(log pi_t - mean log pi)           (masked means, no gradient)
        candidates: unmasked, not already clipped by PPO, clip_cov_lb < cov_t < clip_cov_ub
        n_sel = max(floor(clip_cov_ratio * #unmasked tokens), 1) of the candidates get
                corr = 0, all others corr = 1
        L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) * corr

    Selection: with a PRNG `key`, n_sel candidates chosen uniformly at random, as verl (which
    uses a random permutation); with `key=None`, deterministically the n_sel candidates of
    largest cov_t. No log-ratio clamp, as verl. The means and n_sel are statistics of the
    batch passed in, so with micro-batching the selection is per micro-batch (as in verl) and
    the loss is not exactly additive over micro-batches. Source: Cui et al. 2025, "The Entropy
    Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617;
    verl `compute_policy_loss_clip_cov`. pg_clipfrac = fraction of tokens with corr = 0.
    """
    old_log_prob, log_prob, advantages = _arrays(old_log_prob, log_prob, advantages)
    clip_low, clip_high = clip_ratios(config)
    clip_cov_ratio = config_value(config, "clip_cov_ratio")
    clip_cov_lb = config_value(config, "clip_cov_lb")
    clip_cov_ub = config_value(config, "clip_cov_ub")
    if not clip_cov_ratio > 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    sg = jax.lax.stop_gradient
    valid = jnp.asarray(response_mask) > 0

    negative_approx_kl = log_prob - old_log_prob
    ratio = jnp.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & valid

    cov = _centered_product(advantages, log_prob, response_mask)
    candidates = valid & ~clip_by_origin & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    n_select = _count_fraction(jnp.sum(valid), clip_cov_ratio)
    priority = cov if key is None else jax.random.uniform(key, cov.shape)
    detached = _select_top(candidates, priority, n_select)
    corr = 1.0 - detached.astype(pg_losses1.dtype)

    pg_losses = jnp.maximum(pg_losses1, pg_losses2) * corr
    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(detached, response_mask)),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, response_mask)),
    }
    return _finish(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_denominator, return_terms, metrics
    )


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: ArrayLike | None = None,
    *,
    key: jax.Array | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> LossOut:
    """KL-Cov: unclipped surrogate, plus a |log-ratio| penalty on the top-covariance tokens.

        cov_t = (A_t - mean A)(log pi_t - mean log pi)           (masked means, no gradient)
        top   = the max(floor(kl_cov_ratio * #unmasked tokens), 1) unmasked tokens of largest cov_t
        L     = -A r + ppo_kl_coef |log pi - log pi_old|   on top tokens
                -A r                                       elsewhere

    Selection is deterministic top-k, as verl (`key` is ignored), over the batch passed in
    (per micro-batch, as verl; not exactly additive over micro-batches). No log-ratio clamp, as
    verl. Source: Cui et al. 2025, arXiv:2505.22617; verl `compute_policy_loss_kl_cov`.
    Metric actor/ppo_kl is mean |log pi - log pi_old|, as verl.
    """
    old_log_prob, log_prob, advantages = _arrays(old_log_prob, log_prob, advantages)
    kl_cov_ratio = config_value(config, "kl_cov_ratio")
    ppo_kl_coef = config_value(config, "ppo_kl_coef")
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    valid = jnp.asarray(response_mask) > 0

    negative_approx_kl = log_prob - old_log_prob
    abs_kl = jnp.abs(negative_approx_kl)
    ratio = jnp.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = pg_losses1 + ppo_kl_coef * abs_kl

    cov = _centered_product(advantages, log_prob, response_mask)
    top = _select_top(valid, cov, _count_fraction(jnp.sum(valid), kl_cov_ratio))
    pg_losses = jnp.where(top, pg_losses_kl, pg_losses1)
    metrics = {"actor/ppo_kl": jax.lax.stop_gradient(masked_mean(abs_kl, response_mask))}
    return _finish(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_denominator, return_terms, metrics
    )


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: ArrayLike | None = None,
    *,
    key: jax.Array | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> LossOut:
    """GMPO: clipped *geometric mean* of token ratios, one loss per sequence.

        d_t   = log pi_t - log pi_old,t
        c_t   = sign(A) min(sign(A) d_t, sign(A) clip(d_t, -clip_ratio_low, clip_ratio_high))
        rho_i = exp( sum_t m c_t / (sum_t m + 1e-8) )          (clipped geometric-mean ratio)
        A_i   = sum_t m A_t / (sum_t m + 1e-8)                  (sequence advantage)
        L_i   = -A_i rho_i  [* geometric mean of rollout_is_weights over the sequence]
        loss  = mean over sequences with a nonzero mask

    `loss_agg_mode` is ignored (the loss is per sequence), as in verl. The clip bounds act on
    the log-ratio. verl averages over all B rows; rows with an empty mask have L_i = 0 and
    are left out of the count here, as in every "seq-mean" mode. Source: Zhao et al. 2025,
    "Geometric-Mean Policy Optimization", arXiv:2507.20673; verl `compute_policy_loss_geo_mean`.
    """
    old_log_prob, log_prob, advantages = _arrays(old_log_prob, log_prob, advantages)
    clip_low, clip_high = clip_ratios(config)
    sg = jax.lax.stop_gradient
    mask = as_float(response_mask)

    negative_approx_kl = log_prob - old_log_prob
    sign = jnp.sign(advantages)
    negative_approx_kl_clamp = jnp.clip(negative_approx_kl, -clip_low, clip_high)
    negative_approx_kl_min = sign * jnp.minimum(sign * negative_approx_kl, sign * negative_approx_kl_clamp)

    lengths = jnp.sum(mask, axis=-1)
    seq_ratio = jnp.exp(masked_sum(negative_approx_kl_min, mask, axis=-1) / (lengths + 1e-8))
    seq_advantage = masked_sum(advantages, mask, axis=-1) / (lengths + 1e-8)
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        log_w = jnp.log(sg(as_float(rollout_is_weights)) + 1e-10)
        seq_losses = seq_losses * jnp.exp(masked_sum(log_w, mask, axis=-1) / (lengths + 1e-8))

    seq_valid = (lengths > 0).astype(seq_losses.dtype)
    terms = AggTerms(jnp.sum(seq_losses * seq_valid), jnp.sum(seq_valid))
    out = finish_loss(terms, global_denominator, return_terms)
    clipped = negative_approx_kl != negative_approx_kl_clamp
    metrics = {
        "actor/pg_loss": sg(terms.value if return_terms else out),
        "actor/pg_clipfrac": sg(masked_mean(clipped & (advantages > 0), mask)),
        "actor/pg_clipfrac_lower": sg(masked_mean(clipped & (advantages < 0), mask)),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, mask)),
    }
    return out, metrics


def compute_policy_loss(loss_mode: str, *args: Any, **kwargs: Any) -> LossOut:
    """Dispatch to the policy loss registered as `loss_mode` (e.g. "vanilla", "gspo")."""
    return get_policy_loss_fn(loss_mode)(*args, **kwargs)


__all__ = [
    "PolicyLossConfig",
    "clip_ratios",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_vanilla",
    "config_value",
]
