"""Property tests of the answer checkers."""

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.rewards import canonical_answer, compute_score, math_equal, safe_eval

ints = st.integers(-10**6, 10**6)
pos = st.integers(1, 10**4)


@settings(max_examples=80, deadline=None)
@given(ints, pos)
def test_fraction_spellings_agree(a, b):
    spellings = [f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}", f"\\dfrac{{{a}}}{{{b}}}", f"$\\frac{{{a}}}{{{b}}}$"]
    for s in spellings:
        assert math_equal(s, spellings[0])
        assert canonical_answer(s) == str(Fraction(a, b))
    assert math_equal(f"{a}/{b}", f"{a}/{b + 1}") == (Fraction(a, b) == Fraction(a, b + 1))


@settings(max_examples=80, deadline=None)
@given(ints, st.integers(0, 3))
def test_decimal_spellings(a, places):
    value = Fraction(a, 10**places)
    text = f"{float(value):.{places}f}"
    assert math_equal(text, str(value)) and math_equal(text + ".", text) and math_equal(f"{text}\\%", text)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**9))
def test_gsm8k_commas_and_marker(n):
    text = f"Lots of reasoning with 3 numbers 7.\n#### {n:,}"
    assert compute_score("openai/gsm8k", text, str(n))["score"] == 1.0
    assert compute_score("openai/gsm8k", text, str(n + 1))["score"] == 0.0


@st.composite
def expressions(draw, depth=3):
    """(text, exact value or None on division by zero) of a random + - * / expression."""
    if depth == 0 or draw(st.booleans()):
        n = draw(st.integers(0, 99))
        return str(n), Fraction(n)
    left, lv = draw(expressions(depth=depth - 1))
    right, rv = draw(expressions(depth=depth - 1))
    op = draw(st.sampled_from("+-*/"))
    if lv is None or rv is None or (op == "/" and rv == 0):
        return f"({left} {op} {right})", None
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else None}[op]
    return f"({left} {op} {right})", value


@settings(max_examples=100, deadline=None)
@given(expressions())
def test_safe_eval_is_exact(expr):
    text, value = expr
    assert safe_eval(text) == value


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789+-*/(). abcx_'[]:,", max_size=60))
def test_safe_eval_never_raises(text):
    out = safe_eval(text)
    assert out is None or isinstance(out, Fraction)
