"""The generation side of the RL loop, built from the config: the sampler, the reward
manager and one "round" function (sample `params.n` responses per prompt and score them,
single-turn or as agent episodes). The trainer and `rljax eval` both build them here."""

from __future__ import annotations

import dataclasses
from typing import Callable

from rljax.rewards.manager import RewardManager
from rljax.rl.agent_rollout import agent_generate_and_score
from rljax.rl.config import RLConfig
from rljax.rl.rollout import ScoredRollout, generate_and_score
from rljax.rollout.config import KVCacheConfig, SamplerConfig
from rljax.rollout.params import SamplingParams
from rljax.rollout.sampler import Sampler

RoundFn = Callable[[dict, SamplingParams, int], ScoredRollout]  # (prompts, params, group offset)


def make_sampler(cfg: RLConfig, decoder) -> Sampler:
    r = cfg.rollout
    return Sampler(decoder, SamplerConfig(
        max_num_seqs=r.max_num_seqs, max_num_batched_tokens=r.max_num_batched_tokens,
        max_model_len=cfg.data.max_prompt_length + r.response_length,
        kv_cache=KVCacheConfig(page_size=r.page_size, num_pages=r.num_pages or None,
                               memory_fraction=r.kv_cache_memory_fraction),
        enable_prefix_caching=r.enable_prefix_caching, seed=r.seed))


def make_reward_manager(cfg: RLConfig) -> RewardManager:
    r = cfg.reward
    custom = r.custom_reward_function
    return RewardManager.from_config(
        {"mode": r.mode, "num_workers": r.num_workers, "timeout_s": r.timeout_s,
         "trust_custom_reward": r.trust_custom_reward, "max_consecutive_failed_steps": r.max_consecutive_failed_steps},
        dataclasses.asdict(custom) if custom.path else None)


def make_round_fn(sampler: Sampler, rewards: RewardManager, tokenizer, cfg: RLConfig, agent=None,
                  model_rewards=None) -> RoundFn:
    """`round(prompts, params, offset) -> ScoredRollout`: agent episodes when `agent` (an
    `AgentConfig`) is given, else single-turn sampling; scored by `rewards`, plus
    `model_rewards` (reward model / verifier) when given."""
    if agent is not None:
        return lambda prompts, params, offset: agent_generate_and_score(
            sampler, rewards, tokenizer, prompts, params, agent, offset, model_rewards, cfg.reward.overlong_buffer)
    return lambda prompts, params, offset: generate_and_score(
        sampler.generate, rewards, tokenizer, prompts, params, cfg, offset, model_rewards)
