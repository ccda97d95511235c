"""The ast-based calculator: correct arithmetic, refused syntax, bounded sizes."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.agent.tools.calculator import CalculatorError, CalculatorTool, evaluate, format_number

from .helpers import run


@pytest.mark.parametrize("expr,value", [
    ("2+3", 5), ("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("-3 ** 2", -9), ("(-3) ** 2", 9),
    ("7 // 2", 3), ("7 % 4", 3), ("7 / 2", 3.5), ("--4", 4), ("+4", 4), ("2 ** -1", 0.5),
    ("sqrt(16)", 4.0), ("max(1, 5, 3)", 5), ("abs(-2.5)", 2.5), ("floor(2.7) + ceil(2.1)", 5),
    ("round(2.567, 2)", 2.57), ("log(e)", 1.0), ("2 * pi", 2 * math.pi), ("1e3 + 1", 1001.0),
    ("10 ** 100", 10 ** 100), ("-" * 99 + "1", -1),
])
def test_arithmetic(expr, value):
    assert evaluate(expr) == pytest.approx(value) if isinstance(value, float) else evaluate(expr) == value


@pytest.mark.parametrize("expr,msg", [
    ("9**9**9", "exceeds the limit"),
    ("2 ** 100000", "exceeds the limit"),
    ("(10**1000)**100", "exceed 4096 bits"),
    ("10**1000 * 10**1000 * 10**1000 * 10**1000 * 10**1000", "exceed 4096 bits"),
    ("__import__('os')", "unsupported function call"),
    ("os.system('ls')", "unsupported function call"),
    ("x + 1", "unknown name 'x'"),
    ("'a' * 3", "unsupported literal"),
    ("True + 1", "unsupported literal"),
    ("[1, 2]", "unsupported syntax"),
    ("(lambda: 1)()", "unsupported function call"),
    ("1 if 1 else 2", "unsupported syntax"),
    ("2 << 3", "unsupported syntax"),
    ("1j * 1j", "unsupported literal"),
    ("1 / 0", "division by zero"),
    ("sqrt(-1)", "sqrt"),
    ("exp(1000)", "exp"),
    ("2 +", "invalid expression"),
    ("(" * 300 + "1" + ")" * 300, "invalid expression"),
    ("1+" * 600 + "1", "longer than"),
    ("round(x=1)", "keyword arguments"),
    ("-" * 995 + "1", "nested deeper than 100"),
])
def test_refused(expr, msg):
    t0 = time.perf_counter()
    with pytest.raises(CalculatorError, match=msg):
        evaluate(expr)
    assert time.perf_counter() - t0 < 1.0  # refused up front, not after computing


def test_tool_call_and_formatting():
    tool = CalculatorTool()
    assert run(tool.call({"expression": "2+3"}, None)).text == "5"
    assert run(tool.call({"expression": "10/4"}, None)).text == "2.5"
    assert run(tool.call({"expression": "10/5"}, None)).text == "2"
    bad = run(tool.call({"expression": "9**9**9"}, None))
    assert bad.error == "bad_arguments" and bad.text.startswith("Error:")
    assert format_number(1 / 3) == "0.333333333333"


_int = st.integers(min_value=-50, max_value=50).map(str)
_expr = st.recursive(
    _int,
    lambda sub: st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None)
@given(_expr)
def test_matches_python_on_integer_expressions(expr):
    # eval only in the test, on expressions built from integers and + - * by hypothesis
    assert evaluate(expr) == eval(expr)  # noqa: S307
