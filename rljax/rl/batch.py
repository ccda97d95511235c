"""Rollouts -> the training batch of the data contract (docs/design.md).

Each sample becomes one right-padded row `prompt + response`, padded to a bucket length
so a run compiles a handful of shapes. Arrays are `[B, T]` and aligned with `input_ids`
(entry t is about token t):

    input_ids, attention_mask     prompt + response, 0 = padding
    response_mask                 1 on tokens the policy sampled (loss applies)
    rollout_log_probs             the sampler's log-prob of each sampled token
    token_level_scores            the sample's score on its last response token
    group_ids [B]                 the prompt a sample came from (GRPO / RLOO groups)
    expert_ids [B, T, L, k]       (MoE, when samples carry it) the experts the sampler routed
                                  each token to per layer; -1 = none recorded (padding, the
                                  last token): routing replay, `actor.router_replay`

Multi-turn trajectories pass their own `response_mask` (tool observations are 0) and
`rollout_log_probs` (0 there), so the same builder serves single- and multi-turn rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class Sample:
    """One trajectory, token ids only: `response_mask` and `response_log_probs` are per
    response token (1 / sampler log-prob for sampled tokens, 0 / 0 for observations)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_log_probs: list[float]
    group_id: int
    score: float = 0.0
    truncated: bool = False  # the response hit the length limit
    baseline: float = 0.0  # ReMax: the score of the greedy response to the same prompt
    expert_ids: np.ndarray | None = None  # [P + R, L, k] int32: recorded routing (`Completion.expert_ids`)


def bucket_length(length: int, bucket: int, max_length: int) -> int:
    """Round up to a multiple of `bucket`, capped at `max_length` (itself a bucket)."""
    return min(-(-length // bucket) * bucket, max_length)


def build_batch(samples: Sequence[Sample], bucket: int, max_length: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    if max(lengths) > max_length:
        raise ValueError(f"a sample of {max(lengths)} tokens exceeds the row length {max_length}")
    t = bucket_length(max(lengths), bucket, max_length)
    b = len(samples)
    batch = {
        "input_ids": np.full((b, t), pad_id, np.int32),
        "attention_mask": np.zeros((b, t), np.int32),
        "response_mask": np.zeros((b, t), np.float32),
        "rollout_log_probs": np.zeros((b, t), np.float32),
        "token_level_scores": np.zeros((b, t), np.float32),
        "group_ids": np.asarray([s.group_id for s in samples], np.int32),
    }
    recorded = [s.expert_ids for s in samples if s.expert_ids is not None]
    if recorded:
        batch["expert_ids"] = np.full((b, t, *recorded[0].shape[1:]), -1, np.int32)  # [B, T, L, k]
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        batch["input_ids"][i, : p + r] = s.prompt_ids + s.response_ids
        batch["attention_mask"][i, : p + r] = 1
        batch["response_mask"][i, p : p + r] = s.response_mask
        batch["rollout_log_probs"][i, p : p + r] = s.response_log_probs
        if s.expert_ids is not None:
            batch["expert_ids"][i, : p + r] = s.expert_ids
        sampled = np.flatnonzero(np.asarray(s.response_mask) > 0)
        if sampled.size:  # the outcome reward sits on the last token the policy produced
            batch["token_level_scores"][i, p + sampled[-1]] = s.score
    return batch
