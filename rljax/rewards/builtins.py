"""Importing this module registers every built-in reward function and answer extractor."""

from rljax.rewards import (  # noqa: F401
    countdown,
    format_reward,
    gsm8k,
    math_boxed,
    math_dapo,
    synthetic,
    synthetic_tools,
)
