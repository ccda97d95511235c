"""Prompts -> scored samples: generation with the sampler, decoding for the reward
function only, scoring, and DAPO's dynamic sampling.

Token ids flow from the sampler to the training batch untouched; responses are decoded
only to hand a string to `compute_score`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from rljax.rewards.overlong import apply_overlong_penalty
from rljax.rl.batch import Sample
from rljax.rl.config import RLConfig
from rljax.rollout.params import SamplingParams


@dataclass
class ScoredRollout:
    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)  # per-sample info for evaluation


def sampling_params(cfg: RLConfig, seed: int, validation: bool = False) -> SamplingParams:
    r = cfg.rollout
    if validation:
        v = r.val_kwargs
        return SamplingParams(n=v.n, temperature=v.temperature, top_p=v.top_p, top_k=v.top_k,
                              max_tokens=r.response_length, seed=seed)
    return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, min_p=r.min_p,
                          max_tokens=r.response_length, seed=seed)


def generate_and_score(
    generate: Callable[[list[list[int]], SamplingParams], list],
    reward_manager,
    tokenizer,
    prompts: dict[str, list],
    params: SamplingParams,
    cfg: RLConfig,
    group_offset: int = 0,
    model_rewards=None,
) -> ScoredRollout:
    """Sample `params.n` responses per prompt and score them; group ids start at
    `group_offset` so several generation rounds can share one batch. `model_rewards`
    (`rljax.rl.model_rewards.ModelRewards`, when `reward.reward_model` or
    `reward.verifier` is enabled) adds a reward model's / verifier's scores to the rule
    scores."""
    completions = generate(prompts["prompt_ids"], params)
    items, samples, records = [], [], []
    for c in completions:
        i = int(c.request_index)
        text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
        items.append({
            "data_source": prompts["data_source"][i],
            "solution_str": text,
            "ground_truth": prompts["ground_truth"][i],
            "extra_info": prompts["extra_info"][i],
        })
        samples.append(Sample(
            prompt_ids=list(c.prompt_token_ids), response_ids=list(c.token_ids),
            response_mask=[1] * len(c.token_ids), response_log_probs=list(c.logprobs),
            group_id=group_offset + i, truncated=c.finish_reason == "length",
        ))
        records.append({"data_source": prompts["data_source"][i], "prompt_index": group_offset + i,
                        "solution_str": text})
    if model_rewards is None:
        result = reward_manager.score(items)
    else:
        raw = prompts.get("raw_prompt")
        result = model_rewards.score(reward_manager, items, samples,
                                     None if raw is None else [raw[int(c.request_index)] for c in completions])
    scores = np.asarray(result.scores, np.float32)
    metrics = dict(result.metrics)
    ob = cfg.reward.overlong_buffer
    if ob.enable:
        lengths = np.asarray([len(s.response_ids) for s in samples])
        scores, _, overlong_metrics = apply_overlong_penalty(
            scores, lengths, cfg.rollout.response_length, ob.len, ob.penalty_factor)
        metrics.update(overlong_metrics)
    for s, score, record in zip(samples, scores, records):
        s.score = float(score)
        record["score"] = float(score)
    for key, values in result.extras.items():
        for record, value in zip(records, values):
            record[key] = value
    return ScoredRollout(samples, metrics, records)


def keep_informative_groups(samples: list[Sample]) -> tuple[list[int], list[int]]:
    """DAPO dynamic sampling: group ids whose scores vary (kept) and whose scores are all
    equal (zero advantage under GRPO; dropped)."""
    by_group: dict[int, list[float]] = {}
    for s in samples:
        by_group.setdefault(s.group_id, []).append(s.score)
    kept = [g for g, v in by_group.items() if max(v) > min(v)]
    dropped = [g for g, v in by_group.items() if max(v) == min(v)]
    return kept, dropped


def dynamic_sampling(
    next_prompts: Callable[[], dict[str, list]],
    generate_round: Callable[[dict[str, list], int], ScoredRollout],
    num_groups: int,
    max_rounds: int,
) -> ScoredRollout:
    """Generate rounds until `num_groups` informative groups are collected (DAPO §3.2),
    at most `max_rounds`; a short batch is topped up with uninformative groups so the
    batch shape never changes (counted in `train/filter_groups_underfilled`)."""
    kept_samples: list[Sample] = []
    spare: list[Sample] = []
    metrics: dict[str, float] = {}
    records: list[dict] = []
    offset = rounds = 0
    kept_groups = 0
    while kept_groups < num_groups and rounds < max_rounds:
        rollout = generate_round(next_prompts(), offset)
        rounds += 1
        offset += num_groups
        kept, dropped = keep_informative_groups(rollout.samples)
        take = set(kept[: num_groups - kept_groups])
        kept_groups += len(take)
        kept_samples += [s for s in rollout.samples if s.group_id in take]
        spare += [s for s in rollout.samples if s.group_id in set(dropped)]
        records += rollout.records
        for k, v in rollout.metrics.items():
            metrics[k] = metrics.get(k, 0.0) + v
    missing = num_groups - kept_groups
    if missing:
        fill = sorted({s.group_id for s in spare})[:missing]
        kept_samples += [s for s in spare if s.group_id in set(fill)]
    metrics["train/num_gen_batches"] = float(rounds)
    metrics["train/filter_groups_underfilled"] = float(missing)
    return ScoredRollout(kept_samples, metrics, records)
