import pickle

import pytest

from rljax.data.synthetic import make_rows
from rljax.rewards import FormatReward, compute_score, extract_tag, format_ok


@pytest.mark.parametrize(
    "text, ok",
    [
        ("<think>because</think><answer>4</answer>", True),
        ("  <think>a\nb</think>\n<answer>\n4\n</answer>\n", True),
        ("<answer>4</answer>", False),
        ("<think>x</think>", False),
        ("<think>x</think><answer>4</answer> trailing", False),
        ("preamble <think>x</think><answer>4</answer>", False),
    ],
)
def test_think_answer_format(text, ok):
    assert format_ok(text) is ok
    assert compute_score("format/think_answer", text, None)["score"] == float(ok)


def test_configurable_format_reward():
    fn = FormatReward(r"^<answer>.*</answer>$", score=0.1, wrong_score=-0.1)
    assert fn("x", "<answer>4</answer>")["score"] == 0.1
    assert fn("x", "4")["score"] == -0.1
    assert pickle.loads(pickle.dumps(fn))("x", "<answer>4</answer>")["score"] == 0.1
    with pytest.raises(Exception):
        FormatReward("(unclosed")


def test_extract_tag():
    assert extract_tag("<answer> a </answer><answer>b</answer>") == "b"
    assert extract_tag("<result>7</result>", "result") == "7"
    assert extract_tag("none") is None


@pytest.mark.parametrize("task", ["arithmetic", "reverse", "uppercase"])
def test_synthetic_rows_score(task):
    for row in make_rows("rl", 5, task=task):
        truth = row["reward_model"]["ground_truth"]
        ds = row["data_source"]
        assert ds == f"synthetic/{task}"
        assert compute_score(ds, f" {truth}\n", truth)["score"] == 1.0
        assert compute_score(ds, truth + "x", truth)["score"] == 0.0
        assert compute_score(ds, "", truth)["score"] == 0.0


def test_synthetic_case_matters():
    assert compute_score("synthetic/uppercase", "abc", "ABC")["score"] == 0.0


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("The answer is 19.", "19", 1.0),
        ("40 + 72 = 112", "112", 1.0),
        ("40 + 72 = 110", "112", 0.0),  # the last number is the answer
        ("112 is close, but 40 + 72 = 102", "112", 0.0),
        ("It is 1,234.", "1234", 1.0),
        ("19.0", "19", 1.0),
        ("nineteen", "19", 0.0),
        ("", "19", 0.0),
    ],
)
def test_synthetic_last_number_grading(response, truth, score):
    graded = compute_score("synthetic/arithmetic", response, truth, extra_info={"grading": "last_number"})
    assert graded["score"] == graded["acc"] == score
    exact = compute_score("synthetic/arithmetic", response, truth, extra_info={})
    assert exact["score"] == float(response.strip() == truth)
