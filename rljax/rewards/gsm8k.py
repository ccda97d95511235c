"""GSM8K: the final number after ``####`` (verl's ``reward_score/gsm8k.py`` semantics).

* ``method="strict"``: the last ``#### <number>`` in the response (the format GSM8K's
  reference solutions use); no marker -> no answer.
* ``method="flexible"``: the last number anywhere in the response.

Only the last `CLIP_CHARS` characters are searched (the answer is at the end; this bounds
regex time on long responses). Commas and ``$`` are removed and a trailing ``.`` dropped
(``"1,234."`` -> ``"1234"``). Score: `score` (1.0) when the answer equals the ground
truth — as strings, or as exact numbers (``"42.0" == "42"``) —, `format_score` (0.0)
for a wrong answer, 0.0 when none is found.

Deviations from verl, both toward leniency on the *format* of a correct number: ``####``
may be followed by any whitespace (verl: exactly one space), and a trailing period or
``.0`` does not make a right answer wrong.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from rljax.rewards.registry import register_answer_extractor, register_reward

CLIP_CHARS = 300
_STRICT = re.compile(r"####\s*(-?[0-9.,$]+)")
_FLEXIBLE = re.compile(r"-?[0-9][0-9.,]*|-?\.[0-9]+")
METHODS = ("strict", "flexible")


def _clean(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer number of a response (see the module docstring), or None."""
    if method not in METHODS:
        raise ValueError(f"gsm8k: method must be one of {METHODS}, got {method!r}")
    text = solution_str[-CLIP_CHARS:]
    pattern = _STRICT if method == "strict" else _FLEXIBLE
    for match in reversed(pattern.findall(text)):
        answer = _clean(match)
        if answer not in ("", "-", "."):
            return answer
        if method == "strict":
            return None
    return None


def answers_match(answer: str, ground_truth: Any) -> bool:
    """Equal as cleaned strings, or as exact numbers."""
    truth = _clean(str(ground_truth).strip())
    if answer == truth:
        return True
    try:
        return Fraction(answer) == Fraction(truth)
    except (ValueError, ZeroDivisionError):
        return False


def gsm8k_score(
    solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """verl's ``gsm8k.compute_score``: `score`, `format_score` or 0.0."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answers_match(answer, ground_truth) else format_score


@register_reward("openai/gsm8k", "gsm8k")
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, Any]:
    """Registered GSM8K reward: ``{"score", "acc", "pred"}``."""
    pred = extract_solution(solution_str, method)
    correct = pred is not None and answers_match(pred, ground_truth)
    value = 0.0 if pred is None else (score if correct else format_score)
    return {"score": float(value), "acc": float(correct), "pred": pred}


@register_answer_extractor("openai/gsm8k", "gsm8k")
def extract_answer(solution_str: str) -> str | None:
    """Voting key: the strict answer as an exact number string (``"42.0"`` -> ``"42"``)."""
    answer = extract_solution(solution_str, "strict")
    if answer is None:
        return None
    try:
        return str(Fraction(answer))
    except (ValueError, ZeroDivisionError):
        return answer
