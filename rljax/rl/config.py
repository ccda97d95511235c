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

from rljax.data.config import DataConfig
from rljax.parallel import MeshConfig
from rljax.train.optim import OptimConfig
from rljax.train.run_config import ModelSection, TrainerConfig


@dataclass
class PolicyLossSection:
    loss_mode: str = "vanilla"  # any name in rljax.algos POLICY_LOSS_REGISTRY
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 1.0


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
    kl_loss_type: str = "low_var_kl"
    policy_loss: PolicyLossSection = field(default_factory=PolicyLossSection)
    use_rollout_log_probs: bool = False  # old log-probs = the sampler's (skip the recompute)
    # Truncated importance sampling between trainer and rollout log-probs (None: off).
    tis_imp_ratio_cap: float | None = None
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))


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
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # any name in ADV_ESTIMATOR_REGISTRY
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)


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
