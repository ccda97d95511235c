"""The `algorithm:` section of `RLConfig`: advantages, the KL penalty in the reward,
DAPO's dynamic sampling and the rollout correction (verl: `algorithm`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rljax.algos.registry import ADV_ESTIMATOR_REGISTRY
from rljax.algos.rollout_correction import IS_LEVEL_REGISTRY, parse_rollout_rs
from rljax.config import ConfigError, NonNegFloat, PositiveFloat, Repeats, Steps, UnitFloat, check_registry
from rljax.rl.actor_config import check_kl_name


@dataclass
class KLControlConfig:
    """The coefficient of the KL penalty in the reward (`rljax.algos.kl.get_kl_controller`)."""

    type: Literal["fixed", "adaptive"] = "fixed"  # fixed: kl_coef throughout; adaptive: steered to target_kl
    kl_coef: NonNegFloat = 0.001  # the (initial) coefficient
    target_kl: PositiveFloat = 0.1  # adaptive: the KL aimed at
    horizon: Steps = 10000  # adaptive: value *= 1 + clip(kl / target_kl - 1, +-0.2) x n_steps / horizon


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop groups whose `metric` is the same for every sample and
    generate more until the batch is full (at most `max_num_gen_batches` generations)."""

    enable: bool = False  # filter groups (DAPO's dynamic sampling)
    # score | seq_reward | seq_final_reward (the sample's reward) or a per-sample value the reward returns (acc)
    metric: str = "score"
    max_num_gen_batches: Repeats = 4  # generation batches per step at most (then topped up, unfiltered)


@dataclass
class RolloutCorrectionConfig:
    """Rollout correction between the sampler's log-probs (pi_rollout) and the trainer's,
    verl's `algorithm.rollout_correction` (functions: `rljax.algos.rollout_correction`;
    metrics under `rollout_corr/`). Nothing is applied while `rollout_is`, `rollout_rs`
    and `rollout_token_veto_threshold` are all null and `bypass_mode` is false.

    Decoupled mode (`bypass_mode: false`, three policies): old log-probs are recomputed by
    the trainer, and on the whole step batch (after the KL-in-reward penalty, before the
    advantages, as verl's trainer) rho = pi_old / pi_rollout gives
      - IS weights at level `rollout_is` (token | sequence | geometric), truncated at
        `rollout_is_threshold` (`rollout_is_mode: truncate`) or, with `mask`, untruncated
        and tokens / sequences whose weight leaves [1/threshold, threshold] rejected;
        `rollout_is_batch_normalize` rescales them to mean 1 over the step batch. They
        multiply the policy-gradient term of the actor loss.
      - rejection `rollout_rs` (verl's comma-separated options token_k1, seq_sum_k3,
        seq_mean_k1, seq_max_k2, ...) with `rollout_rs_threshold` (one spec or one per
        option; k1 options take "lower_upper" bounds on exp(k1) = pi_rollout / pi_old
        (summed / averaged in log space for seq_*), e.g. "0.5_2.0", or one u for [1/u, u];
        k2/k3 an upper bound).
      - veto `rollout_token_veto_threshold`: a sequence with any token rho below it is rejected.
    Rejections are zeros in `response_mask` (so the policy, entropy and KL terms and the
    critic skip them, and every denominator counts only the tokens / sequences kept).

    Bypass mode (`bypass_mode: true`, two policies): old log-probs are the sampler's (no
    recompute), and the correction is computed inside the actor loss, per micro-batch,
    from the current policy: rho = pi_theta / pi_rollout (no gradient). `loss_type:
    ppo_clip` keeps the configured policy loss (its ratio is already pi_theta / pi_rollout,
    so IS weights are not applied; rejections are); `reinforce` uses the REINFORCE loss
    with the IS weights. Rejections zero the policy-gradient term only; its denominator is
    that of the unrejected mini-batch (as verl, whose global token count is taken before
    the loss), so a rejected token dilutes instead of vanishing. The asynchronous trainer
    modes default to it with `ppo_clip` (`rljax.rl.presets.MODE_PRESETS`).

    Names and semantics follow verl (`RolloutCorrectionConfig`, `rollout_corr_helper`);
    `rollout_is: geometric`, `rollout_is_mode` and `rollout_token_veto_threshold` come from
    verl's earlier versions of the same feature (mismatch_helper / rollout_corr_helper
    before the k1/k2/k3 rejection options), where the lower bound of a ratio rejection was
    `rollout_rs_threshold_lower`: here write it into `rollout_rs_threshold` as "lower_upper".
    """

    rollout_is: str | None = None  # token | sequence | geometric (IS_LEVEL_REGISTRY); null: no IS weights
    rollout_is_threshold: float = 2.0  # the cap of the IS weights (> 1 with mask: kept in [1/t, t])
    rollout_is_mode: Literal["truncate", "mask"] = "truncate"  # cap the weights | reject outside the band
    rollout_is_batch_normalize: bool = False  # rescale the IS weights to mean 1 over the step batch
    rollout_rs: str | None = None  # e.g. "token_k1", "seq_mean_k3,seq_max_k2"; null: no rejection
    rollout_rs_threshold: str | float | None = None  # one spec or one per rollout_rs option ("0.5_2.0", 2.0)
    rollout_token_veto_threshold: float | None = None  # e.g. 1e-4; null: no veto
    # two policies: old log-probs are the sampler's, corrected inside the loss (the default of
    # trainer.mode one_step_off / async when nothing under algorithm.rollout_correction is set)
    bypass_mode: bool = False
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"  # bypass mode only

    def __post_init__(self) -> None:
        key = "algorithm.rollout_correction"
        if self.rollout_is is not None and self.rollout_is not in IS_LEVEL_REGISTRY:
            raise ConfigError(f"{key}.rollout_is: unknown level {self.rollout_is!r}; valid: "
                              f"{sorted(IS_LEVEL_REGISTRY)} or null")
        if not self.rollout_is_threshold > 0:
            raise ConfigError(f"{key}.rollout_is_threshold: must be > 0, got {self.rollout_is_threshold}")
        if self.rollout_is_mode == "mask" and not self.rollout_is_threshold > 1:
            raise ConfigError(f"{key}.rollout_is_threshold: must be > 1 with rollout_is_mode=mask (weights are "
                              f"kept in [1/threshold, threshold]), got {self.rollout_is_threshold}")
        if self.rollout_rs is not None:
            if self.rollout_rs_threshold is None:
                raise ConfigError(f"{key}.rollout_rs_threshold: required when rollout_rs is set")
            try:
                parse_rollout_rs(self.rollout_rs, self.rollout_rs_threshold)
            except ValueError as e:
                raise ConfigError(f"{key}.rollout_rs / rollout_rs_threshold: {e}") from None
        elif self.rollout_rs_threshold is not None:
            raise ConfigError(f"{key}.rollout_rs_threshold: set, but rollout_rs is null (no rejection)")
        veto = self.rollout_token_veto_threshold
        if veto is not None and not 0 < veto < 1:
            raise ConfigError(f"{key}.rollout_token_veto_threshold: a ratio in (0, 1), got {veto}")
        if self.loss_type != "ppo_clip" and not self.bypass_mode:
            raise ConfigError(f"{key}.loss_type={self.loss_type!r}: only used with bypass_mode=true")
        if self.bypass_mode and self.rollout_is_batch_normalize:
            raise ConfigError(f"{key}.rollout_is_batch_normalize: not supported with bypass_mode=true (the weights "
                              "are computed per micro-batch there, so a batch mean would depend on the split)")

    @property
    def enabled(self) -> bool:
        return (self.bypass_mode or self.rollout_is is not None or self.rollout_rs is not None
                or self.rollout_token_veto_threshold is not None)


@dataclass
class AlgorithmConfig:
    """How rewards become advantages (verl: `algorithm`)."""

    adv_estimator: str = "grpo"  # any name in ADV_ESTIMATOR_REGISTRY (gae, grpo, rloo, reinforce_plus_plus, ...)
    gamma: UnitFloat = 1.0  # discount per token (gae, reinforce_plus_plus)
    lam: UnitFloat = 1.0  # GAE lambda
    norm_adv_by_std_in_grpo: bool = True  # grpo: divide by the group's std (false: Dr. GRPO)
    use_kl_in_reward: bool = False  # subtract kl_ctrl's coefficient x KL(pi_old || pi_ref) from the token rewards
    # a per-token estimator of log pi_old - log pi_ref (kl, abs, mse, low_var_kl, ...) or
    # "full": the exact KL(pi_old || pi_ref) over the vocabulary at each response position
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)  # the KL-in-reward coefficient
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)  # DAPO's dynamic sampling
    # sampler / trainer mismatch: IS weights, rejection (verl: algorithm.rollout_correction)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)

    def __post_init__(self) -> None:
        check_kl_name("algorithm.kl_penalty", self.kl_penalty)

    def check(self) -> None:
        check_registry("algorithm.adv_estimator", self.adv_estimator, ADV_ESTIMATOR_REGISTRY)
