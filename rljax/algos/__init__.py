"""The math of RL post-training as pure, jit-able functions of arrays (no model, no I/O).

Modules, one job each:

    registry.py            name -> spec / function registries (policy loss, advantage, KL, agg mode)
    masked.py              masked sum / mean / var / whiten
    aggregation.py         loss_agg_mode as (numerator, denominator): micro-batch exact
    policy_loss.py         vanilla PPO, GSPO, GPG, CISPO, Clip-Cov, KL-Cov, GMPO, REINFORCE
    rollout_correction.py  truncated IS weights, rejection / veto masks, mismatch metrics
    kl.py                  k1/k2/k3 (+ straight-through), full-vocab KL, KL controllers
    advantages.py          GAE, GRPO, Dr.GRPO, RLOO, REINFORCE++(-baseline), ReMax, OPO, GPG, pass@k
    value.py               clipped value loss
    log_probs.py            aligned token log-probs / entropy; chunked from hidden states
    preference.py          DPO (sigmoid / cDPO, IPO, hinge, reference-free), Bradley-Terry
    sft.py                 masked cross-entropy

Names follow verl's `core_algos` (and TRL for DPO). Per-token arrays are [B, T] and aligned
with input_ids (see `log_probs`); losses return `(loss, metrics)`, or `(AggTerms, metrics)`
with `return_terms=True`.
"""

from rljax.algos.advantages import (
    AdvantageEstimator,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    compute_dr_grpo_outcome_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    discounted_returns,
    group_mean_std,
    register_adv_est,
)
from rljax.algos.aggregation import (
    LOSS_AGG_MODES,
    AggTerms,
    add_terms,
    agg_denominator,
    agg_loss,
    agg_loss_terms,
)
from rljax.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    compute_rewards,
    get_kl_controller,
    kl_from_logits,
    kl_penalty,
)
from rljax.algos.log_probs import (
    align_next_token,
    compute_entropy_loss,
    entropy_from_logits,
    log_probs_from_hidden,
    token_entropy,
    token_log_probs,
)
from rljax.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten, safe_divide
from rljax.algos.policy_loss import (
    PolicyLoss,
    PolicyLossParams,
    compute_policy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_reinforce,
    compute_policy_loss_vanilla,
    register_policy_loss,
)
from rljax.algos.preference import DPO_LOSS_REGISTRY, bradley_terry_loss, dpo_loss, sequence_log_probs
from rljax.algos.registry import (
    ADV_ESTIMATOR_REGISTRY,
    KL_ESTIMATOR_REGISTRY,
    LOSS_AGG_REGISTRY,
    POLICY_LOSS_REGISTRY,
    Registry,
    get_adv_estimator,
    get_adv_estimator_fn,
    get_kl_estimator,
    get_loss_agg_fn,
    get_policy_loss,
    get_policy_loss_fn,
    loss_denominator,
    register_kl_estimator,
    register_loss_agg_mode,
)
from rljax.algos.rollout_correction import (
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_probs_diff_metrics,
    compute_rollout_rejection_mask,
    compute_rollout_veto_mask,
)
from rljax.algos.sft import sft_loss, sft_loss_from_logits
from rljax.algos.value import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "DPO_LOSS_REGISTRY",
    "KL_ESTIMATOR_REGISTRY",
    "LOSS_AGG_MODES",
    "LOSS_AGG_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageParams",
    "AggTerms",
    "FixedKLController",
    "PolicyLoss",
    "PolicyLossParams",
    "Registry",
    "add_terms",
    "agg_denominator",
    "agg_loss",
    "agg_loss_terms",
    "align_next_token",
    "apply_kl_penalty",
    "bradley_terry_loss",
    "compute_advantages",
    "compute_dr_grpo_outcome_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_kl_loss",
    "compute_offpolicy_metrics",
    "compute_opo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_probs_diff_metrics",
    "compute_rollout_rejection_mask",
    "compute_rollout_veto_mask",
    "compute_value_loss",
    "discounted_returns",
    "dpo_loss",
    "entropy_from_logits",
    "get_adv_estimator",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_kl_estimator",
    "get_loss_agg_fn",
    "get_policy_loss",
    "get_policy_loss_fn",
    "group_mean_std",
    "kl_from_logits",
    "kl_penalty",
    "log_probs_from_hidden",
    "loss_denominator",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_kl_estimator",
    "register_loss_agg_mode",
    "register_policy_loss",
    "safe_divide",
    "sequence_log_probs",
    "sft_loss",
    "sft_loss_from_logits",
    "token_entropy",
    "token_log_probs",
]
