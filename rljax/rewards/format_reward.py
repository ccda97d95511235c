"""Format rewards: does the response have the required shape (a regex match)?

The default shape is DeepSeek-R1 / TinyZero's ``<think>...</think><answer>...</answer>``
(whitespace allowed around and between the blocks, nothing else). `FormatReward` is a
picklable reward function for any pattern, so it also runs in the reward worker processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rljax.rewards.registry import register_reward

THINK_ANSWER_PATTERN = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """Stripped content of the last ``<tag>...</tag>`` block of `text`, or None."""
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


def format_ok(text: str, pattern: str = THINK_ANSWER_PATTERN, flags: int = re.DOTALL) -> bool:
    """True when `pattern` matches `text` (``re.match``; anchor it with ``$`` for a full match)."""
    return re.match(pattern, text, flags) is not None


@dataclass(frozen=True)
class FormatReward:
    """A ``compute_score`` function: `score` when the response matches `pattern`, else
    `wrong_score`. ``FormatReward(r"^<answer>.*</answer>$", score=0.1)``."""

    pattern: str = THINK_ANSWER_PATTERN
    score: float = 1.0
    wrong_score: float = 0.0
    flags: int = re.DOTALL

    def __post_init__(self) -> None:
        re.compile(self.pattern, self.flags)  # fail at construction on a bad regex

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any = None, extra_info: dict | None = None
    ) -> dict[str, Any]:
        ok = format_ok(solution_str, self.pattern, self.flags)
        return {"score": self.score if ok else self.wrong_score, "format": float(ok)}


register_reward("format/think_answer")(FormatReward())
