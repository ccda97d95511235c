import pytest

from rljax.rewards import compute_score
from rljax.rewards.gsm8k import extract_solution, gsm8k_score


@pytest.mark.parametrize(
    "text, strict, flexible",
    [
        ("She has 3 apples.\n#### 42", "42", "42"),
        ("#### 1,234", "1234", "1234"),
        ("#### $5.", "5", "5"),
        ("####-7", "-7", "-7"),
        ("first #### 1 then #### 2", "2", "2"),
        ("The answer is 12, not 13.", None, "13"),
        ("no numbers here", None, None),
        ("#### abc", None, None),
    ],
)
def test_extract(text, strict, flexible):
    assert extract_solution(text, "strict") == strict
    assert extract_solution(text, "flexible") == flexible


def test_only_tail_is_searched():
    text = "#### 42" + " filler" * 100
    assert extract_solution(text, "strict") is None


def test_bad_method():
    with pytest.raises(ValueError):
        extract_solution("#### 1", "loose")


@pytest.mark.parametrize(
    "text, truth, score",
    [
        ("work... #### 42", "42", 1.0),
        ("work... #### 42.0", "42", 1.0),
        ("work... #### 1,000", "1000", 1.0),
        ("work... #### 41", "42", 0.0),
        ("the answer is 42", "42", 0.0),  # strict: no marker
        ("", "42", 0.0),
    ],
)
def test_compute_score_strict(text, truth, score):
    out = compute_score("openai/gsm8k", text, truth)
    assert out["score"] == score and out["acc"] == score


def test_flexible_and_format_score():
    assert gsm8k_score("the answer is 42.", "42", method="flexible") == 1.0
    assert gsm8k_score("#### 41", "42", format_score=0.1) == 0.1
    assert gsm8k_score("nothing", "42", format_score=0.1) == 0.0
    out = compute_score("openai/gsm8k", "so 7", "7", method="flexible")
    assert out == {"score": 1.0, "acc": 1.0, "pred": "7"}
