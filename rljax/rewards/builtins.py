"""Importing this module registers every built-in reward function and answer extractor.

Each scorer module is imported by its full name (not ``from rljax.rewards import ...``),
so this module depends on the scorers only and not on the package ``__init__`` that
imports it.
"""

import rljax.rewards.code  # noqa: F401
import rljax.rewards.countdown  # noqa: F401
import rljax.rewards.format_reward  # noqa: F401
import rljax.rewards.geo3k  # noqa: F401
import rljax.rewards.gsm8k  # noqa: F401
import rljax.rewards.math_boxed  # noqa: F401
import rljax.rewards.math_dapo  # noqa: F401
import rljax.rewards.numina  # noqa: F401
import rljax.rewards.search_r1  # noqa: F401
import rljax.rewards.synthetic  # noqa: F401
import rljax.rewards.synthetic_tools  # noqa: F401
