import itertools
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.evaluation import expected_max_at_k, expected_min_at_k, pass_at_k, pass_at_k_array


def test_hand_computed():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - comb(3, 2) / comb(5, 2)) == pytest.approx(0.7)
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(5, 3, 3) == 1.0  # n - c < k
    assert pass_at_k(10, 3, 10) == 1.0


def test_large_n_is_stable():
    # comb(1000, 500) overflows float; the product form does not.
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)
    assert pass_at_k(1000, 10, 1) == pytest.approx(0.01)


def test_invalid():
    for n, c, k in [(5, 6, 1), (5, 1, 6), (5, 1, 0), (0, 0, 1), (5, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_matches_binomial_and_is_monotone(nck):
    n, c, k = nck
    p = pass_at_k(n, c, k)
    assert p == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)
    assert 0.0 <= p <= 1.0
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p - 1e-12  # more tries never hurt
    if c < n:
        assert pass_at_k(n, c + 1, k) >= p - 1e-12  # more correct never hurts


def test_array():
    np.testing.assert_allclose(pass_at_k_array([5, 4], [2, 1], 2), [0.7, 0.5])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=7), st.data())
def test_best_worst_equal_subset_enumeration(values, data):
    k = data.draw(st.integers(1, len(values)))
    subsets = list(itertools.combinations(values, k))
    assert expected_max_at_k(values, k) == pytest.approx(np.mean([max(s) for s in subsets]), abs=1e-9)
    assert expected_min_at_k(values, k) == pytest.approx(np.mean([min(s) for s in subsets]), abs=1e-9)


def test_best_equals_pass_on_binary():
    values = [1, 0, 0, 1, 0, 0, 0]
    for k in range(1, 8):
        assert expected_max_at_k(values, k) == pytest.approx(pass_at_k(7, 2, k))
