"""Prompts -> scored samples: generation with the sampler, decoding for the reward
function only, scoring by the configured reward sources (`rljax.rewards.sources`), and
DAPO's dynamic sampling.

Token ids flow from the sampler to the training batch untouched; responses are decoded
only to hand a string to `compute_score`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from rljax.metrics import reduce_metrics
from rljax.rewards.overlong import apply_overlong_penalty
from rljax.rewards.result import RewardResult
from rljax.rewards.sources import RewardBatch, RewardSources, check_finite
from rljax.rl.batch import Sample
from rljax.rl.config import OverlongBufferConfig, RLConfig
from rljax.rollout.params import SamplingParams


@dataclass
class PendingScores:
    """What a rollout's samples still need from the reward sources that score a whole batch
    at once (a reward model over the training mesh, after the replicas' results are
    gathered): their `RewardBatch`, the score so far (the rule's), what is added after the
    sources (an agent episode's tool / environment rewards; 0 for a single turn), and the
    response budget that overlong shaping measures against."""

    batch: RewardBatch
    scores: np.ndarray  # float32 [N]
    bonus: np.ndarray  # float64 [N]
    max_length: int

    @staticmethod
    def concat(parts: "list[PendingScores]") -> "PendingScores":
        lengths = {p.max_length for p in parts}
        if len(lengths) != 1:
            raise ValueError(f"pending scores with different response budgets {sorted(lengths)}")
        prompts = None if any(p.batch.prompts is None for p in parts) else [x for p in parts for x in p.batch.prompts]
        batch = RewardBatch([x for p in parts for x in p.batch.items],
                            [x for p in parts for x in p.batch.sequences], prompts)
        return PendingScores(batch, np.concatenate([p.scores for p in parts]).astype(np.float32),
                             np.concatenate([p.bonus for p in parts]), lengths.pop())


@dataclass
class ScoredRollout:
    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)  # per-sample info for evaluation
    pending: PendingScores | None = None  # set while batch-wide sources have not scored it (`settle`)


def assign_scores(rollout: ScoredRollout, batch: RewardBatch, result: RewardResult, bonus: np.ndarray,
                  max_length: int, buffer: OverlongBufferConfig | None, defer: bool = False) -> ScoredRollout:
    """The reward sources' `result` for `rollout`'s samples (in order): each sample's score
    is ``result + bonus``, then DAPO's overlong shaping against `max_length` (`buffer`),
    into `Sample.score` and the records (with the sources' per-sample extras); the sources'
    metrics join the rollout's. `defer`: the result is a first part's (the rule's), more
    sources score the gathered batch later (`settle`): the shaping waits for them."""
    with np.errstate(over="ignore", invalid="ignore"):
        totals = (np.asarray(result.scores, np.float32).astype(np.float64) + bonus).astype(np.float32)
    if np.any(bonus):
        check_finite(totals, batch, "the episode reward (task reward + tool / environment rewards)")
    rollout.metrics.update(result.metrics)
    if defer:
        rollout.pending = PendingScores(batch, np.asarray(result.scores, np.float32), bonus, max_length)
    else:
        rollout.pending = None
        if buffer is not None:
            totals = overlong_shaping(totals, rollout.samples, max_length, buffer, rollout.metrics)
    for s, score, record in zip(rollout.samples, totals, rollout.records):
        s.score = float(score)
        record["score"] = float(score)
    for key, values in result.extras.items():
        for record, value in zip(rollout.records, values):
            record[key] = value
    return rollout


def settle(rollout: ScoredRollout, rest: RewardSources | None, buffer: OverlongBufferConfig) -> ScoredRollout:
    """A rollout scored by a first part of the sources (`assign_scores(defer=True)`), scored
    by the `rest` of them over the whole batch and shaped: as if all had scored it at once."""
    pending = rollout.pending
    if pending is None:
        return rollout
    result = rest.score(pending.batch, running=pending.scores) if rest is not None else RewardResult(pending.scores)
    return assign_scores(rollout, pending.batch, result, pending.bonus, pending.max_length, buffer)


def generate_and_score(
    generate: Callable[[list[list[int]], SamplingParams], list],
    rewards: RewardSources,
    tokenizer,
    prompts: dict[str, list],
    params: SamplingParams,
    cfg: RLConfig,
    group_offset: int = 0,
    defer: bool = False,
) -> ScoredRollout:
    """Sample `params.n` responses per prompt and score them with `rewards` (the rule or
    custom function, then a reward model / verifier when configured); group ids start at
    `group_offset` so several generation batches can share one batch."""
    # prompt i samples stream params.stream + group_offset + i (Sampler.generate numbers from the base)
    completions = generate(prompts["prompt_ids"], dataclasses.replace(params, stream=params.stream + group_offset))
    return score_completions(completions, rewards, tokenizer, prompts, cfg, group_offset, defer)


def score_completions(completions: list, rewards: RewardSources, tokenizer, prompts: dict[str, list], cfg: RLConfig,
                      group_offset: int = 0, defer: bool = False) -> ScoredRollout:
    """Score the sampler's completions of `prompts` (each completion's `request_index` is
    its prompt's row; group ids are `group_offset` + row) with `rewards`; each sample's
    `policy_version` is the oldest version among its tokens' (`Completion.policy_versions`).
    `defer`: `rewards` are the first part of the run's sources; the rest score the gathered
    batch (`settle`)."""
    items, samples, records = [], [], []
    for c in completions:
        i = int(c.request_index)
        text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
        items.append({
            "data_source": prompts["data_source"][i],
            "solution_str": text,
            "ground_truth": prompts["ground_truth"][i],
            "extra_info": prompts["extra_info"][i],
            "uid": group_offset + i,
        })
        samples.append(Sample(
            prompt_ids=list(c.prompt_token_ids), response_ids=list(c.token_ids),
            response_mask=[1] * len(c.token_ids), response_log_probs=list(c.log_probs),
            group_id=group_offset + i, truncated=c.finish_reason == "length", expert_ids=c.expert_ids,
            policy_version=min(c.policy_versions) if getattr(c, "policy_versions", None) else None,
        ))
        records.append({"data_source": prompts["data_source"][i], "prompt_index": group_offset + i,
                        "solution_str": text})
    raw = prompts.get("raw_prompt")
    batch = RewardBatch(items, [s.prompt_ids + s.response_ids for s in samples],
                        None if raw is None else [raw[int(c.request_index)] for c in completions])
    return assign_scores(ScoredRollout(samples, {}, records), batch, rewards.score(batch),
                         np.zeros(len(samples)), cfg.rollout.response_length, cfg.reward.overlong_buffer,
                         defer)


SCORE_METRICS = ("score", "seq_reward", "seq_final_reward")  # verl's names for the sequence score


def group_metric(rollout: ScoredRollout, metric: str) -> list[float]:
    """Per sample, the value DAPO's dynamic sampling compares within a group
    (`algorithm.filter_groups.metric`, verl's names): `score` / `seq_reward` /
    `seq_final_reward` the sample's reward (KL-in-reward is applied later, so the
    three coincide here; the config refuses `seq_final_reward` with `use_kl_in_reward`),
    any other name a per-sample value the reward function returns (e.g. `acc`)."""
    if metric in SCORE_METRICS:
        return [s.score for s in rollout.samples]
    values = [r.get(metric) for r in rollout.records]
    if any(v is None for v in values):
        known = sorted(set().union(*(r.keys() for r in rollout.records)) - {"data_source", "prompt_index",
                                                                             "solution_str"})
        raise KeyError(f"algorithm.filter_groups.metric={metric!r}: the reward returns no {metric!r} for every "
                       f"sample (per-sample values: {known + list(SCORE_METRICS[1:])})")
    return [float(v) for v in values]


def overlong_shaping(scores, samples: list[Sample], max_length: int, buffer: OverlongBufferConfig,
                     metrics: dict[str, float]) -> np.ndarray:
    """DAPO's overlong reward shaping (`reward.overlong_buffer`) of the scores, from each
    sample's whole response length (for agent episodes: sampled turns and observations,
    against the episode's response budget `max_length`); its metrics go into `metrics`."""
    scores = np.asarray(scores, np.float32)
    if not buffer.enable:
        return scores
    lengths = np.asarray([len(s.response_ids) for s in samples])
    scores, _, overlong_metrics = apply_overlong_penalty(scores, lengths, max_length, buffer.len,
                                                         buffer.penalty_factor)
    metrics.update(overlong_metrics)
    return scores


def keep_informative_groups(samples: list[Sample], values: list[float]) -> tuple[list[int], list[int]]:
    """DAPO dynamic sampling: group ids whose `values` (one per sample) vary (kept) and
    whose values are all equal (zero advantage under GRPO; dropped)."""
    by_group: dict[int, list[float]] = {}
    for s, v in zip(samples, values):
        by_group.setdefault(s.group_id, []).append(v)
    kept = [g for g, v in by_group.items() if max(v) > min(v)]
    dropped = [g for g, v in by_group.items() if max(v) == min(v)]
    return kept, dropped


def dynamic_sampling(
    next_prompts: Callable[[], dict[str, list]],
    run_rollout: Callable[[dict[str, list], int], ScoredRollout],
    num_groups: int,
    max_gen_batches: int,
    metric: str = "score",
) -> ScoredRollout:
    """Generate batches until `num_groups` informative groups (whose `metric` varies, see
    `group_metric`) are collected (DAPO §3.2), at most `max_gen_batches`; a short batch is
    topped up with uninformative groups so the batch shape never changes (counted in
    `train/filter_groups_underfilled`). The batches' metrics combine by their declared
    reductions (`rljax.metrics.reduce_metrics`), a batch's means weighted by its samples:
    a fraction stays a fraction over every generated sample, a count adds up."""
    kept_samples: list[Sample] = []
    spare: list[Sample] = []
    batch_metrics: list[dict[str, float]] = []
    batch_sizes: list[int] = []
    records: list[dict] = []
    offset = gen_batches = 0
    kept_groups = 0
    while kept_groups < num_groups and gen_batches < max_gen_batches:
        rollout = run_rollout(next_prompts(), offset)
        gen_batches += 1
        offset += num_groups
        kept, dropped = keep_informative_groups(rollout.samples, group_metric(rollout, metric))
        take = set(kept[: num_groups - kept_groups])
        kept_groups += len(take)
        kept_samples += [s for s in rollout.samples if s.group_id in take]
        spare += [s for s in rollout.samples if s.group_id in set(dropped)]
        records += rollout.records
        batch_metrics.append(rollout.metrics)
        batch_sizes.append(len(rollout.samples))
    missing = num_groups - kept_groups
    if missing:
        fill = sorted({s.group_id for s in spare})[:missing]
        kept_samples += [s for s in spare if s.group_id in set(fill)]
    metrics = reduce_metrics(batch_metrics, batch_sizes)
    metrics["train/num_gen_batches"] = float(gen_batches)
    metrics["train/filter_groups_underfilled"] = float(missing)
    return ScoredRollout(kept_samples, metrics, records)
