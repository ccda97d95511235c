"""Rewards of the synthetic tasks (`rljax.data.synthetic`): exact match.

``synthetic/arithmetic``, ``synthetic/reverse``, ``synthetic/uppercase`` (and any other
``synthetic/*``): 1.0 when the stripped response equals the stripped ground truth, else
0.0. Case matters (``uppercase`` is graded on it).
"""

from __future__ import annotations

from typing import Any

from rljax.rewards.registry import register_answer_extractor, register_reward

SYNTHETIC_SOURCES = ("synthetic/arithmetic", "synthetic/reverse", "synthetic/uppercase", "synthetic/*")


@register_reward(*SYNTHETIC_SOURCES)
def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    pred = solution_str.strip()
    correct = pred == str(ground_truth).strip()
    return {"score": float(correct), "acc": float(correct), "pred": pred or None}


@register_answer_extractor(*SYNTHETIC_SOURCES)
def extract_answer(solution_str: str) -> str | None:
    return solution_str.strip() or None
