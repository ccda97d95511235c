"""The RL run config (PPO, GRPO and relatives), named as verl names it.

A verl recipe ports key by key: `data.train_batch_size` (prompts per step),
`actor.ppo_mini_batch_size` (prompts per optimizer step), `actor.ppo_epochs`,
`rollout.n`, `algorithm.adv_estimator`, `actor.policy_loss.loss_mode`,
`actor.loss_agg_mode`, `actor.use_kl_loss`, `actor.kl_loss_type`,
`algorithm.use_kl_in_reward`, `actor.entropy_coeff`, `actor.clip_ratio_low/high`, ...
Sizes in prompts are multiplied by `rollout.n` to get rows, as in verl.

Every value is checked when the config is loaded (`rljax.config.check_config`): numeric
ranges from the field types (`PositiveInt`, `UnitFloat`, ...), registry names (loss_agg_mode,
adv_estimator, loss_mode, KL types and controllers) with the valid names listed, and the
sizes that must divide (`RLConfig.check`). `rljax.config.validate(cfg, num_devices)` adds
the checks that need the machine (`RLConfig.check_run`: the device count, the resume
checkpoint): call it before building anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from rljax.algos.kl import get_kl_controller
from rljax.algos.registry import (
    ADV_ESTIMATOR_REGISTRY,
    KL_ESTIMATOR_REGISTRY,
    LOSS_AGG_REGISTRY,
    POLICY_LOSS_REGISTRY,
)
from rljax.algos.rollout_correction import IS_LEVEL_REGISTRY, parse_rollout_rs
from rljax.config import (
    Bounds,
    ConfigError,
    FieldError,
    NonNegFloat,
    NonNegInt,
    OpenUnitFloat,
    PositiveFloat,
    PositiveInt,
    UnitFloat,
    check_name,
)
from rljax.data.config import DataConfig
from rljax.parallel import MeshConfig
from rljax.train.optim import OptimConfig
from rljax.train.run_config import (
    SUPERVISED_ALGORITHMS,
    ModelSection,
    TrainerConfig,
    _float_dtype_problem,
    batch_size_key,
    check_algorithm,
    check_mesh_shape,
    data_parallel_size,
)


FULL_KL = "full"  # exact KL over the vocabulary (rljax.algos.kl.kl_from_hidden), not a per-token estimator

# `trainer.algorithm` of an RL run: a label (the method is chosen by algorithm.adv_estimator and
# actor.policy_loss.loss_mode), checked against the recipes' names so that a typo is an error.
RL_ALGORITHMS: tuple[str, ...] = tuple(sorted(
    {"ppo", "dapo", "gmpo"} | (set(ADV_ESTIMATOR_REGISTRY) - {"gae"}) | (set(POLICY_LOSS_REGISTRY) - {"vanilla"})))

# estimators whose baseline is the group's own mean: one sample per prompt gives zero advantages
GROUP_BASELINE_ESTIMATORS = ("grpo", "dr_grpo", "grpo_passk")

TopK = Annotated[int, Bounds(ge=-1)]  # -1 / 0: off


def _check_kl_name(key: str, name: str) -> None:
    valid = sorted(KL_ESTIMATOR_REGISTRY) + [FULL_KL]
    if name not in valid:
        raise ConfigError(f"{key}: unknown KL type {name!r}; valid: {valid}")


def _check_registry(key: str, name: str, registry) -> None:
    problem = check_name(name, registry)
    if problem:
        raise ConfigError(f"{key}: {problem}")


@dataclass
class PolicyLossSection:
    loss_mode: str = "vanilla"  # any name in rljax.algos POLICY_LOSS_REGISTRY
    clip_cov_ratio: OpenUnitFloat = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: OpenUnitFloat = 0.0002
    ppo_kl_coef: NonNegFloat = 1.0

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
    ppo_mini_batch_size: PositiveInt = 8  # prompts per optimizer step (x rollout.n rows)
    ppo_micro_batch_size_per_device: NonNegInt = 0  # rows per device per micro-batch; 0: whole mini-batch
    ppo_epochs: PositiveInt = 1
    shuffle: bool = True
    clip_ratio: NonNegFloat = 0.2
    clip_ratio_low: NonNegFloat | None = None
    clip_ratio_high: NonNegFloat | None = None
    clip_ratio_c: Annotated[float, Bounds(gt=1)] = 3.0  # dual-clip lower bound (verl: > 1)
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: PositiveFloat | None = None
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: NonNegFloat = 0.001
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

    def check(self) -> None:
        _check_registry("actor.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_REGISTRY)


@dataclass
class CriticConfig:
    ppo_mini_batch_size: PositiveInt = 8
    ppo_micro_batch_size_per_device: NonNegInt = 0
    ppo_epochs: PositiveInt = 1
    cliprange_value: NonNegFloat = 0.5
    loss_agg_mode: str = "token-mean"
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))

    def check(self) -> None:
        _check_registry("critic.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_REGISTRY)


@dataclass
class ValKwargs:
    n: PositiveInt = 1
    temperature: NonNegFloat = 0.0
    top_p: OpenUnitFloat = 1.0
    top_k: TopK = 0


@dataclass
class RolloutConfig:
    n: PositiveInt = 4
    temperature: NonNegFloat = 1.0
    top_p: OpenUnitFloat = 1.0
    top_k: TopK = 0
    min_p: UnitFloat = 0.0
    response_length: PositiveInt = 64  # verl: data.max_response_length
    max_num_seqs: PositiveInt = 64
    max_num_batched_tokens: PositiveInt = 2048
    page_size: PositiveInt = 16
    num_pages: NonNegInt = 0  # 0: sized by kv_cache_memory_fraction
    kv_cache_memory_fraction: OpenUnitFloat = 0.3
    enable_prefix_caching: bool = True  # reuse cached pages across requests (agent turns)
    seed: NonNegInt = 0
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)

    def check(self) -> None:
        if self.num_pages == 1:
            raise FieldError("num_pages", "0 (automatic) or >= 2 (page 0 is reserved), got 1")


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: NonNegFloat = 0.001
    target_kl: PositiveFloat = 0.1
    horizon: PositiveInt = 10000

    def check(self) -> None:
        try:
            get_kl_controller(self.type)
        except ValueError:
            raise FieldError("type", check_name(self.type, ("fixed", "adaptive"))) from None


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop groups whose `metric` is the same for every sample and
    generate more until the batch is full (at most `max_num_gen_batches` generations)."""

    enable: bool = False
    metric: str = "score"
    max_num_gen_batches: PositiveInt = 4


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
    gamma: UnitFloat = 1.0
    lam: UnitFloat = 1.0
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

    def check(self) -> None:
        _check_registry("algorithm.adv_estimator", self.adv_estimator, ADV_ESTIMATOR_REGISTRY)


@dataclass
class OverlongBufferConfig:
    enable: bool = False
    len: PositiveInt = 16  # at most rollout.response_length
    penalty_factor: NonNegFloat = 1.0


@dataclass
class CustomRewardFunction:
    """verl's `custom_reward_function`: the function `name` of the Python file `path`,
    called with `reward_kwargs` added to every call (`rljax.rewards.custom`)."""

    path: str = ""
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        if self.reward_kwargs and not self.path:
            raise FieldError("reward_kwargs", "set, but custom_reward_function.path is empty (no custom function)")
        if self.path and not os.path.isfile(os.path.expanduser(self.path)):
            raise FieldError("path", f"no such file {self.path!r}")


def _check_model_dir(section, name: str = "path") -> None:
    """An enabled model section's folder must be there (checked again when it is loaded)."""
    path = getattr(section, name)
    if not section.enable or path == "policy":
        return
    if not path:
        raise FieldError(name, "required when enabled (an HF folder)")
    if not os.path.isdir(path):
        raise FieldError(name, f"no such directory {path!r}")


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
    batch_size: PositiveInt = 16  # rows per forward (padded up to it; lengths to powers of two)
    combine: Literal["replace", "add"] = "replace"
    weight: float = 1.0

    def check(self) -> None:
        _check_model_dir(self)
        problem = _float_dtype_problem(self.dtype)
        if problem:
            raise FieldError("dtype", problem)


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
    max_tokens: PositiveInt = 32  # verdict length
    max_model_len: NonNegInt = 0  # grading prompt + verdict; 0: data.max_prompt_length + rollout.response_length + 512
    max_num_seqs: PositiveInt = 64
    num_pages: NonNegInt = 0  # 0: sized by kv_cache_memory_fraction
    kv_cache_memory_fraction: OpenUnitFloat = 0.1
    combine: Literal["replace", "add"] = "replace"
    weight: float = 1.0

    def check(self) -> None:
        _check_model_dir(self)
        problem = _float_dtype_problem(self.dtype)
        if problem:
            raise FieldError("dtype", problem)
        if self.num_pages == 1:
            raise FieldError("num_pages", "0 (automatic) or >= 2 (page 0 is reserved), got 1")


@dataclass
class RewardConfig:
    """How rule rewards are computed (`rljax.rewards.manager.RewardManager`).

    `mode`: `process` runs every reward function in worker processes (a hang is a timeout
    after `timeout_s`, a crash a counted failure); `inline` runs the built-in scorers in the
    trainer's process (faster; `timeout_s` is enforced there with SIGALRM), while a custom
    function still runs in worker processes unless `trust_custom_reward` is true.
    `max_consecutive_failed_steps`: a reward that fails on every sample of that many batches
    in a row stops the run with an error naming the function (0: never)."""

    custom_reward_function: CustomRewardFunction = field(default_factory=CustomRewardFunction)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    reward_model: RewardModelSection = field(default_factory=RewardModelSection)
    verifier: VerifierSection = field(default_factory=VerifierSection)
    mode: Literal["process", "inline"] = "process"
    timeout_s: PositiveFloat = 10.0
    num_workers: PositiveInt = 2
    trust_custom_reward: bool = False  # inline mode: run the custom function in the trainer's process too
    max_consecutive_failed_steps: NonNegInt = 3

    def check(self) -> None:
        if self.trust_custom_reward and self.mode != "inline":
            raise FieldError("trust_custom_reward", f"only with reward.mode=inline (mode is {self.mode!r}, "
                                                    "where every function runs in worker processes)")


@dataclass
class WarmupSFTConfig:
    """An SFT phase before RL (the quickstart's warm-up): `steps` optimizer steps on
    `train_files` (SFT format) from the configured model."""

    enable: bool = False
    train_files: list[str] = field(default_factory=list)
    steps: PositiveInt = 100
    batch_size: PositiveInt = 32
    lr: NonNegFloat = 1e-3

    def check(self) -> None:
        if self.enable and not self.train_files:
            raise FieldError("train_files", "required when enable is true (SFT-format files)")


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

    def check(self) -> None:
        """What needs more than one section (run by `rljax.config.check_config` after every
        section's own checks; keys here are full dotted keys)."""
        check_algorithm(self.trainer.algorithm, "RL", RL_ALGORITHMS, SUPERVISED_ALGORITHMS, "a supervised")
        check_mesh_shape(self.mesh)
        r, alg = self.rollout, self.algorithm
        batch, batch_key = self.data.batch_size, batch_size_key(self.data)
        for section in self._learners():
            mini = getattr(self, section).ppo_mini_batch_size
            if batch % mini:
                raise ConfigError(f"{batch_key}={batch} is not a multiple of {section}.ppo_mini_batch_size={mini} "
                                  "(prompts per optimizer step)")
            micro = getattr(self, section).ppo_micro_batch_size_per_device
            if micro and (mini * r.n) % micro:
                raise ConfigError(f"{section}.ppo_micro_batch_size_per_device={micro} does not divide the mini-batch "
                                  f"of {mini}x{r.n}={mini * r.n} rows ({section}.ppo_mini_batch_size x rollout.n)")
        if alg.adv_estimator in GROUP_BASELINE_ESTIMATORS and r.n < 2:
            raise ConfigError(f"rollout.n: 1 sample per prompt leaves algorithm.adv_estimator={alg.adv_estimator} "
                              "no group to compare with (every advantage is 0); use rollout.n >= 2")
        buffer = self.reward.overlong_buffer
        if buffer.enable and buffer.len > r.response_length:
            raise ConfigError(f"reward.overlong_buffer.len={buffer.len}: must be in [1, "
                              f"rollout.response_length={r.response_length}]")
        fg = alg.filter_groups
        if fg.enable and fg.metric == "seq_final_reward" and alg.use_kl_in_reward:
            raise ConfigError("algorithm.filter_groups.metric=seq_final_reward: groups are filtered before the "
                              "KL-in-reward penalty exists; use seq_reward (the score) or turn use_kl_in_reward off")
        if self.agent:
            from rljax.agent.config import AgentConfig

            try:
                AgentConfig.from_dict(self.agent, "agent")
            except (ValueError, TypeError) as e:
                raise ConfigError(str(e)) from None

    def check_run(self, num_devices: int | None = None) -> None:
        """Before the run: the resume checkpoint, and sizes against the data-parallel size
        (data x fsdp) of the mesh on `num_devices` (when given): every mini-batch and
        micro-batch is split over it."""
        self.trainer.check_run()
        if num_devices is None:
            return
        ways = data_parallel_size(self.mesh, num_devices)
        n = self.rollout.n
        rows = self.data.batch_size * n
        if rows % ways:
            raise ConfigError(f"{batch_size_key(self.data)}={self.data.batch_size}: the step's {self.data.batch_size}x"
                              f"{n}={rows} rows are not divisible by the data-parallel size {ways} "
                              f"(mesh data x fsdp on {num_devices} devices)")
        for section in self._learners():
            mini = getattr(self, section).ppo_mini_batch_size
            micro = getattr(self, section).ppo_micro_batch_size_per_device
            mini_rows = mini * n
            if not micro:
                if mini_rows % ways:
                    raise ConfigError(f"{section}.ppo_mini_batch_size={mini}: the mini-batch of {mini}x{n}={mini_rows} "
                                      f"rows is not divisible by the data-parallel size {ways} "
                                      f"(mesh data x fsdp on {num_devices} devices)")
            elif mini_rows % (micro * ways):
                raise ConfigError(f"{section}.ppo_micro_batch_size_per_device={micro}: micro-batches of {micro}x{ways}="
                                  f"{micro * ways} rows (per device x data-parallel size on {num_devices} devices) "
                                  f"do not divide the mini-batch of {mini}x{n}={mini_rows} rows")

    def _learners(self) -> tuple[str, ...]:
        """The trained sections: the actor, and the critic when the advantages need values."""
        return ("actor", "critic") if self.algorithm.adv_estimator == "gae" else ("actor",)
