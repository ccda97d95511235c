"""DAPO math reward (``math_dapo``, ``aime*``; verl's ``reward_score/math_dapo.py``).

The answer is the last ``Answer: ...`` line of the response's last `CLIP_CHARS`
characters (DAPO's prompt asks for "Answer: $Answer" as the last line); when there is
none, the last ``\\boxed{}``. Score +1.0 when it equals the ground truth, -1.0 otherwise
(also when there is no answer), as in DAPO. Returns ``{"score", "acc", "pred"}``.

Deviation: verl compares Minerva-normalised strings; we use `math_equal` (the MATH
normaliser plus exact numeric equality), so ``0.5`` and ``\\frac12`` both count.
"""

from __future__ import annotations

import re
from typing import Any

from rljax.rewards.math_boxed import reference_answer
from rljax.rewards.math_normalize import canonical_answer, extract_boxed_answer, math_equal
from rljax.rewards.registry import register_answer_extractor, register_reward

CLIP_CHARS = 300
ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def extract_dapo_answer(solution_str: str) -> str | None:
    """The last ``Answer: X`` of the response's tail, else its last boxed answer."""
    tail = solution_str[-CLIP_CHARS:]
    matches = ANSWER_PATTERN.findall(tail)
    if matches:
        answer = matches[-1].strip()
        boxed = extract_boxed_answer(answer)
        return boxed if boxed is not None else answer
    return extract_boxed_answer(tail)


@register_reward("math_dapo", "aime*")
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    correct_score: float = 1.0,
    incorrect_score: float = -1.0,
) -> dict[str, Any]:
    pred = extract_dapo_answer(solution_str)
    correct = math_equal(pred, reference_answer(ground_truth))
    return {
        "score": correct_score if correct else incorrect_score,
        "acc": float(correct),
        "pred": None if pred is None else canonical_answer(pred),
    }


@register_answer_extractor("math_dapo", "aime*")
def extract_answer(solution_str: str) -> str | None:
    pred = extract_dapo_answer(solution_str)
    return None if pred is None else canonical_answer(pred)
