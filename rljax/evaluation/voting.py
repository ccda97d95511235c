"""Majority voting (self-consistency, Wang et al. 2022) over extracted final answers.

`majority_vote`: the most frequent answer among the samples that have one (None = no
answer, casts no vote); a tie goes to the answer that occurs first in sample order. Its
value is the mean value (score / accuracy) of the samples that gave it; with no answer at
all, the mean value of all samples.

`maj_at_k`: the expected majority-vote value of a uniformly random k-subset (without
replacement). Exact for k = n; otherwise the mean over `n_resamples` seeded random
subsets (deterministic in `seed`), as verl estimates ``maj@k`` by resampling.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


def _encode(answers: Sequence[Hashable | None]) -> np.ndarray:
    """Answers -> ids 0.. in first-occurrence order; None -> -1."""
    ids: dict[Hashable, int] = {}
    return np.array([-1 if a is None else ids.setdefault(a, len(ids)) for a in answers], dtype=np.int64)


def majority_vote(answers: Sequence[Hashable | None], values: Sequence[float]) -> tuple[Hashable | None, float]:
    """(winning answer, its mean value); (None, mean of all values) if nobody answered."""
    if len(answers) != len(values) or not answers:
        raise ValueError(f"need equal, non-zero numbers of answers and values, got {len(answers)} and {len(values)}")
    vals = np.asarray(values, dtype=np.float64)
    ids = _encode(answers)
    if (ids < 0).all():
        return None, float(vals.mean())
    counts = np.bincount(ids[ids >= 0])
    winner = int(np.argmax(counts))  # argmax returns the first maximum: lowest id = first seen
    first = int(np.flatnonzero(ids == winner)[0])
    return answers[first], float(vals[ids == winner].mean())


def maj_at_k(
    answers: Sequence[Hashable | None], values: Sequence[float], k: int, n_resamples: int = 1000, seed: int = 0
) -> float:
    """Expected majority-vote value of a random k-subset (see the module docstring)."""
    n = len(answers)
    if len(values) != n:
        raise ValueError(f"answers ({n}) and values ({len(values)}) differ in length")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if k == n:
        return majority_vote(answers, values)[1]
    ids = _encode(answers)
    vals = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    # Subsets as sorted index rows [R, k]: sample order is kept inside each subset.
    subsets = np.sort(np.argsort(rng.random((n_resamples, n)), axis=1)[:, :k], axis=1)
    sub_ids, sub_vals = ids[subsets], vals[subsets]
    num_answers = int(ids.max()) + 1
    if num_answers == 0:
        return float(sub_vals.mean())
    onehot = sub_ids[:, :, None] == np.arange(num_answers)[None, None, :]  # [R, k, A]
    counts = onehot.sum(axis=1)  # [R, A]
    value_sums = (onehot * sub_vals[:, :, None]).sum(axis=1)
    positions = np.where(onehot, np.arange(k)[None, :, None], k).min(axis=1)  # first position, k if absent
    best = counts.max(axis=1, keepdims=True)
    tie_key = np.where((counts == best) & (counts > 0), positions, k + 1)
    winner = tie_key.argmin(axis=1)  # earliest-occurring among the most frequent
    rows = np.arange(n_resamples)
    win_counts = counts[rows, winner]
    result = np.where(win_counts > 0, value_sums[rows, winner] / np.maximum(win_counts, 1), sub_vals.mean(axis=1))
    return float(result.mean())
