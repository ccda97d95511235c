"""The prompts a real model is benchmarked on: two-digit additions asked as a question.

`rljax bench step --path` and TRL's side of `--trl` (`rljax.bench.trl_step`) both draw
them from the synthetic arithmetic task (`rljax.data.synthetic`) with these knobs,
graded on the last number of the answer.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

REAL_MODEL_PROMPT = "What is {expression}? Answer with the number only."
REAL_MODEL_KNOBS = {"digits": 2, "operators": "+", "grading": "last_number", "template": REAL_MODEL_PROMPT}


def real_model_spec(n: int) -> str:
    """The `synthetic:` data spec of `n` such rows (seed 0)."""
    return f"synthetic:arithmetic/rl?n={n}&seed=0&" + urlencode(REAL_MODEL_KNOBS, quote_via=quote)


def real_model_rows(n: int) -> list[dict]:
    """The first `n` rows that `real_model_spec` writes."""
    from rljax.data.synthetic import make_rows

    return make_rows("rl", n, seed=0, task="arithmetic", **REAL_MODEL_KNOBS)
