"""DAPO math reward (verl's ``reward_score/math_dapo.py``): ``math_dapo``, ``math``,
``math_dapo_reasoning`` and ``aime*``, the names verl's ``default_compute_score`` sends
there.

The answer is the last ``Answer: ...`` line of the response's last `CLIP_CHARS`
characters (DAPO's prompt asks for "Answer: $Answer" as the last line); a ``\\boxed{}``
on that line is unboxed; when there is no such line, the last ``\\boxed{}`` of the tail.
Score +1.0 when it equals the ground truth, -1.0 otherwise (also when there is no
answer), as in DAPO. Returns ``{"score", "acc", "pred"}``.

Both sides first go through `dapo_answer_core`, the parts of verl's
``normalize_final_answer`` that are right: keep what follows the last ``=``
(``a + b = 34`` -> ``34``), keep the first ``$...$`` span of a sentence (``The answer is
$34$`` -> ``34``), drop unit words (``34 dollars``, ``90 degrees``, ``12 ways``, ``5
inches``, `UNIT_WORDS`) and inch marks, and read ``\\text{ and }`` as a comma. Then
`math_equal` compares them (the MATH normaliser plus exact numeric equality).

Deliberate differences from verl (docs/rewards.md, "Rule rewards and verl"): numbers compare by
value (``0.5`` == ``\\frac12``, ``34.0`` == ``34``); unit words go only as whole words
(verl deletes them inside words: ``Tuesday`` -> ``Tday``); no ``a ``/``an `` deletion
(verl: ``2a + 3`` -> ``2+3``); ``\\overline`` is kept (verl: ``0.\\overline{3}`` ==
``0.3``); commas go only from thousands groups (verl: ``1,2,3`` == ``123``); a ``\\\\`` row
break is kept; a boxed answer is unboxed before the ``=`` split (verl: ``\\boxed{k = 5}``
-> ``5}``); no ``Answer:`` line falls back to the last box (verl: -1).
"""

from __future__ import annotations

import re
from typing import Any

from rljax.rewards.math_boxed import reference_answer
from rljax.rewards.math_normalize import canonical_answer, extract_boxed_answer, math_equal
from rljax.rewards.registry import register_answer_extractor, register_reward

DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning", "aime*")
CLIP_CHARS = 300
ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# verl's REMOVED_EXPRESSIONS words (units and counted things of the MATH/DAPO answers).
UNIT_WORDS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "childrentickets", "multiples",
)
# A unit word not inside a longer word or a TeX command, with an optional ^2 / ^3.
_UNIT = re.compile(
    r"(?<![A-Za-z\\])(?:" + "|".join(sorted(UNIT_WORDS, key=len, reverse=True)) + r")(?![A-Za-z])"
    r"(?:\s*\^\s*\{?\s*[23]\s*\}?)?"
)
_MATH_SPAN = re.compile(r"\$([^$]*)\$")
_TEXT_AND = re.compile(r",?\s*\\text\s*\{\s*and\s*\}\s*")


def dapo_answer_core(answer: str) -> str:
    """The value part of a DAPO answer (see the module docstring); the result is then
    compared with `math_equal`."""
    s = str(answer).replace("\\$", "").replace("$$", "$")
    rhs = s.rsplit("=", 1)[-1]
    if rhs.strip():
        s = rhs
    span = _MATH_SPAN.search(s)
    if span and span.group(1).strip():
        s = span.group(1)
    s = _TEXT_AND.sub(",", s).replace('"', "")
    without_units = _UNIT.sub(" ", s)
    return without_units if without_units.strip() else s


def extract_dapo_answer(solution_str: str) -> str | None:
    """The last ``Answer: X`` of the response's tail (unboxed), else its last boxed answer."""
    tail = solution_str[-CLIP_CHARS:]
    matches = ANSWER_PATTERN.findall(tail)
    if matches:
        answer = matches[-1].strip()
        boxed = extract_boxed_answer(answer)
        return boxed if boxed is not None else answer
    return extract_boxed_answer(tail)


def dapo_equal(pred: str | None, ground_truth: Any) -> bool:
    """`math_equal` of the DAPO cores of a prediction and a ground truth."""
    if pred is None:
        return False
    return math_equal(dapo_answer_core(pred), dapo_answer_core(reference_answer(ground_truth)))


@register_reward(*DAPO_SOURCES)
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    correct_score: float = 1.0,
    incorrect_score: float = -1.0,
) -> dict[str, Any]:
    """Registered DAPO reward: ``{"score": +-1, "acc", "pred"}`` (pred: canonical answer)."""
    pred = extract_dapo_answer(solution_str)
    correct = dapo_equal(pred, ground_truth)
    return {
        "score": correct_score if correct else incorrect_score,
        "acc": float(correct),
        "pred": None if pred is None else canonical_answer(dapo_answer_core(pred)),
    }


@register_answer_extractor(*DAPO_SOURCES)
def extract_answer(solution_str: str) -> str | None:
    pred = extract_dapo_answer(solution_str)
    return None if pred is None else canonical_answer(dapo_answer_core(pred))
