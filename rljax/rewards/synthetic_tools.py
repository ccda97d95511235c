"""Reward of the synthetic tool-use task (`rljax.data.synthetic_tools`): exact match of the
final answer.

``synthetic/tool_arithmetic``: the solution is the episode's final assistant message (the
agent rollout passes that one, not the tool calls before it). 1.0 when it is exactly the
ground-truth integer (surrounding whitespace ignored), else 0.0; a final message that is
still a tool call (the episode ran out of turns) scores 0. The dict also carries ``acc``
and ``pred`` (the stripped answer) for validation metrics and majority voting.
"""

from __future__ import annotations

from typing import Any

from rljax.rewards.registry import register_answer_extractor, register_reward

TOOL_SOURCES = ("synthetic/tool_arithmetic",)


@register_answer_extractor(*TOOL_SOURCES)
def extract_answer(solution_str: str) -> str | None:
    pred = solution_str.strip()
    if not pred or "<tool_call>" in pred:
        return None
    return pred


@register_reward(*TOOL_SOURCES)
def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    pred = extract_answer(solution_str)
    correct = pred is not None and pred == str(ground_truth).strip()
    return {"score": float(correct), "acc": float(correct), "pred": pred}
