"""Step metrics combine over parts of a step (rollouts, replicas) by their declared reduction;
expected values computed by hand."""

import pytest

from rljax.agent.loop import collect_metrics
from rljax.agent.trajectory import Trajectory
from rljax.metrics import declare_reduction, reduce_metrics, reduction_of
from rljax.rl.batch import Sample
from rljax.rl.replica_rollout import merge_rollouts
from rljax.rl.scoring import ScoredRollout


def test_each_reduction_by_hand():
    a = {"reward/overlong_frac": 0.5, "reward/errors": 1.0, "agent/num_turns/max": 3.0, "agent/num_turns/min": 1.0,
         "agent/num_turns/mean": 2.0}
    b = {"reward/overlong_frac": 1.0, "reward/errors": 2.0, "agent/num_turns/max": 5.0, "agent/num_turns/min": 2.0,
         "agent/num_turns/mean": 4.0}
    out = reduce_metrics([a, b], [4, 4])
    assert out["reward/overlong_frac"] == 0.75  # (0.5 * 4 + 1.0 * 4) / 8: a fraction, not 1.5
    assert out["reward/errors"] == 3.0  # a count adds
    assert out["agent/num_turns/max"] == 5.0 and out["agent/num_turns/min"] == 1.0
    # means weighted by samples: (2 * 1 + 4 * 3) / 4
    assert reduce_metrics([a, b], [1, 3])["agent/num_turns/mean"] == 3.5
    # a part of weight 0 is left out; a part without the key is left out of that key
    assert reduce_metrics([a, {"reward/errors": 7.0}], [2, 0]) == a
    assert reduce_metrics([a, {}], [2, 2])["reward/overlong_frac"] == 0.5


def test_an_undeclared_metric_is_an_error_until_declared():
    with pytest.raises(KeyError, match="'custom/hits' declares no reduction"):
        reduce_metrics([{"custom/hits": 1.0}], [1])
    declare_reduction("custom/*", "sum")
    try:
        assert reduction_of("custom/hits") == "sum"
        assert reduce_metrics([{"custom/hits": 1.0}, {"custom/hits": 2.0}], [1, 1]) == {"custom/hits": 3.0}
    finally:
        from rljax import metrics

        metrics.REDUCTIONS.remove(("custom/*", "sum"))
    with pytest.raises(ValueError, match="expected one of"):
        declare_reduction("custom/*", "median")


def _part(n, metrics):
    return ScoredRollout([Sample([1], [2], [1], [0.0], group_id=i) for i in range(n)], metrics)


def test_replicas_merge_counts_and_fractions():
    # replica 0: 1 prompt, 1 error, overlong 0.5; replica 1: 3 prompts, 2 errors, overlong 1.0
    merged = merge_rollouts([_part(1, {"reward/errors": 1.0, "reward/overlong_frac": 0.5}),
                             _part(3, {"reward/errors": 2.0, "reward/overlong_frac": 1.0})], [1, 3])
    assert merged.metrics == {"reward/errors": 3.0, "reward/overlong_frac": (0.5 + 3.0) / 4}


def test_agent_termination_fractions_combine_over_parts():
    def episodes(reason, n):
        return [Trajectory([1], [2], [1], [0.0], termination=reason) for _ in range(n)]

    first, second = collect_metrics(episodes("stop", 2)), collect_metrics(episodes("max_turns", 2))
    assert first["agent/termination/max_turns"] == 0.0  # reported, though no episode ended so
    out = reduce_metrics([first, second], [2, 2])
    assert out["agent/termination/stop"] == 0.5 and out["agent/termination/max_turns"] == 0.5
