"""Actor and critic objectives for the shared train step (`rljax.train.steps`).

Actor loss (verl's `dp_actor.update_policy`):

    L = pg_loss(loss_mode)  +  kl_loss_coef * kl_loss  (use_kl_loss)  -  entropy_coeff * entropy

Each term is aggregated with its own global denominator over the whole mini-batch (the
step's `totals`, computed once from the masks), so splitting into micro-batches and
devices changes nothing. The step computes sum(numerator) / sum(denominator) over
micro-batches; this objective returns numerator = R * (its share of L) and denominator =
its row count (R = rows in the mini-batch), so that ratio is exactly L.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rljax.algos.aggregation import AggTerms, agg_denominator, agg_loss_terms
from rljax.algos.kl import kl_penalty
from rljax.algos.logprobs import log_probs_from_hidden
from rljax.algos.masked import masked_mean
from rljax.algos.policy_loss import PolicyLossConfig, compute_policy_loss
from rljax.algos.rollout_correction import compute_rollout_correction_weights
from rljax.algos.value import compute_value_loss
from rljax.rl.config import ActorConfig, CriticConfig


def policy_loss_config(actor: ActorConfig) -> PolicyLossConfig:
    p = actor.policy_loss
    return PolicyLossConfig(
        clip_ratio=actor.clip_ratio, clip_ratio_low=actor.clip_ratio_low, clip_ratio_high=actor.clip_ratio_high,
        clip_ratio_c=actor.clip_ratio_c, loss_scale_factor=actor.loss_scale_factor,
        clip_cov_ratio=p.clip_cov_ratio, clip_cov_lb=p.clip_cov_lb, clip_cov_ub=p.clip_cov_ub,
        kl_cov_ratio=p.kl_cov_ratio, ppo_kl_coef=p.ppo_kl_coef,
    )


def sequence_model_log_probs(model, batch, temperature: float, entropy: bool):
    hidden = model.hidden_states(batch["input_ids"], attention_mask=batch["attention_mask"])
    return log_probs_from_hidden(hidden, model.unembedding(), batch["input_ids"],
                                 temperature=temperature, compute_entropy=entropy)


def actor_objective(actor: ActorConfig, temperature: float) -> tuple[Callable, Callable]:
    """-> (objective, totals_fn) for `make_train_step`."""
    mode = actor.loss_agg_mode
    loss_mode = actor.policy_loss.loss_mode
    config = policy_loss_config(actor)

    def is_weights(batch):
        if actor.tis_imp_ratio_cap is None:
            return None, {}
        log_ratio = batch["old_log_probs"] - batch["rollout_log_probs"]
        weights, _, metrics = compute_rollout_correction_weights(
            log_ratio, batch["response_mask"], "token", actor.tis_imp_ratio_cap)
        return weights, {f"rollout_corr/{k}": v for k, v in metrics.items()}

    def totals(batch):
        """Global denominators: they depend on masks (and advantages) only, so evaluating
        the loss at log pi = log pi_old reads them off without a model."""
        old = batch["old_log_probs"]
        pg, _ = compute_policy_loss(loss_mode, old, old, batch["advantages"], batch["response_mask"], mode, config,
                                    is_weights(batch)[0], key=jax.random.key(0), return_terms=True)
        return {
            "pg": pg.denominator,
            "agg": agg_denominator(batch["response_mask"], mode),
            "rows": jnp.asarray(batch["input_ids"].shape[0], jnp.float32),
        }

    def objective(model, batch, frozen, totals):
        mask = batch["response_mask"]
        log_prob, entropy = sequence_model_log_probs(model, batch, temperature, entropy=True)
        weights, metrics = is_weights(batch)
        pg, pg_metrics = compute_policy_loss(
            loss_mode, batch["old_log_probs"], log_prob, batch["advantages"], mask, mode, config, weights,
            key=jax.random.key(0), global_denominator=totals["pg"])
        metrics.update(pg_metrics)
        entropy_terms = agg_loss_terms(entropy, mask, mode, actor.loss_scale_factor)
        entropy_loss = entropy_terms.numerator / totals["agg"]
        loss = pg - actor.entropy_coeff * entropy_loss
        metrics["actor/entropy"] = jax.lax.stop_gradient(masked_mean(entropy, mask))
        if actor.use_kl_loss:
            kld = kl_penalty(log_prob, batch["ref_log_probs"], actor.kl_loss_type)
            kl_loss = agg_loss_terms(kld, mask, mode, actor.loss_scale_factor).numerator / totals["agg"]
            loss = loss + actor.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = jax.lax.stop_gradient(masked_mean(kld, mask))
            metrics["actor/kl_coef"] = jnp.asarray(actor.kl_loss_coef, jnp.float32)
        rows = jnp.asarray(batch["input_ids"].shape[0], jnp.float32)
        metrics["actor/pg_loss"] = jax.lax.stop_gradient(pg * totals["rows"] / rows)
        return AggTerms(loss * totals["rows"], rows), metrics

    return objective, totals


def critic_objective(critic: CriticConfig) -> Callable:
    """Clipped value loss on a `ScalarHeadModel`; values are aligned with input_ids (the
    value of token t is read from the hidden state that predicts it, position t-1). One
    term, so its own (numerator, denominator) is already micro-batch exact."""

    def objective(model, batch, frozen, totals):
        vpreds = aligned_values(model, batch)
        terms, metrics = compute_value_loss(vpreds, batch["returns"], batch["values"], batch["response_mask"],
                                            critic.cliprange_value, critic.loss_agg_mode, return_terms=True)
        metrics["critic/vpred_mean"] = jax.lax.stop_gradient(masked_mean(vpreds, batch["response_mask"]))
        return terms, metrics

    return objective


def aligned_values(model, batch) -> jax.Array:
    values = model.token_values(batch["input_ids"], attention_mask=batch["attention_mask"])
    return jnp.pad(values[:, :-1], ((0, 0), (1, 0)))
