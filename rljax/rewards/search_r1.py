"""Search-R1 QA reward (``searchR1_*``; verl's ``reward_score/search_r1_like_qa_em.py``).

The answer is the content of the response's last ``<answer>...</answer>``. It scores
`score` (1.0) when, normalised, it equals one normalised ``ground_truth["target"]``
(a string or a list of strings; a bare string or list ground truth is taken as the
targets), a quarter of that when the response has more than `MAX_TAGS` opening or closing
``answer`` tags (verl's guard against tag spam), `format_score` (0.0) for a wrong answer,
and 0.0 with no answer. Normalisation (SQuAD's): lower case, punctuation removed, the
articles ``a`` / ``an`` / ``the`` removed, whitespace collapsed.

Registered for the names verl's ``default_compute_score`` knows: ``searchR1_nq``,
``searchR1_triviaqa``, ``searchR1_popqa``, ``searchR1_hotpotqa``,
``searchR1_2wikimultihopqa``, ``searchR1_musique``, ``searchR1_bamboogle``. Returns
``{"score", "acc", "pred"}``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

from rljax.rewards.registry import register_answer_extractor, register_reward

SEARCH_R1_SOURCES = tuple(
    f"searchR1_{name}" for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
)
MAX_TAGS = 10
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_qa_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = str(text).lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def extract_tagged_answer(solution_str: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>``, or None."""
    matches = _ANSWER.findall(solution_str)
    return matches[-1].strip() if matches else None


def targets_of(ground_truth: Any) -> list[str]:
    """The accepted answers: ``ground_truth["target"]`` (or `ground_truth` itself), as a list."""
    targets = ground_truth.get("target") if isinstance(ground_truth, Mapping) else ground_truth
    if targets is None:
        return []
    if isinstance(targets, str):
        return [targets]
    return [str(t) for t in targets]


@register_reward(*SEARCH_R1_SOURCES)
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, Any]:
    """Registered Search-R1 reward: ``{"score", "acc", "pred"}``."""
    pred = extract_tagged_answer(solution_str)
    if pred is None:
        return {"score": 0.0, "acc": 0.0, "pred": None}
    norm = normalize_qa_answer(pred)
    correct = any(norm == normalize_qa_answer(t) for t in targets_of(ground_truth))
    if not correct:
        value = format_score
    elif max(solution_str.count("<answer>"), solution_str.count("</answer>")) > MAX_TAGS:
        value = score / 4
    else:
        value = score
    return {"score": float(value), "acc": float(correct), "pred": norm}


@register_answer_extractor(*SEARCH_R1_SOURCES)
def extract_answer(solution_str: str) -> str | None:
    pred = extract_tagged_answer(solution_str)
    return None if pred is None else normalize_qa_answer(pred)
