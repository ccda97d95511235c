"""Preference losses: the DPO family and the Bradley-Terry reward-model loss.

Inputs are per-pair scalars [B] (sequence log-probabilities or rewards). Sequence
log-probabilities come from aligned per-token log-probs (`rljax.algos.log_probs`) summed
over the response mask with `sequence_log_probs`. An optional `pair_mask` [B] (1 = a real
pair) lets bucketed batches carry padding pairs. Losses average over pairs and, like every
loss here, can return `AggTerms(sum over pairs, number of pairs)` for micro-batching.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.aggregation import AggTerms, finish_loss
from rljax.algos.masked import as_float, masked_sum, safe_divide
from rljax.algos.registry import Registry

Metrics = dict[str, jax.Array]

# loss_type -> per-pair loss f(h, beta, label_smoothing), h = the implicit reward margin / beta
DPO_LOSS_REGISTRY = Registry("DPO loss_type")


def sequence_log_probs(token_log_probs: ArrayLike, response_mask: ArrayLike, average: bool = False) -> jax.Array:
    """log pi(y | x) = sum_t m log pi(y_t | ...) per sequence [B, T] -> [B]; the per-token
    mean instead when `average` (IPO's length-normalised log-probability, as TRL)."""
    total = masked_sum(token_log_probs, response_mask, axis=-1)
    if not average:
        return total
    return safe_divide(total, jnp.sum(as_float(response_mask), axis=-1))


@DPO_LOSS_REGISTRY.register("sigmoid")
def dpo_sigmoid_loss(h: jax.Array, beta: float, label_smoothing: float) -> jax.Array:
    """DPO: -log sigma(beta h); with label smoothing eps (conservative DPO):
    -(1 - eps) log sigma(beta h) - eps log sigma(-beta h).
    Rafailov et al. 2023, arXiv:2305.18290; cDPO: Mitchell 2023 (as TRL's `label_smoothing`)."""
    return -(1.0 - label_smoothing) * jax.nn.log_sigmoid(beta * h) - label_smoothing * jax.nn.log_sigmoid(-beta * h)


@DPO_LOSS_REGISTRY.register("ipo")
def dpo_ipo_loss(h: jax.Array, beta: float, label_smoothing: float) -> jax.Array:
    """IPO: (h - 1/(2 beta))^2. Azar et al. 2023, arXiv:2310.12036 (beta plays tau's role;
    the paper and TRL use length-averaged log-probabilities, `sequence_log_probs(average=True)`)."""
    return jnp.square(h - 1.0 / (2.0 * beta))


@DPO_LOSS_REGISTRY.register("hinge")
def dpo_hinge_loss(h: jax.Array, beta: float, label_smoothing: float) -> jax.Array:
    """SLiC hinge: max(0, 1 - beta h). Zhao et al. 2023, arXiv:2305.10425 (as TRL's "hinge")."""
    return jax.nn.relu(1.0 - beta * h)


def _pair_mask(pair_mask: ArrayLike | None, like: jax.Array) -> jax.Array:
    return jnp.ones_like(like) if pair_mask is None else as_float(pair_mask).astype(like.dtype)


def _mean(x: ArrayLike, mask: jax.Array) -> jax.Array:
    return jax.lax.stop_gradient(safe_divide(masked_sum(x, mask), jnp.sum(mask)))


def dpo_loss(
    policy_chosen_logps: ArrayLike,
    policy_rejected_logps: ArrayLike,
    reference_chosen_logps: ArrayLike | None = None,
    reference_rejected_logps: ArrayLike | None = None,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
    reference_free: bool = False,
    pair_mask: ArrayLike | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> tuple[jax.Array | AggTerms, Metrics]:
    """Direct preference optimisation and relatives, averaged over pairs.

        h = (log pi(y_w) - log pi(y_l)) - (log pi_ref(y_w) - log pi_ref(y_l))
        loss_i = DPO_LOSS_REGISTRY[loss_type](h, beta, label_smoothing)

    With `reference_free=True` the reference terms are 0 (the reference is uniform), and the
    reference log-probs may be omitted. Implicit rewards: r_w = beta (log pi(y_w) -
    log pi_ref(y_w)), r_l likewise. Metrics (TRL's names): rewards/chosen, rewards/rejected,
    rewards/margins (r_w - r_l), rewards/accuracies (fraction with r_w > r_l),
    logps/chosen, logps/rejected. Source: Rafailov et al. 2023, arXiv:2305.18290; TRL
    `DPOTrainer.dpo_loss`.
    """
    chosen = as_float(policy_chosen_logps).astype(jnp.float32)
    rejected = as_float(policy_rejected_logps).astype(jnp.float32)
    if reference_free:
        ref_chosen = ref_rejected = jnp.zeros_like(chosen)
    else:
        if reference_chosen_logps is None or reference_rejected_logps is None:
            raise ValueError("dpo_loss needs reference log-probs unless reference_free=True")
        ref_chosen = as_float(reference_chosen_logps).astype(jnp.float32)
        ref_rejected = as_float(reference_rejected_logps).astype(jnp.float32)
    loss_fn: Callable[..., jax.Array] = DPO_LOSS_REGISTRY.get_fn(loss_type)

    h = (chosen - rejected) - (ref_chosen - ref_rejected)
    losses = loss_fn(h, beta, label_smoothing)
    mask = _pair_mask(pair_mask, losses)
    terms = AggTerms(masked_sum(losses, mask), jnp.sum(mask))
    out = finish_loss(terms, global_denominator, return_terms)

    chosen_rewards = beta * jax.lax.stop_gradient(chosen - ref_chosen)
    rejected_rewards = beta * jax.lax.stop_gradient(rejected - ref_rejected)
    metrics = {
        "rewards/chosen": _mean(chosen_rewards, mask),
        "rewards/rejected": _mean(rejected_rewards, mask),
        "rewards/margins": _mean(chosen_rewards - rejected_rewards, mask),
        "rewards/accuracies": _mean(chosen_rewards > rejected_rewards, mask),
        "logps/chosen": _mean(chosen, mask),
        "logps/rejected": _mean(rejected, mask),
    }
    return out, metrics


def bradley_terry_loss(
    chosen_rewards: ArrayLike,
    rejected_rewards: ArrayLike,
    margin: ArrayLike | None = None,
    *,
    pair_mask: ArrayLike | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> tuple[jax.Array | AggTerms, Metrics]:
    """Bradley-Terry reward-model loss, averaged over pairs:

        loss_i = -log sigma(r_w - r_l - margin_i)        (margin 0 when None)

    Sources: Bradley & Terry 1952; Ouyang et al. 2022 (InstructGPT), arXiv:2203.02155;
    margin as in Llama 2 (Touvron et al. 2023, arXiv:2307.09288). Metrics: rm/loss,
    rm/accuracy (fraction with r_w > r_l), rm/chosen_reward, rm/rejected_reward, rm/margin.
    """
    chosen = as_float(chosen_rewards).astype(jnp.float32)
    rejected = as_float(rejected_rewards).astype(jnp.float32)
    diff = chosen - rejected
    if margin is not None:
        diff = diff - as_float(margin).astype(jnp.float32)
    losses = -jax.nn.log_sigmoid(diff)
    mask = _pair_mask(pair_mask, losses)
    terms = AggTerms(masked_sum(losses, mask), jnp.sum(mask))
    out = finish_loss(terms, global_denominator, return_terms)
    metrics = {
        "rm/loss": jax.lax.stop_gradient(terms.value if return_terms else out),
        "rm/accuracy": _mean(chosen > rejected, mask),
        "rm/chosen_reward": _mean(chosen, mask),
        "rm/rejected_reward": _mean(rejected, mask),
        "rm/margin": _mean(chosen - rejected, mask),
    }
    return out, metrics


__all__ = [
    "DPO_LOSS_REGISTRY",
    "bradley_terry_loss",
    "dpo_hinge_loss",
    "dpo_ipo_loss",
    "dpo_loss",
    "dpo_sigmoid_loss",
    "sequence_log_probs",
]
