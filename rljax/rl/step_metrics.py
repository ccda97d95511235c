"""What an RL step reports besides its losses: timings, verl's data metrics (scores,
rewards, advantages, lengths), sampler / trainer log-prob mismatch and throughput.

Pure functions of the step batch (`rljax.rl.batch.StepBatch`, host arrays) and host
numbers; the trainer merges them into the step's metrics.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import jax
import numpy as np

from rljax.rl.batch import StepBatch


class Timer:
    """`with timer("gen"): ...` accumulates seconds into timing_s/gen; `on_enter(name)`,
    when given, hears of each phase as it starts (the console's status line)."""

    def __init__(self, on_enter: Callable[[str], None] | None = None):
        self.seconds: dict[str, float] = {}
        self.on_enter = on_enter

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.on_enter is not None:
            self.on_enter(name)
        start = time.perf_counter()
        yield
        self.seconds[f"timing_s/{name}"] = self.seconds.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()),
            f"{prefix}/min": float(values.min())}


def batch_metrics(batch: StepBatch, samples) -> dict[str, float]:
    """verl's data metrics: scores, rewards, advantages, returns, values, lengths."""
    mask = batch.response_mask > 0  # [B, T]
    seq_score = batch.token_level_scores.sum(-1)  # [B]
    out = {}
    out.update(_stats("critic/score", seq_score))
    out.update(_stats("critic/rewards", batch.token_level_rewards.sum(-1)))
    out.update(_stats("critic/advantages", batch.advantages[mask]))
    out.update(_stats("critic/returns", batch.returns[mask]))
    if batch.values is not None:
        out.update(_stats("critic/values", batch.values[mask]))
    response_lengths = np.asarray([len(s.response_ids) for s in samples], np.float32)
    out.update(_stats("response_length", response_lengths))
    out["response_length/clip_ratio"] = float(np.mean([s.truncated for s in samples]))
    out.update(_stats("prompt_length", np.asarray([len(s.prompt_ids) for s in samples], np.float32)))
    return out


def rollout_mismatch(batch: StepBatch) -> dict[str, float]:
    """|sampler log-prob - trainer log-prob| over the response tokens: max and mean."""
    diff = np.abs(batch.rollout_log_probs - batch.old_log_probs)[batch.response_mask > 0]  # [tokens]
    return {"training/rollout_probs_diff_max": float(diff.max()) if diff.size else 0.0,
            "training/rollout_probs_diff_mean": float(diff.mean()) if diff.size else 0.0}


def throughput(batch: StepBatch, elapsed: float, update_seconds: float, epochs: int,
               flops_per_token: Callable[[int], float], flops_peak: float) -> dict[str, float]:
    """Tokens of the step, tokens per second per device, the actor update's model FLOP/s
    per device over its `epochs` passes, and (with a known peak) its utilisation."""
    tokens = float(batch.attention_mask.sum())
    out = {"perf/total_num_tokens": tokens, "perf/throughput": tokens / elapsed / jax.device_count()}
    flops = tokens * flops_per_token(batch.input_ids.shape[1]) * epochs
    out["perf/update_flops_per_s"] = flops / max(update_seconds, 1e-9) / jax.device_count()
    if flops_peak:
        out["perf/mfu"] = flops / update_seconds / flops_peak
    return out
