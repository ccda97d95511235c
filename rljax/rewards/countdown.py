"""Countdown (TinyZero): an arithmetic expression over the given numbers that hits a target.

``ground_truth = {"target": int, "numbers": [int, ...]}``. The response's equation is the
content of its last ``<answer>...</answer>`` block. Scores, as TinyZero's
``countdown.compute_score``:

* no ``<answer>`` block: 0.0;
* an equation that uses the wrong numbers, does not parse, or misses the target:
  `format_score` (0.1);
* otherwise: `score` (1.0).

Numbers: with ``require_all=True`` (TinyZero) the equation must use every given number
exactly once; with ``require_all=False`` each at most once (as often as it is given).
The equation may contain only digits, ``+ - * /``, parentheses and spaces; it is parsed
with `ast` and evaluated over exact rationals (`fractions.Fraction`), never with `eval`.
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from fractions import Fraction
from typing import Any, Callable, Mapping

from rljax.rewards.format_reward import extract_tag
from rljax.rewards.registry import register_answer_extractor, register_reward

MAX_EQUATION_CHARS = 512
_ALLOWED_CHARS = re.compile(r"[\d+\-*/().\s]+")
_BINOPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type, Callable[[Fraction], Fraction]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _eval_node(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_node(node.left), _eval_node(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    raise ValueError(f"disallowed expression element {type(node).__name__}")


def safe_eval(expression: str) -> Fraction | None:
    """Exact value of an integer ``+ - * /`` expression; None when it is not one (other
    characters or syntax, floats, division by zero, too long or too deep)."""
    if len(expression) > MAX_EQUATION_CHARS or not _ALLOWED_CHARS.fullmatch(expression):
        return None
    try:
        return _eval_node(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def numbers_ok(equation: str, numbers: list[int], require_all: bool = True) -> bool:
    """The integers written in `equation` are `numbers` (each exactly once), or with
    ``require_all=False`` a sub-multiset of them (each at most once)."""
    used = Counter(int(n) for n in re.findall(r"\d+", equation))
    given = Counter(int(n) for n in numbers)
    if require_all:
        return used == given
    return all(used[n] <= given[n] for n in used)


def _target_and_numbers(ground_truth: Any) -> tuple[Fraction, list[int]]:
    if not isinstance(ground_truth, Mapping) or "target" not in ground_truth or "numbers" not in ground_truth:
        raise ValueError(f"countdown ground_truth must be {{'target': int, 'numbers': [int, ...]}}, got {ground_truth!r}")
    return Fraction(int(ground_truth["target"])), [int(n) for n in list(ground_truth["numbers"])]


@register_reward("countdown", "countdown*")
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    format_score: float = 0.1,
    score: float = 1.0,
    require_all: bool = True,
) -> dict[str, Any]:
    target, numbers = _target_and_numbers(ground_truth)
    equation = extract_tag(solution_str, "answer")
    if equation is None:
        return {"score": 0.0, "acc": 0.0, "pred": None}
    value = safe_eval(equation) if numbers_ok(equation, numbers, require_all) else None
    correct = value is not None and value == target
    return {"score": score if correct else format_score, "acc": float(correct), "pred": re.sub(r"\s+", "", equation)}


@register_answer_extractor("countdown", "countdown*")
def extract_answer(solution_str: str) -> str | None:
    equation = extract_tag(solution_str, "answer")
    return None if equation is None else re.sub(r"\s+", "", equation)
