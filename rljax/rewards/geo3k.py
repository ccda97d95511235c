"""Geometry3k reward (``hiyouga/geometry3k``; verl's ``reward_score/geo3k.py``).

Score ``(1 - format_score) * accuracy + format_score * format`` with ``format_score =
0.1``, as verl: 1.0 right and well formatted, 0.9 right only, 0.1 formatted only, 0.0
neither.

* accuracy: the response's last ``\\boxed{}`` equals the ground truth under `math_equal`
  (1.0 / 0.0; no box -> 0.0).
* format: the response *starts* with ``<think>``, closes it with ``</think>`` and has a
  ``\\boxed{...}`` after that (verl's ``<think>.*</think>.*\\boxed\\{.*\\}.*`` full match);
  leading whitespace fails it, as in verl.

Deliberate difference: verl grades the box with mathruler's ``grade_answer`` (the
PRM800K checker, which also tries sympy simplification); rljax uses `math_equal`
(normalised strings or exact numbers), so ``\\frac{1}{2}`` == ``0.5`` but a rearranged
expression (``3\\sqrt{2}+1`` vs ``1+3\\sqrt{2}``) is not equal.
"""

from __future__ import annotations

from typing import Any

from rljax.rewards.math_boxed import reference_answer
from rljax.rewards.math_normalize import canonical_answer, extract_boxed_answer, math_equal
from rljax.rewards.registry import register_answer_extractor, register_reward

GEO3K_SOURCES = ("hiyouga/geometry3k",)
FORMAT_SCORE = 0.1


def think_then_boxed(solution_str: str) -> bool:
    """verl's geo3k format: ``<think>`` first, then ``</think>``, then ``\\boxed{`` ... ``}``."""
    if not solution_str.startswith("<think>"):
        return False
    close = solution_str.find("</think>", len("<think>"))
    if close < 0:
        return False
    box = solution_str.find("\\boxed{", close + len("</think>"))
    return box >= 0 and solution_str.find("}", box + len("\\boxed{")) >= 0


@register_reward(*GEO3K_SOURCES)
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    format_score: float = FORMAT_SCORE,
) -> dict[str, Any]:
    """Registered geometry3k reward: ``{"score", "acc", "format", "pred"}``."""
    boxed = extract_boxed_answer(solution_str)
    acc = float(math_equal(boxed, reference_answer(ground_truth)))
    fmt = float(think_then_boxed(solution_str))
    return {
        "score": (1.0 - format_score) * acc + format_score * fmt,
        "acc": acc,
        "format": fmt,
        "pred": None if boxed is None else canonical_answer(boxed),
    }


@register_answer_extractor(*GEO3K_SOURCES)
def extract_answer(solution_str: str) -> str | None:
    boxed = extract_boxed_answer(solution_str)
    return None if boxed is None else canonical_answer(boxed)
