"""The RL run config (PPO, GRPO and relatives), named as verl names it.

A verl recipe ports key by key: `data.train_batch_size` (prompts per step),
`actor.ppo_mini_batch_size` (prompts per optimizer step), `actor.ppo_epochs`,
`rollout.n`, `algorithm.adv_estimator`, `actor.policy_loss.loss_mode`,
`actor.loss_agg_mode`, `actor.use_kl_loss`, `actor.kl_loss_type`,
`algorithm.use_kl_in_reward`, `actor.entropy_coeff`, `actor.clip_ratio_low/high`, ...
Sizes in prompts are multiplied by `rollout.n` to get rows, as in verl.

Every value is checked when the config is loaded (`rljax.config.check_config`): numeric
ranges from the field types (`PositiveInt`, `UnitFloat`, ...), closed sets as `Literal`s
(`algorithm.kl_ctrl.type`, `reward.mode`, ...), registry names (loss_agg_mode,
adv_estimator, loss_mode, KL types) with the valid names listed, the `agent:` section
(`rljax.agent.AgentConfig`, null for single-turn) and the sizes that must divide
(`RLConfig.check`). `rljax.config.validate(cfg, num_devices)` adds
the checks that need the machine (`RLConfig.check_run`: the device count, the resume
checkpoint): call it before building anything.

What the run builds from the sections is derived here, once: the row length and its
padding bucket (`RLConfig.row_length`, `RLConfig.row_bucket`), the sampler's engine
settings (`RLConfig.sampler_config`, and the reward verifier's,
`RLConfig.verifier_sampler_config`) and the requests' sampling params
(`RLConfig.sampling_params`).

The sections live in their own modules (`actor_config`, `rollout_config`,
`algorithm_config`, `reward_config`; `model` and `trainer` in `rljax.train.run_sections`,
shared with the supervised `RunConfig`) and are importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rljax.agent.config import AgentConfig
from rljax.algos.kl import FULL_KL
from rljax.algos.registry import get_adv_estimator
from rljax.config import ConfigError, FieldError, NonNegFloat, Rows, Steps, alias, from_dict
from rljax.data.config import DataConfig
from rljax.parallel import MeshConfig
from rljax.rl.actor_config import ActorConfig, CriticConfig, PolicyLossConfig
from rljax.rl.algorithm_config import (
    AlgorithmConfig,
    FilterGroupsConfig,
    KLControlConfig,
    RolloutCorrectionConfig,
)
from rljax.rl.reward_config import (
    CustomRewardFunction,
    OverlongBufferConfig,
    RewardConfig,
    RewardModelConfig,
    VerifierConfig,
)
from rljax.rl.async_config import AsyncConfig, RLTrainerConfig, check_mode, check_processes, device_counts
from rljax.rl.presets import PRESETS, preset_tree
from rljax.rl.request_streams import TRAIN, VALIDATION, request_stream
from rljax.rl.rollout_config import RolloutConfig, TopK, ValKwargs
from rljax.rollout.config import KVCacheConfig, SamplerConfig
from rljax.rollout.params import SamplingParams
from rljax.train.run_sections import (
    RL_ALGORITHMS,
    SUPERVISED_ALGORITHMS,
    ModelRunConfig,
    TrainerConfig,
    batch_size_key,
    check_algorithm,
    check_mesh_shape,
    data_parallel_size,
)

__all__ = [
    "RLConfig", "RL_ALGORITHMS", "WarmupSFTConfig", "AgentConfig", "ModelRunConfig",
    "TrainerConfig", "ActorConfig", "CriticConfig", "PolicyLossConfig", "RolloutConfig", "ValKwargs",
    "AlgorithmConfig", "KLControlConfig", "FilterGroupsConfig", "RolloutCorrectionConfig", "RewardConfig",
    "OverlongBufferConfig", "CustomRewardFunction", "RewardModelConfig", "VerifierConfig", "FULL_KL", "TopK",
    "RLTrainerConfig", "AsyncConfig",
]

# estimators whose baseline is the group's own mean: one sample per prompt gives zero advantages


@dataclass
class WarmupSFTConfig:
    """An SFT phase before RL (the quickstart's warm-up): `steps` optimizer steps on
    `train_files` (SFT format) from the configured model."""

    enable: bool = False  # run the SFT phase first
    train_files: list[str] = field(default_factory=list)  # SFT-format files (messages)
    steps: Steps = 100  # optimizer steps of the phase
    batch_size: Rows = 32  # rows per step
    lr: NonNegFloat = 1e-3  # its constant learning rate

    def check(self) -> None:
        if self.enable and not self.train_files:
            raise FieldError("train_files", "required when enable is true (SFT-format files)")


@dataclass
class RLConfig:
    """The RL run: one field per top-level YAML section (see the module docstring)."""

    model: ModelRunConfig = field(default_factory=ModelRunConfig)  # the policy (and the reference, a frozen copy)
    data: DataConfig = field(default_factory=lambda: DataConfig(format="rl"))  # prompts; data.batch_size in prompts
    actor: ActorConfig = field(default_factory=ActorConfig)  # the policy's training
    critic: CriticConfig = field(default_factory=CriticConfig)  # the value model (algorithm.adv_estimator=gae)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)  # sampling
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)  # advantages, KL in reward, filtering
    reward: RewardConfig = field(default_factory=RewardConfig)  # how responses are scored
    trainer: RLTrainerConfig = field(default_factory=lambda: RLTrainerConfig(algorithm="grpo"))  # the loop
    mesh: MeshConfig = field(default_factory=MeshConfig)  # device mesh (data x fsdp x tensor)
    warmup_sft: WarmupSFTConfig = field(default_factory=WarmupSFTConfig)  # an SFT phase before RL
    agent: AgentConfig | None = None  # multi-turn agent rollouts (tools or an environment); null: single-turn
    # the asynchronous modes' settings (trainer.mode; YAML key `async`)
    async_: AsyncConfig = field(default_factory=AsyncConfig, metadata=alias("async"))

    @classmethod
    def defaults_for(cls, raw: dict) -> RLConfig | None:
        """The config the keys absent from `raw` (a YAML mapping with its overrides) take
        their values from: the dataclass defaults under the preset of `raw`'s
        `trainer.algorithm` (`rljax.rl.presets`; unset: `grpo`) and, when `raw` sets nothing
        under `algorithm.rollout_correction`, that of its `trainer.mode`. None for a name
        without a preset (`check` then names the valid ones). Called by
        `rljax.config.from_dict`."""
        base = cls()
        trainer = raw.get("trainer") if isinstance(raw.get("trainer"), dict) else {}
        name = trainer.get("algorithm", base.trainer.algorithm)
        if not isinstance(name, str) or name not in PRESETS:
            return None
        algorithm = raw.get("algorithm") if isinstance(raw.get("algorithm"), dict) else {}
        mode = None if algorithm.get("rollout_correction") else trainer.get("mode")
        return from_dict(cls, preset_tree(name, mode if isinstance(mode, str) else None), base=base)

    def check(self) -> None:
        """What needs more than one section (run by `rljax.config.check_config` after every
        section's own checks; keys here are full dotted keys)."""
        check_algorithm(self.trainer.algorithm, "RL", RL_ALGORITHMS, SUPERVISED_ALGORITHMS, "a supervised")
        check_mesh_shape(self.mesh)
        check_mode(self)
        r, alg = self.rollout, self.algorithm
        if self.mesh.num_slices > 1 and r.allow_cross_host_replicas:
            raise ConfigError(f"rollout.allow_cross_host_replicas: a replica stays inside a slice, and this run has "
                              f"mesh.dcn_data x mesh.dcn_fsdp = {self.mesh.num_slices} of them")
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
        needed = get_adv_estimator(alg.adv_estimator).min_group_size
        if r.n < needed:
            raise ConfigError(f"rollout.n: {r.n} sample per prompt gives algorithm.adv_estimator={alg.adv_estimator} "
                              f"no other sample to compare with (its group baseline needs rollout.n >= {needed})")
        buffer = self.reward.overlong_buffer
        if buffer.enable and buffer.len > r.response_length:
            raise ConfigError(f"reward.overlong_buffer.len={buffer.len}: must be in [1, "
                              f"rollout.response_length={r.response_length}]")
        fg = alg.filter_groups
        if fg.enable and fg.metric == "seq_final_reward" and alg.use_kl_in_reward:
            raise ConfigError("algorithm.filter_groups.metric=seq_final_reward: groups are filtered before the "
                              "KL-in-reward penalty exists; use seq_reward (the score) or turn use_kl_in_reward off")

    def check_run(self, num_devices: int | None = None) -> None:
        """Before the run: the resume checkpoint, and sizes against the data-parallel size
        (data x fsdp) of the mesh on `num_devices` (when given): every mini-batch and
        micro-batch is split over it."""
        self.trainer.check_run()
        import jax  # the process count of an initialised multi-process run

        processes = jax.process_count()
        if processes > 1 and not self.rollout.tensor_parallel_size:
            raise ConfigError("rollout.tensor_parallel_size: 0 samples on the training mesh, which a run of "
                              f"{processes} processes cannot do (each would schedule programs over all hosts); "
                              "set it to the devices per rollout replica (e.g. 1)")
        check_processes(self, processes, jax.local_device_count())
        if num_devices is None:
            return
        # the asynchronous modes split the devices: the rollout replicas' share and the trainer's mesh
        num_devices, rollout_devices = device_counts(self, num_devices, processes)
        tp, dp = self.rollout.tensor_parallel_size, self.rollout.data_parallel_size
        if tp and (rollout_devices % tp or (dp or rollout_devices // tp) * tp > rollout_devices):
            raise ConfigError(f"rollout.tensor_parallel_size={tp} x rollout.data_parallel_size={dp or 'auto'}: "
                              f"replicas of {tp} devices must fit the {rollout_devices} rollout devices and tp "
                              "must divide them")
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

    # ---- derived values (what the run builds from the sections) ---------------------------

    @property
    def row_length(self) -> int:
        """Tokens of one RL row, `data.max_prompt_length + rollout.response_length`: the
        step batch's widest padded length and the sampler's `max_model_len`."""
        return self.data.max_prompt_length + self.rollout.response_length

    @property
    def row_bucket(self) -> int:
        """A step batch is padded to the next multiple of this (capped at `row_length`):
        `data.bucket_size`, or `row_length` when it is 0 (every batch padded to the row)."""
        return self.data.bucket_size or self.row_length

    @property
    def rollout_weight_dtype(self) -> str:
        """The dtype the rollout replicas hold the weights in (`rollout.weight_dtype`, else
        the model's compute dtype)."""
        return self.rollout.weight_dtype or self.model.compute_dtype

    def sampler_config(self) -> SamplerConfig:
        """The engine settings of the run's sampler (each rollout replica's), from the
        `rollout` section; routing is recorded for `actor.router_replay`."""
        r = self.rollout
        return SamplerConfig(
            max_num_seqs=r.max_num_seqs, max_num_batched_tokens=r.max_num_batched_tokens,
            max_model_len=self.row_length,
            kv_cache=KVCacheConfig(page_size=r.page_size, num_pages=r.num_pages or None,
                                   memory_fraction=r.kv_cache_memory_fraction),
            enable_prefix_caching=r.enable_prefix_caching, num_scheduler_steps=r.num_scheduler_steps,
            mixed_steps=r.mixed_steps, attention=r.attention, share_programs=r.share_programs, seed=r.seed,
            record_routing=self.actor.router_replay)

    def verifier_sampler_config(self) -> SamplerConfig:
        """The engine settings of the generative verifier's sampler (`reward.verifier`):
        its own sequences, pool and length (0: the row plus 512 tokens of grading
        template and verdict), the rollout's prefill budget, page size and seed."""
        r, v = self.rollout, self.reward.verifier
        return SamplerConfig(
            max_num_seqs=v.max_num_seqs, max_num_batched_tokens=r.max_num_batched_tokens,
            max_model_len=v.max_model_len or self.row_length + 512,
            kv_cache=KVCacheConfig(page_size=r.page_size, num_pages=v.num_pages or None,
                                   memory_fraction=v.kv_cache_memory_fraction),
            share_programs=r.share_programs, seed=r.seed)

    def sampling_params(self, step: int = 0, validation: bool = False) -> SamplingParams:
        """The rollout's sampling params at `step`: seed `rollout.seed`, up to
        `rollout.response_length` tokens, and streams starting at `request_stream(TRAIN,
        step, 0)` (a rollout's prompt i then samples stream base + group offset + i).
        Validation samples by `rollout.val_kwargs` on the same streams at every step
        (common random numbers: a change in validation accuracy between steps is the
        policy's, not the noise's)."""
        r = self.rollout
        if validation:
            v = r.val_kwargs
            return SamplingParams(n=v.n, temperature=v.temperature, top_p=v.top_p, top_k=v.top_k,
                                  max_tokens=r.response_length, seed=r.seed, stream=request_stream(VALIDATION, 0, 0))
        return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, min_p=r.min_p,
                              max_tokens=r.response_length, seed=r.seed, stream=request_stream(TRAIN, step, 0))

    def _learners(self) -> tuple[str, ...]:
        """The trained sections: the actor, and the critic when the advantages need values."""
        return ("actor", "critic") if get_adv_estimator(self.algorithm.adv_estimator).needs_critic else ("actor",)
