"""Rewards of the synthetic tasks (`rljax.data.synthetic`): exact match.

``synthetic/arithmetic``, ``synthetic/reverse``, ``synthetic/uppercase`` (and any other
``synthetic/*``): 1.0 when the stripped response equals the stripped ground truth, else
0.0. Case matters (``uppercase`` is graded on it).

A row whose ``extra_info["grading"]`` is ``"last_number"`` (the ``grading`` knob of
`rljax.data.synthetic`) is graded on the last number in the response instead, read as
GSM8K's flexible rule reads it (`rljax.rewards.gsm8k`: commas and a trailing period
dropped, ``"19.0"`` equals ``"19"``), so ``"The answer is 19."`` is right.
"""

from __future__ import annotations

from typing import Any

from rljax.rewards.gsm8k import answers_match, extract_solution
from rljax.rewards.registry import register_answer_extractor, register_reward

SYNTHETIC_SOURCES = ("synthetic/arithmetic", "synthetic/reverse", "synthetic/uppercase", "synthetic/*")


@register_reward(*SYNTHETIC_SOURCES)
def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    if (extra_info or {}).get("grading", "exact") == "last_number":
        pred = extract_solution(solution_str, method="flexible")
        correct = pred is not None and answers_match(pred, ground_truth)
    else:
        pred = solution_str.strip()
        correct = pred == str(ground_truth).strip()
    return {"score": float(correct), "acc": float(correct), "pred": pred or None}


@register_answer_extractor(*SYNTHETIC_SOURCES)
def extract_answer(solution_str: str) -> str | None:
    return solution_str.strip() or None
