"""The RL run config (PPO, GRPO and relatives), named as verl names it.

A verl recipe ports key by key: `data.train_batch_size` (prompts per step),
`actor.ppo_mini_batch_size` (prompts per optimizer step), `actor.ppo_epochs`,
`rollout.n`, `algorithm.adv_estimator`, `actor.policy_loss.loss_mode`,
`actor.loss_agg_mode`, `actor.use_kl_loss`, `actor.kl_loss_type`,
`algorithm.use_kl_in_reward`, `actor.entropy_coeff`, `actor.clip_ratio_low/high`, ...
Sizes in prompts are multiplied by `rollout.n` to get rows, as in verl.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rljax.algos.registry import KL_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from rljax.algos.rollout_correction import IS_LEVEL_REGISTRY, parse_rollout_rs
from rljax.config import ConfigError
from rljax.data.config import DataConfig
from rljax.parallel import MeshConfig
from rljax.train.optim import OptimConfig
from rljax.train.run_config import ModelSection, TrainerConfig


FULL_KL = "full"  # exact KL over the vocabulary (rljax.algos.kl.kl_from_hidden), not a per-token estimator


def _check_kl_name(key: str, name: str) -> None:
    valid = sorted(KL_ESTIMATOR_REGISTRY) + [FULL_KL]
    if name not in valid:
        raise ConfigError(f"{key}: unknown KL type {name!r}; valid: {valid}")


@dataclass
class PolicyLossSection:
    loss_mode: str = "vanilla"  # any name in rljax.algos POLICY_LOSS_REGISTRY
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 1.0

    def __post_init__(self) -> None:
        if self.loss_mode not in POLICY_LOSS_REGISTRY:
            raise ConfigError(f"actor.policy_loss.loss_mode: unknown {self.loss_mode!r}; "
                              f"valid: {sorted(POLICY_LOSS_REGISTRY)}")


@dataclass
class ActorConfig:
    ppo_mini_batch_size: int = 8  # prompts per optimizer step (x rollout.n rows)
    ppo_micro_batch_size_per_device: int = 0  # rows per device per micro-batch; 0: whole mini-batch
    ppo_epochs: int = 1
    shuffle: bool = True
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    # a per-token estimator (k1, k2, k3 = low_var_kl, abs, "+" variants) or "full": the exact
    # KL(pi || pi_ref) over the vocabulary at each response position (rljax.algos.kl.kl_from_hidden)
    kl_loss_type: str = "low_var_kl"
    policy_loss: PolicyLossSection = field(default_factory=PolicyLossSection)
    use_rollout_log_probs: bool = False  # old log-probs = the sampler's (skip the recompute)
    # Removed: use algorithm.rollout_correction (rollout_is=token, rollout_is_threshold=<cap>).
    # Kept as a field only so that a config still setting it gets that message.
    tis_imp_ratio_cap: float | None = None
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))

    def __post_init__(self) -> None:
        _check_kl_name("actor.kl_loss_type", self.kl_loss_type)
        if self.tis_imp_ratio_cap is not None:
            raise ConfigError(
                "actor.tis_imp_ratio_cap was replaced by verl's rollout correction keys: set "
                f"algorithm.rollout_correction.rollout_is=token and "
                f"algorithm.rollout_correction.rollout_is_threshold={self.tis_imp_ratio_cap} "
                "(token-level truncated importance sampling, the same weights min(pi_old / pi_rollout, cap))")


@dataclass
class CriticConfig:
    ppo_mini_batch_size: int = 8
    ppo_micro_batch_size_per_device: int = 0
    ppo_epochs: int = 1
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))


@dataclass
class ValKwargs:
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0


@dataclass
class RolloutConfig:
    n: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    response_length: int = 64  # verl: data.max_response_length
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    page_size: int = 16
    num_pages: int = 0  # 0: sized by kv_cache_memory_fraction
    kv_cache_memory_fraction: float = 0.3
    enable_prefix_caching: bool = True  # reuse cached pages across requests (agent turns)
    seed: int = 0
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop groups whose `metric` is the same for every sample and
    generate more until the batch is full (at most `max_num_gen_batches` generations)."""

    enable: bool = False
    metric: str = "score"
    max_num_gen_batches: int = 4


@dataclass
class RolloutCorrectionSection:
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
    the loss), so a rejected token dilutes instead of vanishing.

    Names and semantics follow verl (`RolloutCorrectionConfig`, `rollout_corr_helper`);
    `rollout_is: geometric`, `rollout_is_mode` and `rollout_token_veto_threshold` come from
    verl's earlier versions of the same feature (mismatch_helper / rollout_corr_helper
    before the k1/k2/k3 rejection options), where the lower bound of a ratio rejection was
    `rollout_rs_threshold_lower`: here write it into `rollout_rs_threshold` as "lower_upper".
    """

    rollout_is: str | None = None  # token | sequence | geometric; null: no IS weights
    rollout_is_threshold: float = 2.0
    rollout_is_mode: Literal["truncate", "mask"] = "truncate"
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None  # e.g. "token_k1", "seq_mean_k3,seq_max_k2"; null: no rejection
    rollout_rs_threshold: str | float | None = None
    rollout_token_veto_threshold: float | None = None  # e.g. 1e-4; null: no veto
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
    adv_estimator: str = "grpo"  # any name in ADV_ESTIMATOR_REGISTRY
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    # a per-token estimator of log pi_old - log pi_ref (kl, abs, mse, low_var_kl, ...) or
    # "full": the exact KL(pi_old || pi_ref) over the vocabulary at each response position
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionSection = field(default_factory=RolloutCorrectionSection)

    def __post_init__(self) -> None:
        _check_kl_name("algorithm.kl_penalty", self.kl_penalty)


@dataclass
class OverlongBufferConfig:
    enable: bool = False
    len: int = 16
    penalty_factor: float = 1.0


@dataclass
class CustomRewardFunction:
    path: str = ""
    name: str = "compute_score"


@dataclass
class RewardModelSection:
    """A trained reward model as the reward (verl's `reward_model.enable`): an HF
    `*ForSequenceClassification` folder with one label (what `rljax export` writes for
    an `rm` run) scores the exact `prompt + response` token ids of every sample.

    `combine`: `replace` (the RM score times `weight` is the reward; rule-based scores
    are still computed where a rule applies, for their metrics) or `add` (rule score +
    `weight` x RM score). Where no rule reward applies (a data_source with no registered
    function and no custom function) the rule score counts as 0 instead of an error."""

    enable: bool = False
    path: str = ""  # HF folder of the exported reward model
    dtype: str = "float32"  # parameter and compute dtype
    batch_size: int = 16  # rows per forward (padded up to it; lengths to powers of two)
    combine: Literal["replace", "add"] = "replace"
    weight: float = 1.0


@dataclass
class VerifierSection:
    """A generative verifier as the reward: a causal LM grades each (question, response,
    ground truth) with greedy decoding in rljax's sampler; the parsed verdict is the score
    (`rljax.rewards.verifier`). Applied after the reward model, combined the same way.

    `path`: an HF causal-LM folder, or `policy` (the current policy grades itself).
    Tokenizer: the folder's own if it has one, else the policy's."""

    enable: bool = False
    path: str = "policy"
    dtype: str = "float32"
    prompt_template: str = ""  # str.format over {question} {answer} {ground_truth}; "": the default
    system_prompt: str = ""
    parse: Literal["yes_no", "score"] = "yes_no"  # Yes/No -> 1/0 | "Score: x" in [0, 1]
    failure_score: float = 0.0  # an unparseable verdict (counted in verifier/parse_failures)
    max_tokens: int = 32  # verdict length
    max_model_len: int = 0  # grading prompt + verdict; 0: data.max_prompt_length + rollout.response_length + 512
    max_num_seqs: int = 64
    num_pages: int = 0  # 0: sized by kv_cache_memory_fraction
    kv_cache_memory_fraction: float = 0.1
    combine: Literal["replace", "add"] = "replace"
    weight: float = 1.0


@dataclass
class RewardConfig:
    custom_reward_function: CustomRewardFunction = field(default_factory=CustomRewardFunction)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    reward_model: RewardModelSection = field(default_factory=RewardModelSection)
    verifier: VerifierSection = field(default_factory=VerifierSection)
    mode: str = "process"  # process: contained in worker processes (timeouts) | inline: trusted, faster
    timeout_s: float = 10.0
    num_workers: int = 2


@dataclass
class WarmupSFTConfig:
    """An SFT phase before RL (the quickstart's warm-up): `steps` optimizer steps on
    `train_files` (SFT format) from the configured model."""

    enable: bool = False
    train_files: list[str] = field(default_factory=list)
    steps: int = 100
    batch_size: int = 32
    lr: float = 1e-3


@dataclass
class RLConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=lambda: DataConfig(format="rl"))
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(algorithm="grpo"))
    mesh: MeshConfig = field(default_factory=MeshConfig)
    warmup_sft: WarmupSFTConfig = field(default_factory=WarmupSFTConfig)
    agent: dict[str, Any] = field(default_factory=dict)  # rljax.agent.AgentConfig; empty: single-turn
