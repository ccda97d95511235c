"""What a batch scorer returns, and how one reward function's return value is read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np


@dataclass
class RewardResult:
    """Scores of a batch.

    `scores`: float32 [N]. `extras`: per-sample fields of dict-returning reward functions
    (``acc``, ``pred``, ...), each a list of length N with None where a sample lacks it.
    `metrics`: batch metrics (``reward/errors``, ``reward/timeouts``, ``reward/<field>/mean``).
    `errors`: sample index -> message, for samples scored as failures.
    """

    scores: np.ndarray
    extras: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


def _plain(value: Any) -> Any:
    """numpy scalars -> Python scalars (so results pickle small and log as JSON)."""
    if isinstance(value, np.generic):
        return value.item()
    return value


class NonFiniteScore(ValueError):
    """A reward function returned a score that is not finite in float32 (nan, +-inf, or
    beyond float32's range, e.g. 1e308): no score to train on, whatever the failure policy."""


def finite_in_float32(value: float) -> bool:
    """Whether `value` stays finite once rounded to float32, the dtype rewards are trained in
    (anything above float32's max by at least half an ulp rounds to inf)."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(value)))


def read_score(result: Any) -> tuple[float, dict[str, Any]]:
    """``float | dict`` from a reward function -> (score, extra fields). A dict needs a
    ``"score"``; the score must be a real number (a bool counts as 0/1) that is finite in
    float32 (`NonFiniteScore` otherwise)."""
    extras: dict[str, Any] = {}
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a reward dict needs a 'score' key, got keys {sorted(result)}")
        extras = {str(k): _plain(v) for k, v in result.items() if k != "score"}
        result = result["score"]
    result = _plain(result)
    if isinstance(result, (list, tuple)) and len(result) == 1:  # verl accepts res[0]
        result = _plain(result[0])
    if not isinstance(result, Real):
        raise TypeError(f"a reward must be a real number or a dict with 'score', got {type(result).__name__}")
    score = float(result)
    if not finite_in_float32(score):
        raise NonFiniteScore(f"non-finite reward {score!r}" if not math.isfinite(score)
                             else f"non-finite reward {score!r} (inf in float32)")
    return score, extras


def collect_extras(per_sample: list[dict[str, Any] | None], n: int) -> dict[str, list[Any]]:
    """List of per-sample dicts -> dict of length-n lists (None where absent)."""
    keys: list[str] = []
    for extras in per_sample:
        for k in extras or {}:
            if k not in keys:
                keys.append(k)
    return {k: [(e or {}).get(k) for e in per_sample] for k in keys} if n else {}


def extra_metrics(extras: dict[str, list[Any]], prefix: str = "reward") -> dict[str, float]:
    """``{prefix}/{key}/mean`` over the samples where an extra field is a number/bool."""
    metrics: dict[str, float] = {}
    for key, values in extras.items():
        numbers = [float(v) for v in values if isinstance(v, (Real, bool)) and not isinstance(v, complex)]
        numbers = [v for v in numbers if math.isfinite(v)]
        if numbers:
            metrics[f"{prefix}/{key}/mean"] = float(np.mean(numbers))
    return metrics
