"""The rollout producer: batches of prompts in, scored rollouts out, each sample stamped
with the policy version that sampled it (`Sample.policy_version`).

    producer.submit(prompts, policy_version, params)   # a step's prompts, to be sampled
    rollout = producer.collect()                        # the oldest submitted batch, scored

A policy version is the number of learner steps whose updates the sampler's weights
hold (the trainer's `step_count`: step k samples with the weights of k steps). `SyncProducer`
is the depth-0 producer: `submit` samples at once with the sampler's current weights,
and the trainer collects before it updates, so every sample is on-policy. A producer
with depth d would let `collect` return batches sampled up to d versions ago; the
learner reads the version off each sample.

A rollout of sampling and scoring is `Generation.rollout` (`rljax.rl.generation`); on top of
it a producer runs, as the config asks, DAPO's dynamic sampling (`rljax.rl.scoring.
dynamic_sampling`: more generation batches, drawing further prompts from the data, until enough
informative groups) or ReMax's greedy rollout (each sample's `baseline`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Protocol

import numpy as np

from rljax.rl.config import FilterGroupsConfig
from rljax.rl.scoring import ScoredRollout, dynamic_sampling
from rljax.rollout.params import SamplingParams

Prompts = dict[str, list]  # a batch of the RL data's prompt rows
# (prompts, sampling params, group offset) -> the scored samples of one rollout
RolloutFn = Callable[[Prompts, SamplingParams, int], ScoredRollout]


class RolloutProducer(Protocol):
    """What a learner reads rollouts from."""

    def submit(self, prompts: Prompts, policy_version: int, params: SamplingParams) -> None:
        """Queue a batch of prompts, sampled with `params` by the policy of `policy_version`."""

    def collect(self) -> ScoredRollout:
        """The oldest submitted batch's rollout (blocks until it is done)."""


class SyncProducer:
    """Depth 0: `submit` samples and scores the prompts with the sampler's weights of the
    moment (those of `policy_version`); `collect` hands rollouts back in submission order."""

    def __init__(self, run_rollout: RolloutFn, more_prompts: Callable[[], Prompts], num_groups: int,
                 filter_groups: FilterGroupsConfig | None = None, greedy_baseline: bool = False):
        self.run_rollout = run_rollout
        self.more_prompts = more_prompts  # dynamic sampling's further prompt batches
        self.num_groups = num_groups  # prompts per step (groups of rollout.n samples)
        self.filter_groups = filter_groups  # DAPO's dynamic sampling; None: one rollout
        self.greedy_baseline = greedy_baseline  # ReMax: a greedy rollout gives each sample its baseline
        self._done: collections.deque[ScoredRollout] = collections.deque()

    def submit(self, prompts: Prompts, policy_version: int, params: SamplingParams) -> None:
        rollout = self._produce(prompts, params)
        for s in rollout.samples:
            s.policy_version = policy_version
        self._done.append(rollout)

    def collect(self) -> ScoredRollout:
        if not self._done:
            raise RuntimeError("collect() before submit(): no batch of prompts is pending")
        return self._done.popleft()

    def _produce(self, prompts: Prompts, params: SamplingParams) -> ScoredRollout:
        def rollout_of(batch: Prompts, offset: int) -> ScoredRollout:
            return self.run_rollout(batch, params, offset)

        if self.filter_groups is not None:  # the submitted prompts first, then the data's next ones
            pending = [prompts]
            fg = self.filter_groups
            return dynamic_sampling(lambda: pending.pop() if pending else self.more_prompts(), rollout_of,
                                    self.num_groups, fg.max_num_gen_batches, fg.metric)
        rollout = rollout_of(prompts, 0)
        if self.greedy_baseline:  # one greedy sample per prompt, with the same weights
            base = self.run_rollout(prompts, dataclasses.replace(params, n=1, temperature=0.0), 0)
            baselines = {s.group_id: s.score for s in base.samples}
            rollout.metrics["critic/reward_baseline/mean"] = float(np.mean(list(baselines.values())))
            for s in rollout.samples:
                s.baseline = baselines[s.group_id]
        return rollout
