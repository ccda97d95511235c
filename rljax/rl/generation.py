"""The generation side of the RL loop, built from the config: the sampler (or the rollout
replicas), the reward sources (`make_reward_sources`: the rule or custom function, then a
reward model and a verifier when enabled, combined by `rljax.rewards.sources.RewardSources`)
and one "rollout" function (sample `params.n` responses per prompt and score them,
single-turn or as agent episodes). The trainer and `rljax eval` both build them here, as a
`Generation`.

Layouts (`rollout.tensor_parallel_size`):
- 0: one sampler on the training mesh, reading the trainer's arrays as they are (zero
  copy; one process only: its scheduler feeds programs over the whole mesh);
- tp >= 1: data-parallel replicas of tp devices each (`rljax.rl.replica_rollout`), the
  weights handed off in device memory every step; the only layout for several processes.

With several processes and rollout devices apart from the training mesh (an asynchronous
`trainer.mode`), the weights first cross to the rollout devices in one program over both
sets (`rljax.rollout.cross_transfer.UnionTransfer`; `jax.device_put` cannot move arrays
between disjoint multi-process device sets), then reshard within them (docs/async.md).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

import jax

from rljax.rewards.code import CodeRewardSettings
from rljax.rewards.code_runner import SandboxFusionClient, SandboxLimits
from rljax.rewards.manager import RewardManager
from rljax.rewards.sources import Combine, FunctionSource, RewardSources
from rljax.rl.agent_rollout import agent_generate_and_score
from rljax.rl.async_config import run_split
from rljax.rl.config import RLConfig
from rljax.rl.main_thread import OnMainThread
from rljax.rl.model_rewards import build_model_rewards
from rljax.rl.replica_rollout import ReplicatedRollout
from rljax.rl.scoring import ScoredRollout, generate_and_score, settle
from rljax.rollout.cross_transfer import UnionTransfer
from rljax.rollout.params import SamplingParams
from rljax.rollout.replicas import ReplicaLayout
from rljax.rollout.sampler import Sampler

RolloutFn = Callable[[dict, SamplingParams, int], ScoredRollout]  # (prompts, params, group offset)


def make_sampler(cfg: RLConfig, decoder, manual: bool = False) -> Sampler:
    """The rollout's sampler; `manual`: its engine steps only when told (`Sampler.step`)."""
    return Sampler(decoder, cfg.sampler_config(), manual=manual) if manual else Sampler(decoder, cfg.sampler_config())


def make_reward_manager(cfg: RLConfig) -> RewardManager:
    r = cfg.reward
    custom = r.custom_reward_function
    return RewardManager.from_config(
        {"mode": r.mode, "num_workers": r.num_workers, "timeout_s": r.timeout_s,
         "trust_custom_reward": r.trust_custom_reward, "max_consecutive_failed_steps": r.max_consecutive_failed_steps,
         "on_error": r.on_error, "code_settings": code_reward_settings(r)},
        dataclasses.asdict(custom) if custom.path else None)


def code_reward_settings(r) -> CodeRewardSettings:
    """The code scorers' settings from the `reward:` section (`code`, `sandbox_fusion`)."""
    c, sf = r.code, r.sandbox_fusion
    limits = SandboxLimits(test_timeout_s=c.test_timeout_s, memory_mb=c.memory_mb,
                           sample_timeout_s=c.sample_timeout_s, max_output_bytes=c.max_output_bytes)
    client = None
    if sf.url:
        client = SandboxFusionClient(url=sf.url, max_concurrency=sf.max_concurrency, max_retries=sf.max_retries,
                                     retry_backoff_s=sf.retry_backoff_s, run_timeout_s=sf.run_timeout_s,
                                     memory_limit_mb=sf.memory_limit_mb)
    return CodeRewardSettings(limits=limits, sandbox_fusion=client, continuous=c.continuous)


def make_reward_sources(cfg: RLConfig, tokenizer, policy=None, policy_params: Callable[[], Any] | None = None,
                        mesh=None, replicas=None) -> RewardSources:
    """The run's reward sources, in order: the rule or custom function (`make_reward_manager`),
    then the reward model and the verifier when enabled (`build_model_rewards`), each with
    its `combine` and `weight`. Beside model sources, a data_source with no rule scores 0."""
    manager = make_reward_manager(cfg)
    try:
        models = build_model_rewards(cfg, tokenizer, policy, policy_params, mesh, replicas)
    except BaseException:
        manager.close()
        raise
    return RewardSources([(FunctionSource(manager, zero_where_no_rule=bool(models)), Combine())] + models)


def make_rollout_fn(sampler: Sampler, rewards: RewardSources, tokenizer, cfg: RLConfig, agent=None,
                    defer: bool = False) -> RolloutFn:
    """`rollout(prompts, params, offset) -> ScoredRollout`: agent episodes when `agent` (an
    `AgentConfig`) is given, else single-turn sampling; scored by `rewards` (`defer`: the
    first part of the sources, the rest score the gathered batch: `Generation.settle`)."""
    if agent is not None:
        return lambda prompts, params, offset: agent_generate_and_score(
            sampler, rewards, tokenizer, prompts, params, agent, offset, cfg.reward.overlong_buffer, defer)
    return lambda prompts, params, offset: generate_and_score(
        sampler.generate, rewards, tokenizer, prompts, params, cfg, offset, defer)


def rollout_layout(cfg: RLConfig) -> ReplicaLayout:
    """The replicas of `rollout.tensor_parallel_size` devices: `rollout.data_parallel_size`
    of them (0: all rollout devices / tp) over the first rollout devices in process-major
    order (every device in `trainer.mode=sync`; `rljax.rl.async_config.split_devices`). With
    several processes they must cover the rollout's devices (the hand-off reshards within
    one device set)."""
    r = cfg.rollout
    tp = r.tensor_parallel_size
    share = run_split(cfg).rollout  # every device; the rollout's own share in an asynchronous trainer.mode
    dp = r.data_parallel_size or len(share) // tp
    if dp * tp != len(share) and jax.process_count() > 1:
        raise ValueError(f"rollout.data_parallel_size={dp} x rollout.tensor_parallel_size={tp} must cover all "
                         f"{len(share)} rollout devices in a run of {jax.process_count()} processes")
    devices = share[: dp * tp]
    return ReplicaLayout.create(devices, tp, dp, r.allow_cross_host_replicas)


def cross_transfer(mesh, layout: ReplicaLayout) -> UnionTransfer | None:
    """The union transfer from the training `mesh` to the rollout devices when a run of
    several processes keeps them apart (None: one process, or the same devices; then the
    hand-off's `jax.device_put` moves the weights)."""
    rollout = list(layout.mesh.devices.flat)
    if mesh is None or jax.process_count() == 1 or {d.id for d in rollout} & {d.id for d in mesh.devices.flat}:
        return None
    return UnionTransfer(mesh, rollout)


class OneAtATime:
    """`target`, whose `score(...)` calls run one at a time under `lock` (from any
    thread); every other attribute is `target`'s own."""

    def __init__(self, target: Any, lock: threading.Lock):
        self._target, self._lock = target, lock

    def score(self, *args, **kwargs):
        with self._lock:
            return self._target.score(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class Generation:
    """A run's generation side (module docstring): `rollout(prompts, params, offset)`,
    `update_params(policy params)`, `close()`. `rewards` are its reward sources;
    `policy_params` gives the current weights to a self-verifier (`reward.verifier.path:
    policy`)."""

    def __init__(self, cfg: RLConfig, decoder, tokenizer, agent=None, policy_params: Callable[[], Any] | None = None,
                 mesh=None):
        r = cfg.rollout
        self.cfg, self.tokenizer, self.agent = cfg, tokenizer, agent
        self.sampler = self.replicas = None
        self._score_lock = threading.Lock()
        if r.tensor_parallel_size:
            layout = rollout_layout(cfg)
            if cfg.trainer.mode == "async":  # the stream producer steps the replicas' engines itself
                make = lambda model: make_sampler(cfg, model, manual=True)  # noqa: E731
            else:
                make = lambda model: make_sampler(cfg, model)  # noqa: E731
            self.replicas = ReplicatedRollout(decoder, layout, make, r.response_length, cross_transfer(mesh, layout),
                                              cfg.rollout_weight_dtype)
        else:
            self.sampler = make_sampler(cfg, decoder)
        try:  # a verifier generates on the replicas when there are some
            self.rewards = make_reward_sources(cfg, tokenizer, decoder, policy_params, mesh, self.replicas)
        except BaseException:
            (self.sampler or self.replicas).close()
            raise
        # with replicas, the rule scores each replica's samples where they are sampled; the
        # model sources (whose programs span the training mesh, or every replica) score the gathered batch
        self.rule_rewards, self.batch_rewards = self.rewards.split(1)

    def _rollout_on(self, sampler: Sampler, prompts: dict, params: SamplingParams, offset: int) -> ScoredRollout:
        return make_rollout_fn(sampler, self.replica_rewards(), self.tokenizer, self.cfg, self.agent,
                               defer=self.batch_rewards is not None)(prompts, params, offset)

    def replica_rewards(self) -> RewardSources:
        """The reward sources as the replicas' threads (and the async stream's) reach them
        (`_replica_manager`): the rule alone when model sources score the gathered batch
        (`settle`)."""
        if self.replicas is None:
            return self.rewards
        return self.rule_rewards.with_function_managers(self._replica_manager)

    def settle(self, rollout: ScoredRollout) -> ScoredRollout:
        """A gathered rollout scored by the model sources over the whole batch (a no-op
        when none is configured). Identical on every process; their programs span every
        process's devices, so with several processes they run on the main thread, where
        every process makes its cross-process calls in the same order."""
        if rollout.pending is None:
            return rollout
        fn = lambda: settle(rollout, self.batch_rewards, self.cfg.reward.overlong_buffer)  # noqa: E731
        main = self.replicas.main_thread
        return fn() if jax.process_count() == 1 or main.on_owner else main.call(fn)

    def rollout_with(self, sampler: Sampler) -> RolloutFn:
        """`rollout(prompts, params, offset)` on `sampler` (not the run's replicas), on the calling thread."""
        return lambda prompts, params, offset=0: make_rollout_fn(sampler, self.rewards, self.tokenizer, self.cfg,
                                                                 self.agent)(prompts, params, offset)

    def _replica_manager(self, manager):
        """How the replicas' threads reach a reward manager: through the main thread (an
        inline manager's SIGALRM timeout; every manager in `trainer.mode: sync`), else, in
        an asynchronous mode, one call at a time from the calling thread, so that scoring
        in worker processes overlaps the training on the main thread."""
        if getattr(manager, "inline", True) or self.cfg.trainer.mode == "sync":
            return OnMainThread(manager, self.replicas.main_thread)
        return OneAtATime(manager, self._score_lock)

    def rollout(self, prompts: dict, params: SamplingParams, offset: int = 0) -> ScoredRollout:
        """Sample and score `prompts` (groups numbered from `offset`); with replicas, every
        process returns the whole rollout."""
        if self.replicas is not None:
            return self.settle(self.replicas.run(self._rollout_on, prompts, params, offset))
        return self._rollout_on(self.sampler, prompts, params, offset)

    def update_params(self, params) -> dict[str, float]:
        """New policy weights for the sampler(s); with replicas, the hand-off's cost
        (`memory/update_weights_GiB`: bytes it allocated on the busiest device)."""
        if self.replicas is None:
            self.sampler.update_params(params)
            return {}
        report = self.replicas.update_params(params)
        return {"memory/update_weights_GiB": report.metrics()["memory/update_weights_GiB"]}

    @property
    def num_compiled_programs(self) -> int:
        """Compiled sampler programs, over this process's replicas."""
        samplers = [self.sampler] if self.replicas is None else list(self.replicas.samplers.values())
        return sum(s.num_compiled_programs for s in samplers)

    def close(self) -> None:
        """Release the sampler(s) and the reward sources (worker processes, a verifier's
        sampler); every one is closed even if another fails (the first error is raised)."""
        closers = [self.rewards.close, (self.sampler or self.replicas).close]
        first = None
        for close in closers:
            try:
                close()
            except BaseException as e:  # noqa: PERF203
                first = first or e
        if first is not None:
            raise first
