"""The `actor:` and `critic:` sections of `RLConfig`: what is trained, how the batch is cut
into optimizer steps, and the knobs of the policy and value losses (verl:
`actor_rollout_ref.actor`, `critic`).

Sizes in prompts (`ppo_mini_batch_size`) are multiplied by `rollout.n` to get rows, as in
verl; micro-batches are in rows per device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from rljax.algos.kl import FULL_KL
from rljax.algos.policy_loss import PolicyLossParams
from rljax.algos.registry import KL_ESTIMATOR_REGISTRY, LOSS_AGG_REGISTRY, POLICY_LOSS_REGISTRY
from rljax.config import (
    Bounds,
    ConfigError,
    FieldError,
    NonNegFloat,
    NonNegRows,
    OpenUnitFloat,
    PositiveFloat,
    Repeats,
    Rows,
    check_registry,
)
from rljax.train.optim import OptimConfig


def check_kl_name(key: str, name: str) -> None:
    """A KL type: a per-token estimator of KL_ESTIMATOR_REGISTRY, or "full" (FULL_KL)."""
    valid = sorted(KL_ESTIMATOR_REGISTRY) + [FULL_KL]
    if name not in valid:
        raise ConfigError(f"{key}: unknown KL type {name!r}; valid: {valid}")


@dataclass
class PolicyLossConfig:
    """verl's `actor.policy_loss`: which policy loss, and the options of the losses that have some."""

    loss_mode: str = "vanilla"  # a name in POLICY_LOSS_REGISTRY (vanilla = PPO clip, gspo, clip_cov, kl_cov, ...)
    clip_cov_ratio: OpenUnitFloat = 0.0002  # clip_cov: fraction of unmasked tokens whose gradient is detached
    clip_cov_lb: float = 1.0  # clip_cov: candidates have covariance (A - mean A)(log pi - mean) above this
    clip_cov_ub: float = 5.0  # clip_cov: ... and below this
    kl_cov_ratio: OpenUnitFloat = 0.0002  # kl_cov: fraction of unmasked tokens (largest covariance) penalised
    ppo_kl_coef: NonNegFloat = 1.0  # kl_cov: weight of |log pi - log pi_old| on those tokens

    def __post_init__(self) -> None:
        if self.loss_mode not in POLICY_LOSS_REGISTRY:
            raise ConfigError(f"actor.policy_loss.loss_mode: unknown {self.loss_mode!r}; "
                              f"valid: {sorted(POLICY_LOSS_REGISTRY)}")

    def check(self) -> None:
        if self.clip_cov_lb > self.clip_cov_ub:
            raise FieldError(f"clip_cov_lb={self.clip_cov_lb:g}",
                             f"must not exceed clip_cov_ub={self.clip_cov_ub:g}")


@dataclass
class ActorConfig:
    """The policy's training (verl: `actor_rollout_ref.actor`)."""

    ppo_mini_batch_size: Rows = 8  # prompts per optimizer step (x rollout.n rows)
    # rows per device per micro-batch; 0: whole mini-batch (verl: ppo_micro_batch_size_per_gpu)
    ppo_micro_batch_size_per_device: NonNegRows = 0
    ppo_epochs: Repeats = 1  # passes over the step's batch
    shuffle: bool = True  # reshuffle the rows into mini-batches at every epoch
    # pack a mini-batch's sequences into as few rows as hold them and skip the micro-batches
    # left empty (rljax.rl.packing), where the loss stays exactly the same: token-mean and a
    # per-token policy loss (rljax.rl.actor_critic.packs_sequences); verl: use_remove_padding
    pack_sequences: bool = True
    # packed rows hold a prompt once for all its samples, which attend to it and to themselves
    # only; where the training attention is xla (rljax.rl.actor_critic.shares_prompts)
    share_prompts: bool = True
    clip_ratio: NonNegFloat = 0.2  # PPO clip epsilon (both sides, unless low / high are set)
    clip_ratio_low: NonNegFloat | None = None  # epsilon below 1 (ratio >= 1 - low); null: clip_ratio
    clip_ratio_high: NonNegFloat | None = None  # epsilon above 1 (DAPO's clip-higher); null: clip_ratio
    clip_ratio_c: Annotated[float, Bounds(gt=1)] = 3.0  # dual-clip lower bound (verl: > 1)
    # how token losses become one number, a name in LOSS_AGG_REGISTRY: token-mean,
    # seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: PositiveFloat | None = None  # C of seq-mean-token-sum-norm, in tokens; null: padded length
    entropy_coeff: float = 0.0  # weight of the entropy bonus (subtracted from the loss)
    use_kl_loss: bool = False  # add KL(pi || pi_ref) to the loss (GRPO); see algorithm.use_kl_in_reward
    kl_loss_coef: NonNegFloat = 0.001  # weight of that KL term
    # a per-token estimator (k1, k2, k3 = low_var_kl, abs, "+" variants) or "full": the exact
    # KL(pi || pi_ref) over the vocabulary at each response position (rljax.algos.kl.kl_from_hidden)
    kl_loss_type: str = "low_var_kl"
    # weight of the mixture-of-experts load-balancing loss (rljax.algos.router_loss), added
    # to the actor loss; 0: off. Mixture-of-experts models only (verl / HF: router_aux_loss_coef)
    router_aux_loss_coef: NonNegFloat = 0.0
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)  # the loss and its options
    use_rollout_log_probs: bool = False  # old log-probs = the sampler's (skip the recompute)
    # Removed: use algorithm.rollout_correction (rollout_is=token, rollout_is_threshold=<cap>).
    # Kept as a field only so that a config still setting it gets that message.
    tis_imp_ratio_cap: float | None = None
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))  # the policy's optimizer
    # ---- routing replay (mixture-of-experts policies; rljax.models.moe.replay_routing) ----
    # The sampler records each token's experts per layer (rollout record_routing) and the
    # actor's forwards (old log-probs, the update, the policy side of a "full" KL) route
    # every recorded token to them instead of the router's own top-k: verl's R3 (Ma et al.
    # 2025). The reference and the critic route as they would (their own policies). Dense
    # models and agent rollouts are refused.
    router_replay: bool = False

    @property
    def kl_loss(self) -> bool:
        """Whether the loss has a KL term: `use_kl_loss` with a `kl_loss_coef` above 0 (at 0
        the term is nothing, and no reference forward runs for it)."""
        return self.use_kl_loss and self.kl_loss_coef > 0

    def __post_init__(self) -> None:
        check_kl_name("actor.kl_loss_type", self.kl_loss_type)
        if self.tis_imp_ratio_cap is not None:
            raise ConfigError(
                "actor.tis_imp_ratio_cap was replaced by verl's rollout correction keys: set "
                f"algorithm.rollout_correction.rollout_is=token and "
                f"algorithm.rollout_correction.rollout_is_threshold={self.tis_imp_ratio_cap} "
                "(token-level truncated importance sampling, the same weights min(pi_old / pi_rollout, cap))")

    def check(self) -> None:
        check_registry("actor.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_REGISTRY)

    @property
    def loss_config(self) -> PolicyLossParams:
        """The policy losses' knobs (`rljax.algos.policy_loss`) from this section and its
        `policy_loss` subsection."""
        p = self.policy_loss
        return PolicyLossParams(
            clip_ratio=self.clip_ratio, clip_ratio_low=self.clip_ratio_low, clip_ratio_high=self.clip_ratio_high,
            clip_ratio_c=self.clip_ratio_c, loss_scale_factor=self.loss_scale_factor,
            clip_cov_ratio=p.clip_cov_ratio, clip_cov_lb=p.clip_cov_lb, clip_cov_ub=p.clip_cov_ub,
            kl_cov_ratio=p.kl_cov_ratio, ppo_kl_coef=p.ppo_kl_coef,
        )


@dataclass
class CriticConfig:
    """The value model's training, for `algorithm.adv_estimator=gae` (verl: `critic`)."""

    ppo_mini_batch_size: Rows = 8  # prompts per optimizer step (x rollout.n rows)
    # rows per device per micro-batch; 0: whole mini-batch (verl: ppo_micro_batch_size_per_gpu)
    ppo_micro_batch_size_per_device: NonNegRows = 0
    ppo_epochs: Repeats = 1  # passes over the step's batch
    cliprange_value: NonNegFloat = 0.5  # values move at most this far from the old values (clipped loss)
    loss_agg_mode: str = "token-mean"  # as actor.loss_agg_mode, for the value loss
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))  # the critic's optimizer

    def check(self) -> None:
        check_registry("critic.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_REGISTRY)
