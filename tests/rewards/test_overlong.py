import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.rewards import apply_overlong_penalty, overlong_penalty


def test_known_values():
    # L_max = 100, buffer 20: no penalty up to 80, linear to -1 at 100, -1 beyond.
    lengths = [0, 80, 81, 90, 100, 120]
    expected = [0.0, 0.0, -0.05, -0.5, -1.0, -1.0]
    np.testing.assert_allclose(overlong_penalty(lengths, 100, 20), expected, atol=1e-7)
    np.testing.assert_allclose(overlong_penalty(lengths, 100, 20, penalty_factor=0.5), np.array(expected) / 2, atol=1e-7)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 512), st.integers(1, 512), st.floats(0.0, 4.0))
def test_monotone_and_bounded(max_len, buf, factor):
    buf = min(buf, max_len)
    lengths = np.arange(0, max_len + 10)
    p = overlong_penalty(lengths, max_len, buf, factor)
    assert (np.diff(p) <= 1e-6).all()
    assert (p <= 0).all() and (p >= -factor - 1e-6).all()
    assert (p[: max_len - buf + 1] == 0).all()


def test_apply_and_validation():
    scores, extras, metrics = apply_overlong_penalty([1.0, 1.0], [10, 100], 100, 20)
    np.testing.assert_allclose(scores, [1.0, 0.0])
    assert extras["overlong"].tolist() == [False, True]
    assert metrics["reward/overlong_frac"] == 0.5
    with pytest.raises(ValueError):
        overlong_penalty([1], 100, 0)
    with pytest.raises(ValueError):
        overlong_penalty([1], 100, 101)
    with pytest.raises(ValueError):
        apply_overlong_penalty([1.0], [1, 2], 100, 10)
