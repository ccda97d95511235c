"""Actor and critic objectives for the shared train step (`rljax.train.steps`).

Actor loss (verl's `dp_actor.update_policy`):

    L = pg_loss(loss_mode)  +  kl_loss_coef * kl_loss  (use_kl_loss)  -  entropy_coeff * entropy
        +  router_aux_loss_coef * L_aux  (mixture-of-experts models)

L_aux is the load-balancing loss (`rljax.algos.router_loss`) over the non-padding tokens
of each micro-batch (as transformers computes it per forward), averaged over the
micro-batches weighted by their rows: being a product of two means it is not additive
over micro-batches, so unlike the other terms it depends on the micro-batch split. The
KL terms read token log-probs only; router logits never enter them.

Each term is aggregated with its own global denominator over the whole mini-batch (the
step's `totals`, computed once from the masks), so splitting into micro-batches and
devices changes nothing. The step computes sum(numerator) / sum(denominator) over
micro-batches; this objective returns numerator = R * (its share of L) and denominator =
its row count (R = rows in the mini-batch; rows count when they hold a token, so the empty
rows that end a packed mini-batch count for nothing), so that ratio is exactly L.

Packed mini-batches (`rljax.rl.packing`, when `packs_sequences`) carry `segment_ids` and
`positions` (and `branch_ids` where samples share their prompt): the forwards attend
within a sequence (and its prompt), and a token whose row predecessor is not its
sequence's gets log-prob 0 as a row's first token does (never a loss token).

The policy-gradient term is multiplied by the rollout-correction IS weights
(`algorithm.rollout_correction`, see `RolloutCorrectionConfig`): in decoupled mode the
advantage stage computed them on the step batch (`rollout_is_weights`) and already
removed rejected tokens from `response_mask`; in bypass mode they are computed here from
the current policy. `key` (the step's PRNG key, `rljax.train.steps.step_key`) drives
Clip-Cov's random token selection.

Routing replay (`actor.router_replay`, MoE): the policy's forward routes each token to
the experts the sampler recorded (`expert_ids`, `rljax.models.moe.replay_routing`);
the KL term reads token log-probs (and, for "full", the reference's own forward) only,
never router logits or routing options.

With one optimizer step per batch (`rljax.rl.batch.old_log_probs_from_update`) the batch
holds no old log-probs: the objective's own log-probs, detached, are pi_old (the same
parameters, the same function: the ratio is 1 with the PPO gradient), and it returns them
per row (`rljax.train.steps.ROWS`) to fill the step batch after the update.

Each objective reads its own view of the step batch (`ActorBatch`, `CriticBatch`: their
fields are `rljax.rl.batch.StepBatch` fields, `take`), so a learner moves only those rows
to the devices; an optional field is None when the run's batches do not hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.algos.aggregation import AggTerms, agg_denominator, agg_loss_terms
from rljax.algos.kl import FULL_KL, kl_from_hidden, kl_penalty
from rljax.algos.masked import masked_mean, safe_divide
from rljax.algos.registry import get_policy_loss, get_policy_loss_fn, loss_denominator
from rljax.algos.rollout_correction import compute_rollout_correction_and_rejection_mask
from rljax.algos.router_loss import load_balancing_loss
from rljax.algos.value import compute_value_loss
from rljax.rl.advantage_stage import correction_kwargs
from rljax.rl.batch import Array
from rljax.rl.config import ActorConfig, CriticConfig, RolloutCorrectionConfig
from rljax.train.steps import ROWS

sg = jax.lax.stop_gradient


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class ActorBatch:
    """What the actor's objective reads of the step batch (B rows of a mini-batch)."""

    input_ids: Array  # [B, T] i32
    attention_mask: Array  # [B, T] i32
    response_mask: Array  # [B, T] f32 the tokens the loss applies to
    # [B, T] f32 pi_old (the sampler's in bypass mode); None: the update's own, detached (old_log_probs_from_update)
    old_log_probs: Array | None
    advantages: Array  # [B, T] f32
    ref_log_probs: Array | None = None  # [B, T] f32 the reference's; a per-token KL loss reads it
    rollout_is_weights: Array | None = None  # [B, T] f32 decoupled rollout correction's IS weights
    expert_ids: Array | None = None  # [B, T, L, k] i32 routing to replay (actor.router_replay)
    # packed rows (`rljax.rl.packing`), [B, T] i32 each; None: one sequence per row
    segment_ids: Array | None = None  # each token's item in its row (1, 2, ...; 0 padding)
    positions: Array | None = None  # each token's position in its own sequence
    branch_ids: Array | None = None  # shared prompts: 0 the prompt (or a whole sequence), k the k-th sample


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class CriticBatch:
    """What the critic's objective reads of the step batch (B rows of a mini-batch)."""

    input_ids: Array  # [B, T] i32
    attention_mask: Array  # [B, T] i32
    response_mask: Array  # [B, T] f32 the tokens the loss applies to
    values: Array  # [B, T] f32 the critic's before the update (value clipping)
    returns: Array  # [B, T] f32 the targets


def full_kl_to_reference(model, hidden, batch, reference_params, temperature: float) -> jax.Array:
    """Exact KL(pi_theta || pi_ref) over the vocabulary per response position (aligned,
    chunked: `kl_from_hidden`); the reference is `model`'s graph with the frozen params (None:
    `model` itself with its LoRA adapters off), and no gradient flows into it."""
    reference = model if reference_params is None else nnx.merge(nnx.graphdef(model), reference_params)
    ref_hidden = sg(reference.hidden_states(batch.input_ids, batch.attention_mask, batch.positions,
                                            batch.segment_ids, adapters=False, branch_ids=batch.branch_ids))
    return kl_from_hidden(hidden, model.unembedding(), ref_hidden, sg(reference.unembedding()),
                          temperature=temperature)


def effective_loss_mode(actor: ActorConfig, correction: RolloutCorrectionConfig) -> str:
    """The policy loss in use: verl's bypass mode with loss_type=reinforce replaces it."""
    if correction.bypass_mode and correction.loss_type == "reinforce":
        return "reinforce"
    return actor.policy_loss.loss_mode


def packs_sequences(actor: ActorConfig, correction: RolloutCorrectionConfig) -> bool:
    """Whether the actor's update packs sequences (`rljax.rl.packing`): `actor.pack_sequences`
    asks for it, and the loss is the same whichever rows the tokens sit in. That holds when
    every term is a sum of per-token values over a mini-batch-wide count: "token-mean"
    aggregation (the loss's own, when it fixes one), a loss whose token value reads only
    that token (`PolicyLoss.per_token`), and in bypass mode no sequence-level or
    batch-normalised IS weights, rejection or veto. Entropy, the KL terms and the MoE
    load-balancing loss (per micro-batch, packed or not) keep their meaning."""
    if not actor.pack_sequences:
        return False
    loss = get_policy_loss(effective_loss_mode(actor, correction))
    if loss.agg_mode(actor.loss_agg_mode) != "token-mean" or not loss.per_token:
        return False
    return not correction.bypass_mode or (
        correction.rollout_is in (None, "token") and not correction.rollout_is_batch_normalize
        and correction.rollout_rs is None and correction.rollout_token_veto_threshold is None)


def shares_prompts(actor: ActorConfig, correction: RolloutCorrectionConfig, kernel: str) -> bool:
    """Whether packed rows hold a prompt once for all its samples (`actor.share_prompts`):
    when the update packs and its attention kernel (resolved, `kernel`) is xla, the one
    that takes the prompt-and-branches mask (`rljax.models.attention.branch_mask`)."""
    return actor.share_prompts and packs_sequences(actor, correction) and kernel == "xla"


def sequence_starts_ids(batch: ActorBatch) -> jax.Array | None:
    """Ids that change wherever a token's row predecessor is not its predecessor in its
    sequence (each packed item and each branch starts anew), or None for unpacked rows."""
    if batch.segment_ids is None or batch.branch_ids is None:
        return batch.segment_ids
    return batch.segment_ids * (batch.segment_ids.shape[1] + 1) + batch.branch_ids


def live_rows(attention_mask: jax.Array) -> jax.Array:
    """Rows holding at least one real token (packed batches end in empty rows), float32."""
    return jnp.sum(jnp.any(attention_mask > 0, axis=-1).astype(jnp.float32))


def actor_objective(actor: ActorConfig, temperature: float,
                    correction: RolloutCorrectionConfig | None = None) -> tuple[Callable, Callable]:
    """-> (objective, totals_fn) for `make_train_step`, on `ActorBatch` mini-batches.

    The batch holds ref_log_probs for a per-token KL loss, rollout_is_weights in decoupled
    rollout correction with `rollout_is` set. `frozen` is the reference's params (a KL loss
    of type "full" runs the reference forward on them)."""
    correction = correction or RolloutCorrectionConfig()
    mode = actor.loss_agg_mode
    loss_mode = effective_loss_mode(actor, correction)
    loss_fn = get_policy_loss_fn(loss_mode)
    config = actor.loss_config
    bypass = correction.bypass_mode

    def totals(batch):
        """Global denominators of the mini-batch, counted from its mask alone: the policy
        loss's as it declares (its fixed mode, or `loss_agg_mode`), and `loss_agg_mode`'s."""
        return {
            "pg": loss_denominator(loss_mode, batch.response_mask, mode),
            "agg": agg_denominator(batch.response_mask, mode),
            "rows": live_rows(batch.attention_mask),
        }

    def pg_weights_and_mask(batch, log_prob):
        """(IS weights or None, the policy-gradient term's mask, metrics)."""
        mask = batch.response_mask
        if not bypass:  # decoupled: computed on the step batch by the advantage stage
            return batch.rollout_is_weights, mask, {}
        # bypass: old_log_probs are the sampler's; rho = pi_theta / pi_rollout, no gradient (verl)
        weights, kept, metrics = compute_rollout_correction_and_rejection_mask(
            sg(log_prob), batch.old_log_probs, mask, **correction_kwargs(correction))
        # ppo_clip: the ratio already is pi_theta / pi_rollout; the weights are metrics only
        return (weights if correction.loss_type == "reinforce" else None), kept, metrics

    def objective(model, batch, frozen, totals, key):
        mask = batch.response_mask
        hidden, routing = model.hidden_states_and_routing(  # [B, T, E], per-layer routing statistics
            batch.input_ids, batch.attention_mask, batch.positions, batch.segment_ids,
            expert_ids=batch.expert_ids if actor.router_replay else None, branch_ids=batch.branch_ids)
        log_prob, entropy = model.hidden_log_probs(hidden, batch.input_ids, temperature=temperature, entropy=True,
                                                   segment_ids=sequence_starts_ids(batch))
        weights, pg_mask, metrics = pg_weights_and_mask(batch, log_prob)
        old = batch.old_log_probs
        if old is None:  # one update at the parameters the old forward would use: its log-probs, detached
            old = sg(log_prob)
            metrics[f"{ROWS}old_log_probs"] = old
        pg, pg_metrics = loss_fn(old, log_prob, batch.advantages, pg_mask, mode, config,
                                 weights, key=key, global_denominator=totals["pg"])
        metrics.update(pg_metrics)
        rows = live_rows(batch.attention_mask)
        # a term's share of the mini-batch value, as a metric: the step weighs metrics by `rows`
        # and sums, so sum_m rows_m * (term_m * R / rows_m) / R = the mini-batch's term, exactly
        as_metric = lambda term: sg(safe_divide(term * totals["rows"], rows))  # noqa: E731
        entropy_loss = safe_divide(agg_loss_terms(entropy, mask, mode, actor.loss_scale_factor).numerator,
                                   totals["agg"])
        # with entropy_coeff 0 the entropy is a metric only: no gradient path, so the chunked
        # log-probs' backward skips the entropy's (two more [B, chunk, V] buffers on XLA:CPU)
        loss = pg - actor.entropy_coeff * entropy_loss if actor.entropy_coeff else pg
        metrics["actor/entropy"] = as_metric(entropy_loss)  # agg(entropy), as verl
        if actor.kl_loss:
            if actor.kl_loss_type == FULL_KL:
                kld = full_kl_to_reference(model, hidden, batch, frozen, temperature)
            else:
                kld = kl_penalty(log_prob, batch.ref_log_probs, actor.kl_loss_type)
            kl_loss = safe_divide(agg_loss_terms(kld, mask, mode, actor.loss_scale_factor).numerator, totals["agg"])
            loss = loss + actor.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = as_metric(kl_loss)  # agg(kl), as verl
            metrics["actor/kl_coef"] = jnp.asarray(actor.kl_loss_coef, jnp.float32)
        if actor.router_aux_loss_coef and routing is None:
            raise ValueError(f"actor.router_aux_loss_coef={actor.router_aux_loss_coef}: the model "
                             f"({model.config.model_type}) is not a mixture of experts")
        if routing is not None:
            tokens = jnp.sum(batch.attention_mask.astype(jnp.float32)) * routing.counts.shape[0]
            aux = load_balancing_loss(routing.counts, routing.prob_sum, tokens)
            loss = loss + actor.router_aux_loss_coef * aux * rows / totals["rows"]  # rows-weighted mean
            metrics["actor/router_aux_loss"] = sg(aux)  # the step weighs metrics by rows: the same mean
        metrics["actor/pg_loss"] = as_metric(pg)
        return AggTerms(loss * totals["rows"], rows), metrics

    return objective, totals


def critic_objective(critic: CriticConfig) -> Callable:
    """Clipped value loss on a `ScalarHeadModel`, on `CriticBatch` mini-batches; values are
    aligned with input_ids (the value of token t is read from the hidden state that
    predicts it, position t-1). One term, so its own (numerator, denominator) is already
    micro-batch exact."""

    def objective(model, batch, frozen, totals, key=None):
        vpreds = aligned_values(model, batch.input_ids, batch.attention_mask)
        terms, metrics = compute_value_loss(vpreds, batch.returns, batch.values, batch.response_mask,
                                            critic.cliprange_value, critic.loss_agg_mode, return_terms=True)
        metrics["critic/vpred_mean"] = jax.lax.stop_gradient(masked_mean(vpreds, batch.response_mask))
        return terms, metrics

    return objective


def aligned_values(model, input_ids, attention_mask) -> jax.Array:
    """The critic's values `[B, T]`, aligned: token t's from the hidden state predicting it."""
    values = model.token_values(input_ids, attention_mask=attention_mask)  # [B, T]
    return jnp.pad(values[:, :-1], ((0, 0), (1, 0)))
