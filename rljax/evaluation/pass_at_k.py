"""Unbiased best-of-k estimators from n samples per problem (Chen et al. 2021, "Evaluating
Large Language Models Trained on Code", eq. 1 and its numerically stable form).

With n samples of which c are correct, the chance that a uniformly random k-subset
(without replacement) contains a correct one is::

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

(1.0 when n - c < k). `expected_max_at_k` / `expected_min_at_k` generalise this to real
scores: the expected best / worst score of a random k-subset, exactly (sorted ascending,
``P(max = v_(i)) = C(i-1, k-1) / C(n, k)``); on 0/1 scores ``expected_max_at_k == pass@k``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def _check(n: int, k: int) -> None:
    if k < 1 or n < 1 or k > n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with `c` correct of `n` samples."""
    _check(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_array(n: Sequence[int], c: Sequence[int], k: int) -> np.ndarray:
    """`pass_at_k` per problem (``n``, ``c`` arrays of equal length)."""
    ns, cs = np.asarray(n).reshape(-1), np.asarray(c).reshape(-1)
    if ns.shape != cs.shape:
        raise ValueError(f"n {ns.shape} and c {cs.shape} differ in shape")
    return np.array([pass_at_k(int(a), int(b), k) for a, b in zip(ns, cs)], dtype=np.float64)


def _order_stat_weights(n: int, k: int) -> np.ndarray:
    """``w[i] = C(i, k-1) / C(n, k)`` for i = 0..n-1 (0-based rank in ascending order):
    the chance that the i-th smallest is the maximum of a random k-subset. Computed by the
    ratio ``w[i-1] / w[i] = (i + 1 - k) / i`` from ``w[n-1] = k / n``."""
    w = np.zeros(n, dtype=np.float64)
    w[n - 1] = k / n
    for i in range(n - 1, k - 1, -1):
        w[i - 1] = w[i] * (i + 1 - k) / i
    return w


def expected_max_at_k(values: Sequence[float], k: int) -> float:
    """E[max of a uniformly random k-subset of `values`] (exact, no resampling)."""
    v = np.sort(np.asarray(values, dtype=np.float64).reshape(-1))
    _check(v.size, k)
    return float(np.dot(_order_stat_weights(v.size, k), v))


def expected_min_at_k(values: Sequence[float], k: int) -> float:
    """E[min of a uniformly random k-subset of `values`]."""
    return -expected_max_at_k(-np.asarray(values, dtype=np.float64), k)
