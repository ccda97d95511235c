"""DAPO's soft overlong punishment (Yu et al. 2025, eq. 13; verl's DAPO reward manager).

With ``L_max = max_response_length`` and ``L_cache = overlong_buffer_len``::

    R_length(|y|) = 0                                   if |y| <= L_max - L_cache
                  = (L_max - L_cache - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                  = -1                                  if |y| > L_max

times `penalty_factor`, added to the task reward. verl computes
``min(-(|y| - (L_max - L_cache)) / L_cache * penalty_factor, 0)``, the same for
``|y| <= L_max``; we also clip at ``-penalty_factor`` beyond ``L_max`` as the paper does.
"""

from __future__ import annotations

import numpy as np


def overlong_penalty(
    response_lengths, max_response_length: int, overlong_buffer_len: int, penalty_factor: float = 1.0
) -> np.ndarray:
    """Per-sample penalty (<= 0, float32) for response lengths in tokens."""
    if overlong_buffer_len <= 0 or overlong_buffer_len > max_response_length:
        raise ValueError(
            f"overlong_buffer_len must be in [1, max_response_length={max_response_length}], got {overlong_buffer_len}"
        )
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")
    lengths = np.asarray(response_lengths, dtype=np.float64)
    expected = max_response_length - overlong_buffer_len
    penalty = -(lengths - expected) / overlong_buffer_len * penalty_factor
    return np.clip(penalty, -penalty_factor, 0.0).astype(np.float32)


def apply_overlong_penalty(
    scores, response_lengths, max_response_length: int, overlong_buffer_len: int, penalty_factor: float = 1.0
) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, float]]:
    """``scores + overlong_penalty(...)``, the per-sample extras verl logs
    (``overlong_reward``, ``overlong``) and batch metrics (``reward/overlong_reward/mean``,
    ``reward/overlong_frac``)."""
    penalty = overlong_penalty(response_lengths, max_response_length, overlong_buffer_len, penalty_factor)
    scores = np.asarray(scores, dtype=np.float32)
    if scores.shape != penalty.shape:
        raise ValueError(f"scores {scores.shape} and response_lengths {penalty.shape} differ in shape")
    overlong = penalty < 0
    metrics = {
        "reward/overlong_reward/mean": float(penalty.mean()) if penalty.size else 0.0,
        "reward/overlong_frac": float(overlong.mean()) if penalty.size else 0.0,
    }
    return scores + penalty, {"overlong_reward": penalty, "overlong": overlong}, metrics
