import pytest

from rljax.rewards import (
    UnknownDataSourceError,
    compute_score,
    get_answer_extractor,
    get_reward_fn,
    known_data_sources,
    register_reward,
)
from rljax.rewards.registry import REWARDS, PatternRegistry

EXPECTED = [
    "openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
    "math_dapo", "aime*", "countdown", "format/think_answer",
    "synthetic/arithmetic", "synthetic/reverse", "synthetic/uppercase", "synthetic/*",
]


def test_builtins_registered():
    names = known_data_sources()
    for name in EXPECTED:
        assert name in names


def test_patterns_and_specificity():
    reg = PatternRegistry("thing")
    reg.register(["*"], "any")
    reg.register(["a/*"], "a-any")
    reg.register(["a/b*"], "a-b")
    reg.register(["a/bc"], "exact")
    assert reg.get("a/bc") == "exact"
    assert reg.get("a/bd") == "a-b"
    assert reg.get("a/x") == "a-any"
    assert reg.get("zzz") == "any"
    assert get_reward_fn("aime2024") is get_reward_fn("math_dapo")
    assert get_reward_fn("synthetic/brand_new_task") is get_reward_fn("synthetic/reverse")


def test_unknown_source_lists_known():
    with pytest.raises(UnknownDataSourceError) as err:
        get_reward_fn("nobody/knows")
    msg = str(err.value)
    assert "nobody/knows" in msg and "openai/gsm8k" in msg and "synthetic/*" in msg
    with pytest.raises(UnknownDataSourceError):
        compute_score("nobody/knows", "x", "y")


def test_register_decorator_and_duplicates():
    @register_reward("test/const", "test/glob-*")
    def const(data_source, solution_str, ground_truth, extra_info=None):
        return 0.25

    try:
        assert compute_score("test/const", "", None) == 0.25
        assert compute_score("test/glob-7", "", None) == 0.25
        with pytest.raises(ValueError, match="already registered"):
            register_reward("test/const")(lambda *a, **k: 1.0)
        register_reward("test/const", overwrite=True)(lambda *a, **k: 1.0)
        assert compute_score("test/const", "", None) == 1.0
        with pytest.raises(ValueError):
            register_reward()
    finally:
        REWARDS.unregister("test/const")
        REWARDS.unregister("test/glob-*")
    assert "test/const" not in known_data_sources()


def test_extractors():
    assert get_answer_extractor("openai/gsm8k")("so #### 1,000") == "1000"
    assert get_answer_extractor("lighteval/MATH")(r"\boxed{\dfrac{2}{4}}") == "1/2"
    assert get_answer_extractor("synthetic/reverse")(" cba ") == "cba"
    assert get_answer_extractor("no/such") is None
