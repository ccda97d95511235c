"""Group assignment: whole groups per replica in contiguous runs, the largest expected-token
load as small as any contiguous split allows (checked by brute force), deterministic."""

import itertools

import numpy as np
import pytest

from rljax.rollout.assign import Group, assign_groups


def random_groups(rng, count):
    return [Group(int(rng.integers(1, 200)), int(rng.integers(1, 9)), int(rng.integers(1, 100))) for _ in range(count)]


def best_contiguous_max_load(groups, replicas):
    """The optimum over every contiguous split, by brute force (small instances only)."""
    sizes = [g.expected_tokens for g in groups]
    best = None
    for cuts in itertools.combinations(range(1, len(sizes)), replicas - 1):
        bounds = (0, *cuts, len(sizes))
        worst = max(sum(sizes[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = worst if best is None else min(best, worst)
    return best


def is_contiguous(assignment):
    return list(assignment.replica_of) == sorted(assignment.replica_of)


def test_expected_tokens_count_the_prompt_once_or_take_the_estimate():
    assert Group(prompt_len=10, num_samples=4, max_response_len=20).expected_tokens == 10 + 4 * 20
    assert Group(10, 4, 20, estimate=33).expected_tokens == 33


def test_hand_computed_assignment():
    # sizes 50, 100, 30, 90, 40 on 2 replicas: the cuts give 50 | 260, 150 | 160,
    # 180 | 130 and 270 | 40; the best is 150 | 160
    groups = [Group(0, 1, 0, estimate=e) for e in (50, 100, 30, 90, 40)]
    a = assign_groups(groups, 2)
    assert a.replica_of == (0, 0, 1, 1, 1)
    assert a.loads(groups) == [150, 160]
    assert best_contiguous_max_load(groups, 2) == 160
    assert is_contiguous(a)


def test_largest_load_is_the_best_contiguous_one():
    rng = np.random.default_rng(0)
    for replicas in (2, 3):
        for _ in range(20):
            groups = random_groups(rng, 7)
            a = assign_groups(groups, replicas)
            assert is_contiguous(a)
            assert max(a.loads(groups)) == best_contiguous_max_load(groups, replicas)


def test_balance_on_large_batches_is_within_one_group_of_the_mean():
    rng = np.random.default_rng(1)
    for replicas in (1, 2, 4, 8, 16):
        groups = random_groups(rng, 256)
        loads = assign_groups(groups, replicas).loads(groups)
        sizes = [g.expected_tokens for g in groups]
        assert sum(loads) == sum(sizes)
        assert max(loads) <= sum(sizes) / replicas + max(sizes)


def test_deterministic_and_equal_groups_split_evenly():
    groups = [Group(4, 2, 8)] * 8
    assert assign_groups(groups, 4).replica_of == (0, 0, 1, 1, 2, 2, 3, 3)
    rng = np.random.default_rng(2)
    groups = random_groups(rng, 50)
    assert assign_groups(groups, 4) == assign_groups(list(groups), 4)


def test_more_replicas_than_groups_leaves_some_idle_and_bad_counts_fail():
    a = assign_groups([Group(3, 1, 3), Group(5, 1, 3)], 4)
    assert a.per_replica == ((0,), (1,), (), ())
    assert assign_groups([], 3).per_replica == ((), (), ())
    with pytest.raises(ValueError, match="num_replicas"):
        assign_groups([Group(1, 1, 1)], 0)
