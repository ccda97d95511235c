import itertools

import numpy as np
import pytest

from rljax.evaluation import maj_at_k, majority_vote


def test_majority_vote():
    assert majority_vote(["1", "2", "2", "3"], [0, 1, 1, 0]) == ("2", 1.0)
    # Tie between "5" and "7": the one seen first wins, whatever the values.
    assert majority_vote(["7", "5", "5", "7"], [1, 0, 0, 1]) == ("7", 1.0)
    assert majority_vote(["5", "7", "7", "5"], [0, 1, 1, 0]) == ("5", 0.0)
    # No answer casts no vote.
    assert majority_vote([None, None, "4"], [0, 0, 1]) == ("4", 1.0)
    assert majority_vote([None, None], [0.0, 1.0]) == (None, 0.5)
    with pytest.raises(ValueError):
        majority_vote([], [])


def exact_maj_at_k(answers, values, k):
    return np.mean([majority_vote([answers[i] for i in s], [values[i] for i in s])[1]
                    for s in itertools.combinations(range(len(answers)), k)])


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_maj_at_k_matches_enumeration(k):
    answers = ["a", "b", "a", None, "c", "a"]
    values = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    got = maj_at_k(answers, values, k, n_resamples=4000, seed=1)
    assert got == pytest.approx(exact_maj_at_k(answers, values, k), abs=0.03)


def test_maj_at_k_deterministic_and_exact_at_n():
    answers, values = ["x", "y", "y", "x", "y"], [0, 1, 1, 0, 1]
    assert maj_at_k(answers, values, 3, seed=3) == maj_at_k(answers, values, 3, seed=3)
    assert maj_at_k(answers, values, 5) == 1.0
    assert maj_at_k([None] * 3, [0.0, 1.0, 1.0], 2) == pytest.approx(2 / 3, abs=0.05)
    with pytest.raises(ValueError):
        maj_at_k(answers, values, 6)
