import pytest

from rljax.rewards import (
    canonical_answer,
    compute_score,
    extract_boxed_answer,
    last_boxed_only_string,
    math_equal,
    normalize_math_answer,
)

EQUIVALENT = [
    (r"\frac{1}{2}", "1/2"),
    (r"\frac12", r"\frac{1}{2}"),
    (r"\dfrac{1}{2}", "0.5"),
    (r"\tfrac{3}{4}", ".75"),
    ("0.5", r"\frac{2}{4}"),
    (r"-\frac{1}{2}", r"\frac{-1}{2}"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"10\text{ cm}", "10"),
    (r"10 \mbox{ inches}", "10"),
    (r"90^\circ", "90"),
    (r"90^{\circ}", "90"),
    (r"\$5", "5"),
    ("$5$", "5"),
    ("5.", "5"),
    ("50\\%", "50"),
    ("1,000", "1000"),
    (r"1{,}000", "1000"),
    (r"1\!000", "1000"),
    ("x = 3", "3"),
    (r"\sqrt3", r"\sqrt{3}"),
    (r"\frac{\sqrt3}{2}", r"\frac{\sqrt{3}}{2}"),
    (r"\frac 1 2", r"\frac{1}{2}"),
    ("2.50", "2.5"),
    ("{7}", "7"),
    (r"\text{(A)}", "(A)"),
    (r"x^2 + 1", "x^2+1"),
    (r"\displaystyle\frac{1}{3}", r"\frac13"),
]

NOT_EQUIVALENT = [
    ("0.333", r"\frac{1}{3}"),
    ("1/2", "2"),
    (r"\frac{1}{2}", r"\frac{1}{3}"),
    ("(1,2)", "(2,1)"),
    ("x^2+1", "x^2-1"),
    ("10", "100"),
    ("", ""),
    ("5", "-5"),
    ("1/0", "1/0x"),
]


@pytest.mark.parametrize("a, b", EQUIVALENT)
def test_equivalent(a, b):
    assert math_equal(a, b) and math_equal(b, a)


@pytest.mark.parametrize("a, b", NOT_EQUIVALENT)
def test_not_equivalent(a, b):
    assert not math_equal(a, b) and not math_equal(b, a)


def test_none_is_never_equal():
    assert not math_equal(None, "1") and not math_equal("1", None)


def test_normalize_is_idempotent():
    for a, b in EQUIVALENT + NOT_EQUIVALENT:
        for s in (a, b):
            once = normalize_math_answer(s)
            assert normalize_math_answer(once) == once


def test_canonical_answer_merges_numbers():
    assert canonical_answer(r"\frac{2}{4}") == canonical_answer("0.5") == canonical_answer("1/2") == "1/2"
    assert canonical_answer("3.0") == "3"


@pytest.mark.parametrize(
    "text, boxed",
    [
        (r"so \boxed{5}.", "5"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\left\{ x \mid x^{2} > 0 \right\}}", r"\left\{ x \mid x^{2} > 0 \right\}"),
        (r"\fbox{7}", "7"),
        (r"$\boxed 9$", "9"),
        (r"\boxed{unclosed", None),
        ("no box", None),
    ],
)
def test_boxed_extraction(text, boxed):
    assert extract_boxed_answer(text) == boxed


def test_last_boxed_keeps_command():
    assert last_boxed_only_string(r"a \boxed{{1}+{2}} b") == r"\boxed{{1}+{2}}"


@pytest.mark.parametrize("source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"])
def test_math_score(source):
    assert compute_score(source, r"... so the answer is $\boxed{\dfrac{1}{2}}$.", "0.5")["score"] == 1.0
    assert compute_score(source, r"... $\boxed{\frac{1}{3}}$", r"\frac{1}{2}")["score"] == 0.0
    assert compute_score(source, "the answer is 1/2", "1/2")["score"] == 0.0  # no box
    # A full reference solution is reduced to its boxed answer.
    assert compute_score(source, r"\boxed{12}", r"We get $\boxed{12}$.")["acc"] == 1.0


def test_math_dapo():
    right = compute_score("math_dapo", "Let me think.\nAnswer: 204", "204")
    assert right == {"score": 1.0, "acc": 1.0, "pred": "204"}
    assert compute_score("math_dapo", "Answer: 205", "204")["score"] == -1.0
    assert compute_score("aime2025", "no answer", "204")["score"] == -1.0
    assert compute_score("aime2025", r"final: \boxed{204}", "204")["score"] == 1.0
    assert compute_score("math_dapo", "Answer: $\\frac{1}{2}$", "0.5")["acc"] == 1.0
