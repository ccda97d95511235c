"""NuminaMath reward (``numina_*``; verl's ``reward_score/prime_math``, PRIME's checker).

verl sends ``numina_aops_forum``, ``numina_synthetic_math``, ``numina_amc_aime``,
``numina_synthetic_amc``, ``numina_cn_k12`` and ``numina_olympiads`` to
``prime_math.compute_score`` and keeps its first value: 1.0 when the answer is right,
else 0.0. So does this scorer; it returns ``{"score", "acc", "pred"}``.

The answer (`extract_numina_answer`, PRIME's ``match_answer`` in short):

* the text after the last ``answer:`` / ``answer is`` / ``answers are`` (any case), or
  the whole response when there is none;
* in it, the last ``\\boxed{}`` if any; else, after a marker, the rest of that line up to
  the first ``". "``; with neither, no answer;
* then what follows the last ``=`` (``\\boxed{x = 5}`` -> ``5``).

It is compared with the ground truth by `math_equal` (normalised strings or exact
numbers).

Deliberate differences: PRIME also tries sympy simplification and numeric closeness
(relative 1e-4, and ``\\pi`` read as 3.14): rljax does not, so ``(x+1)^2`` is not
``x^2+2x+1`` and 3.1416 is not ``\\pi``; and rljax needs no digit in the answer.
"""

from __future__ import annotations

import re
from typing import Any

from rljax.rewards.math_boxed import reference_answer
from rljax.rewards.math_normalize import canonical_answer, extract_boxed_answer, math_equal
from rljax.rewards.registry import register_answer_extractor, register_reward

NUMINA_SOURCES = (
    "numina_aops_forum",
    "numina_synthetic_math",
    "numina_amc_aime",
    "numina_synthetic_amc",
    "numina_cn_k12",
    "numina_olympiads",
)
_MARKER = re.compile(r"(?i)answer\s*:|answer is|answers are")


def extract_numina_answer(solution_str: str) -> str | None:
    """The final answer of a response (see the module docstring), or None."""
    markers = list(_MARKER.finditer(solution_str))
    rest = solution_str[markers[-1].end():] if markers else solution_str
    answer = extract_boxed_answer(rest)
    if answer is None:
        if not markers:
            return None
        answer = rest.strip().split("\n", 1)[0].split(". ", 1)[0]
    rhs = answer.rsplit("=", 1)[-1]
    answer = (rhs if rhs.strip() else answer).strip()
    return answer or None


@register_reward(*NUMINA_SOURCES)
def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    """Registered NuminaMath reward: ``{"score": 1.0 | 0.0, "acc", "pred"}``."""
    pred = extract_numina_answer(solution_str)
    correct = float(math_equal(pred, reference_answer(ground_truth)))
    return {"score": correct, "acc": correct, "pred": None if pred is None else canonical_answer(pred)}


@register_answer_extractor(*NUMINA_SOURCES)
def extract_answer(solution_str: str) -> str | None:
    pred = extract_numina_answer(solution_str)
    return None if pred is None else canonical_answer(pred)
