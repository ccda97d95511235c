"""Rewards: rule-based scorers keyed by ``data_source`` (verl's ``compute_score``), custom
reward files, a reward model, a generative verifier, and a contained batch manager; each
is a reward source (`rljax.rewards.sources`) that a config combines.

Registered data sources (`known_data_sources()`), verl's names sent where verl's
``default_compute_score`` sends them: ``openai/gsm8k``, ``gsm8k``; ``lighteval/MATH``,
``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500`` (`math_boxed`);
``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*`` (`math_dapo`); ``numina_*``
(verl's six, `numina`); ``hiyouga/geometry3k`` (`geo3k`); ``searchR1_*`` (verl's seven,
`search_r1`); ``countdown``, ``countdown*``; ``format/think_answer``;
``synthetic/arithmetic``, ``synthetic/reverse``, ``synthetic/uppercase``, ``synthetic/*``;
``synthetic/tool_arithmetic`` (`rljax.rewards.synthetic_tools`); ``codecontests``,
``apps``, ``codeforces``, ``taco`` (`rljax.rewards.code`: the tests run in the OS sandbox
or on a SandboxFusion server). `has_reward_fn` warns once per data source that has none.

This package does not import JAX: reward worker processes load it cheaply.
`ScalarHeadScorer` (JAX) is imported on first use.
"""

from __future__ import annotations

from typing import Any

from rljax.rewards import builtins as _builtins  # noqa: F401  (registers the built-ins)
from rljax.rewards.countdown import safe_eval
from rljax.rewards.custom import CustomRewardError, FileRewardFn, custom_reward_fn_from_config, load_function
from rljax.rewards.format_reward import THINK_ANSWER_PATTERN, FormatReward, extract_tag, format_ok
from rljax.rewards.manager import NonFiniteRewardError, RewardFailureError, RewardManager, WithKwargs
from rljax.rewards.math_normalize import (
    canonical_answer,
    extract_boxed_answer,
    last_boxed_only_string,
    math_equal,
    normalize_math_answer,
    parse_number,
    remove_boxed,
)
from rljax.rewards.overlong import apply_overlong_penalty, overlong_penalty
from rljax.rewards.pool import Outcome, ScoringPool
from rljax.rewards.registry import (
    UnknownDataSourceError,
    default_compute_score,
    get_answer_extractor,
    get_reward_fn,
    has_reward_fn,
    known_data_sources,
    register_answer_extractor,
    register_reward,
)
from rljax.rewards.result import RewardResult, read_score
from rljax.rewards.sources import (
    Combine,
    FunctionSource,
    RewardBatch,
    RewardModelSource,
    RewardSource,
    RewardSources,
    VerifierSource,
)
from rljax.rewards.verifier import GenerativeVerifier, parse_score, parse_yes_no

compute_score = default_compute_score

_LAZY = {"RewardModelScorer", "ScalarHeadScorer"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from rljax.rewards import reward_model

        return getattr(reward_model, name)
    raise AttributeError(f"module 'rljax.rewards' has no attribute {name!r}")


__all__ = [
    "Combine",
    "CustomRewardError",
    "FileRewardFn",
    "FormatReward",
    "FunctionSource",
    "GenerativeVerifier",
    "NonFiniteRewardError",
    "Outcome",
    "RewardBatch",
    "RewardFailureError",
    "RewardManager",
    "RewardModelScorer",
    "RewardModelSource",
    "RewardResult",
    "RewardSource",
    "RewardSources",
    "ScalarHeadScorer",
    "ScoringPool",
    "THINK_ANSWER_PATTERN",
    "UnknownDataSourceError",
    "VerifierSource",
    "WithKwargs",
    "apply_overlong_penalty",
    "canonical_answer",
    "compute_score",
    "custom_reward_fn_from_config",
    "default_compute_score",
    "extract_boxed_answer",
    "extract_tag",
    "format_ok",
    "get_answer_extractor",
    "get_reward_fn",
    "has_reward_fn",
    "known_data_sources",
    "last_boxed_only_string",
    "load_function",
    "math_equal",
    "normalize_math_answer",
    "overlong_penalty",
    "parse_number",
    "parse_score",
    "parse_yes_no",
    "read_score",
    "register_answer_extractor",
    "register_reward",
    "remove_boxed",
    "safe_eval",
]
