"""MATH-style rewards (verl's ``reward_score/math_reward.py``): the last ``\\boxed{}``
answer compared with `math_equal`.

Registered for the names verl's ``default_compute_score`` sends to ``math_reward``:
``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``
(``math`` goes to the DAPO scorer, as in verl). Score 1.0 when the boxed answer equals
the ground truth after normalisation (see `rljax.rewards.math_normalize`), else 0.0; no
box -> 0.0. A ground truth that is a full solution (contains ``\\boxed``) is reduced to
its boxed answer first.

Deliberate differences from verl (docs/rewards.md, "Rule rewards and verl"): numbers compare by
value (verl: only ``0.5`` and ``a/b`` are rewritten as ``\\frac``, so ``0.25`` !=
``\\frac14``), and the normaliser also strips ``\\displaystyle``, ``\\text{...}`` units
without a leading space and thousands separators.
"""

from __future__ import annotations

from typing import Any

from rljax.rewards.math_normalize import canonical_answer, extract_boxed_answer, math_equal
from rljax.rewards.registry import register_answer_extractor, register_reward

MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")


def reference_answer(ground_truth: Any) -> str:
    """The answer of a ground truth: its boxed content if it has a box, else itself."""
    text = str(ground_truth)
    boxed = extract_boxed_answer(text)
    return text if boxed is None else boxed


def boxed_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the last boxed answer of `solution_str` equals `ground_truth`, else 0.0."""
    return float(math_equal(extract_boxed_answer(solution_str), reference_answer(ground_truth)))


@register_reward(*MATH_SOURCES)
def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    """Registered MATH reward: ``{"score", "acc", "pred"}`` (pred: canonical boxed answer)."""
    boxed = extract_boxed_answer(solution_str)
    correct = math_equal(boxed, reference_answer(ground_truth))
    return {"score": float(correct), "acc": float(correct), "pred": None if boxed is None else canonical_answer(boxed)}


@register_answer_extractor(*MATH_SOURCES)
def extract_answer(solution_str: str) -> str | None:
    boxed = extract_boxed_answer(solution_str)
    return None if boxed is None else canonical_answer(boxed)
