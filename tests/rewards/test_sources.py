"""`RewardSources`, the combiner of reward sources: sources apply in order, each folded in
by its `Combine`; every score and the running score must be finite in float32; every metric
a source emits is declared by it with the reduction `rljax.metrics` gives it."""

import numpy as np
import pytest

from rljax.metrics import reduction_of
from rljax.rewards import RewardManager
from rljax.rewards.manager import NonFiniteRewardError
from rljax.rewards.result import RewardResult
from rljax.rewards.sources import (
    Combine,
    FunctionSource,
    RewardBatch,
    RewardModelSource,
    RewardSources,
    VerifierSource,
)


class Fixed:
    """A source with fixed scores, extras, metrics and errors."""

    def __init__(self, name, scores, extras=None, metrics=None, errors=None, reductions=None):
        self.name = name
        self.result = RewardResult(np.asarray(scores, np.float32), extras or {}, metrics or {}, errors or {})
        self.reductions = reductions or {}
        self.closed = False

    def score(self, batch):
        return self.result

    def close(self):
        self.closed = True


def batch(n=3):
    items = [{"data_source": f"d{i}", "solution_str": "x", "ground_truth": "x", "uid": 10 + i} for i in range(n)]
    return RewardBatch(items, [[1, 2]] * n)


def test_sources_apply_in_order_with_their_combine():
    rule = Fixed("rule", [1.0, 0.0, 0.5], {"acc": [1, 0, None]}, {"reward/errors": 1.0}, {1: "error: boom"},
                 {"reward/errors": "sum"})
    rm = Fixed("rm", [2.0, 4.0, 6.0], {"reward_model_score": [2.0, 4.0, 6.0]}, {"reward_model/score/max": 6.0},
               reductions={"reward_model/score/max": "max"})
    judge = Fixed("judge", [1.0, 0.0, 1.0], {"verifier_output": ["Yes", "No", "Yes"]}, {"verifier/parse_failures": 1.0},
                  {1: "verifier: unparseable", 2: "verifier: unparseable"}, {"verifier/parse_failures": "sum"})
    # rule, then + 0.5 x RM: [1 + 1, 0 + 2, 0.5 + 3]
    added = RewardSources([(rule, Combine()), (rm, Combine("add", 0.5))]).score(batch())
    assert added.scores.dtype == np.float32 and added.scores.tolist() == [2.0, 2.0, 3.5]
    # ... then the verdict x 3 replaces it
    out = RewardSources([(rule, Combine()), (rm, Combine("add", 0.5)), (judge, Combine("replace", 3.0))]).score(batch())
    assert out.scores.tolist() == [3.0, 0.0, 3.0]
    assert list(out.extras) == ["acc", "reward_model_score", "verifier_output"]
    assert list(out.metrics) == ["reward/errors", "reward_model/score/max", "verifier/parse_failures"]
    assert out.errors == {1: "error: boom", 2: "verifier: unparseable"}  # per sample, the first source's error
    # the first source alone: its scores as they are
    alone = RewardSources([(Fixed("rule", [-0.0, 0.1, 3.0e38]), Combine())]).score(batch())
    assert alone.scores.tobytes() == np.asarray([-0.0, 0.1, 3.0e38], np.float32).tobytes()


def test_a_non_finite_score_names_the_source_and_the_sample():
    rule = Fixed("rule", [1.0, 0.0, 0.5])
    with pytest.raises(NonFiniteRewardError, match=r"^rm gave nan for sample 2 of 3 \(data_source 'd2', uid 12\) "
                                                   r"\(1 non-finite of 3\): a reward must be finite in float32"):
        RewardSources([(rule, Combine()), (Fixed("rm", [0.0, 1.0, np.nan]), Combine("add"))]).score(batch())
    # each finite, their sum is not: 3e38 + 2 x 3e38 = 9e38 > float32's max 3.4e38
    big = Fixed("big", [3e38, 0.0, 0.0])
    with pytest.raises(NonFiniteRewardError, match=r"^the combined reward \(after big, add x 2\) gave inf for sample 0 "
                                                   r"of 3 \(data_source 'd0', uid 10\)"):
        RewardSources([(big, Combine()), (big, Combine("add", 2.0))]).score(batch())


def test_every_emitted_metric_is_declared_with_its_reduction():
    with pytest.raises(KeyError, match=r"rm emitted metric 'rm/score', which it does not declare"):
        RewardSources([(Fixed("rm", [0.0] * 3, metrics={"rm/score": 1.0}), Combine())]).score(batch())
    wrong = Fixed("rule", [0.0] * 3, metrics={"reward/errors": 1.0}, reductions={"reward/errors": "mean"})
    with pytest.raises(ValueError, match=r"declares metric 'reward/errors' as 'mean', rljax.metrics reduces it as "
                                         r"'sum'"):
        RewardSources([(wrong, Combine())]).score(batch())


@pytest.mark.parametrize("source", [FunctionSource, RewardModelSource, VerifierSource])
def test_the_sources_declarations_agree_with_rljax_metrics(source):
    examples = {"reward/*/mean": "reward/acc/mean"}  # a pattern's instance
    for pattern, reduction in source.reductions.items():
        assert reduction_of(examples.get(pattern, pattern)) == reduction, pattern


def test_function_source_and_close():
    items = [{"data_source": "synthetic/reverse", "solution_str": "cba", "ground_truth": "cba", "uid": 0},
             {"data_source": "my/unscored", "solution_str": "x", "ground_truth": "y", "uid": 1}]
    manager = RewardManager(mode="process", num_workers=1)
    rm = Fixed("rm", [0.5, 0.25])
    sources = RewardSources([(FunctionSource(manager, zero_where_no_rule=True), Combine()), (rm, Combine("add", 2.0))])
    out = sources.score(RewardBatch(items, [[1], [2]]))
    assert out.scores.tolist() == [2.0, 0.5]  # 1 + 2 x 0.5; no rule for my/unscored: 0 + 2 x 0.25
    assert sources.sources[0].name == "the built-in scorer (default_compute_score)"
    sources.close()  # every source: the manager's workers, the model's resources
    assert rm.closed
    with pytest.raises(RuntimeError, match="closed"):
        manager.score(items[:1])
