"""A calculator tool: safe arithmetic by walking the `ast` of the expression (no `eval`).

Accepted: int/float literals, ``+ - * / // % **``, unary ``+``/``-``, parentheses, the
constants ``pi``, ``e``, ``tau`` and the functions ``sqrt, exp, log, log2, log10, sin, cos,
tan, asin, acos, atan, floor, ceil, abs, round, min, max``. Everything else (names, attribute
access, subscripts, strings, comprehensions, lambdas, ...) is refused.

Resource bounds, checked *before* computing: expression length and nesting depth; integer
exponents larger than `max_exponent`; any power or product whose integer result would exceed
`max_result_bits` bits (so ``9**9**9`` or ``(10**1000)**1000`` are refused in microseconds
rather than exhausting memory).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from rljax.agent.tools.base import Tool, ToolResult

Number = int | float

_FUNCS: dict[str, Callable[..., Number]] = {
    "sqrt": math.sqrt, "exp": math.exp, "log": math.log, "log2": math.log2,
    "log10": math.log10, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "asin": math.asin, "acos": math.acos, "atan": math.atan, "floor": math.floor,
    "ceil": math.ceil, "abs": abs, "round": round, "min": min, "max": max,
}
_CONSTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}
_BINOPS: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculatorError(ValueError):
    """The expression is not allowed or cannot be evaluated."""


def _bits(x: Number) -> float:
    """log2 of |x| (0 for |x| <= 1); works for huge ints without float overflow."""
    if isinstance(x, int):
        return float(abs(x).bit_length())
    return math.log2(abs(x)) if abs(x) > 1 else 0.0


def evaluate(expression: str, max_exponent: int = 10_000, max_result_bits: int = 4096,
             max_length: int = 1000, max_depth: int = 100) -> Number:
    """Evaluate an arithmetic expression under the module's rules; `CalculatorError` if refused."""
    if len(expression) > max_length:
        raise CalculatorError(f"expression longer than {max_length} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalculatorError(f"invalid expression: {type(e).__name__}") from None

    def ev(node: ast.AST, depth: int = 0) -> Number:
        if depth > max_depth:
            raise CalculatorError(f"expression nested deeper than {max_depth}")
        depth += 1
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise CalculatorError(f"unsupported literal {node.value!r}")
            return node.value
        if isinstance(node, ast.Name):
            if node.id in _CONSTS:
                return _CONSTS[node.id]
            raise CalculatorError(f"unknown name {node.id!r}")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand, depth)
            return -v if isinstance(node.op, ast.USub) else +v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = ev(node.left, depth), ev(node.right, depth)
            if isinstance(node.op, ast.Pow):
                if isinstance(b, int) and abs(b) > max_exponent:
                    raise CalculatorError(f"exponent {b} exceeds the limit {max_exponent}")
                if _bits(a) * abs(b) > max_result_bits:
                    raise CalculatorError(f"result would exceed {max_result_bits} bits")
            elif isinstance(node.op, ast.Mult) and _bits(a) + _bits(b) > max_result_bits:
                raise CalculatorError(f"result would exceed {max_result_bits} bits")
            try:
                out = _BINOPS[type(node.op)](a, b)
            except ZeroDivisionError:
                raise CalculatorError("division by zero") from None
            except OverflowError:
                raise CalculatorError("numeric overflow") from None
            if isinstance(out, complex):
                raise CalculatorError("complex result")
            if isinstance(out, int) and out.bit_length() > max_result_bits:
                raise CalculatorError(f"result would exceed {max_result_bits} bits")
            return out
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
                raise CalculatorError("unsupported function call")
            if node.keywords:
                raise CalculatorError("keyword arguments are not supported")
            args = [ev(a, depth) for a in node.args]
            try:
                return _FUNCS[node.func.id](*args)
            except (ValueError, TypeError, OverflowError) as e:
                raise CalculatorError(f"{node.func.id}: {e}") from None
        raise CalculatorError(f"unsupported syntax: {type(node).__name__}")

    try:
        return ev(tree.body)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(x: Number) -> str:
    """Integers exactly; floats with up to 12 significant digits (``5.0`` -> ``5``)."""
    if isinstance(x, float):
        if math.isfinite(x) and x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return format(x, ".12g")
    return str(x)


class CalculatorTool(Tool):
    """Evaluates ``{"expression": str}``; a refused expression is a ``bad_arguments`` error."""

    default_schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression, e.g. '(2 + 3) * 4 ** 2 / sqrt(2)'.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "The expression."}},
                "required": ["expression"],
            },
        },
    }

    def __init__(self, schema: dict[str, Any] | None = None, max_exponent: int = 10_000,
                 max_result_bits: int = 4096, max_length: int = 1000, max_depth: int = 100):
        super().__init__(schema)
        self.max_exponent = max_exponent
        self.max_result_bits = max_result_bits
        self.max_length = max_length
        self.max_depth = max_depth

    async def call(self, arguments: dict[str, Any], state: Any) -> ToolResult:
        try:
            value = evaluate(arguments["expression"], self.max_exponent, self.max_result_bits,
                             self.max_length, self.max_depth)
        except CalculatorError as e:
            return ToolResult(f"Error: {e}", error="bad_arguments")
        return ToolResult(format_number(value))
