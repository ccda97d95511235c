from fractions import Fraction

import pytest

from rljax.rewards import compute_score, safe_eval
from rljax.rewards.countdown import numbers_ok

GT = {"target": 24, "numbers": [4, 6, 1]}


@pytest.mark.parametrize(
    "expr, value",
    [
        ("1 + 2 * 3", Fraction(7)),
        ("(1 + 2) * 3", Fraction(9)),
        ("7 / 2", Fraction(7, 2)),
        ("-3 + 5", Fraction(2)),
        ("1 / 0", None),
        ("2 ** 10", None),
        ("__import__('os')", None),
        ("1.5 + 1", None),
        ("(1 + ", None),
        ("abs(-1)", None),
        ("1" + "+1" * 1000, None),  # too long
    ],
)
def test_safe_eval(expr, value):
    assert safe_eval(expr) == value


def test_numbers_rules():
    assert numbers_ok("4 * 6 * 1", [4, 6, 1])
    assert not numbers_ok("4 * 6", [4, 6, 1])  # TinyZero: all numbers
    assert numbers_ok("4 * 6", [4, 6, 1], require_all=False)
    assert not numbers_ok("4 * 6 * 6", [4, 6, 1], require_all=False)  # 6 given once
    assert not numbers_ok("4 * 6 * 10", [4, 6, 1], require_all=False)


@pytest.mark.parametrize(
    "response, score",
    [
        ("<think>4*6=24</think> <answer>4 * 6 * 1</answer>", 1.0),
        ("<answer>(6 - 1 - 1) * 6</answer>", 0.1),  # numbers reused
        ("<answer>4 * 6 + 1</answer>", 0.1),  # wrong value
        ("<answer>4 * 6 * 1 = 24</answer>", 0.1),  # "=" is not allowed
        ("<answer>import os</answer>", 0.1),
        ("<answer>x</answer> then <answer>6*4*1</answer>", 1.0),  # last block counts
        ("4 * 6 * 1", 0.0),  # no answer block
    ],
)
def test_countdown_scores(response, score):
    assert compute_score("countdown", response, GT)["score"] == pytest.approx(score)


def test_countdown_at_most_once_and_numpy_ground_truth():
    np = pytest.importorskip("numpy")
    gt = {"target": np.int64(24), "numbers": np.array([4, 6, 1, 9])}
    assert compute_score("countdown", "<answer>4*6</answer>", gt)["score"] == pytest.approx(0.1)
    assert compute_score("countdown", "<answer>4*6</answer>", gt, require_all=False)["score"] == 1.0


def test_bad_ground_truth():
    with pytest.raises(ValueError, match="target"):
        compute_score("countdown", "<answer>1</answer>", "24")
