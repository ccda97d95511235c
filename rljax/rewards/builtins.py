"""Importing this module registers every built-in reward function and answer extractor."""

from rljax.rewards import (  # noqa: F401
    countdown,
    format_reward,
    geo3k,
    gsm8k,
    math_boxed,
    math_dapo,
    numina,
    search_r1,
    synthetic,
    synthetic_tools,
)
