"""RL pieces without a model: the batch builder and DAPO's dynamic sampling."""

import numpy as np
import pytest

from rljax.rl.batch import Sample, build_batch
from rljax.rl.scoring import ScoredRollout, dynamic_sampling, keep_informative_groups


def test_build_batch_follows_the_data_contract():
    samples = [
        Sample([5, 6], [7, 8, 9], [1, 1, 1], [-0.1, -0.2, -0.3], group_id=0, score=1.0),
        # multi-turn: a tool observation (mask 0) between two sampled spans
        Sample([5], [7, 3, 3, 8], [1, 0, 0, 1], [-0.5, 0.0, 0.0, -0.7], group_id=1, score=0.5),
    ]
    batch = build_batch(samples, bucket=4, max_length=16, pad_id=0)
    assert batch.input_ids.shape == (2, 8)  # 5 tokens -> bucket of 4 -> 8
    np.testing.assert_array_equal(batch.input_ids[0], [5, 6, 7, 8, 9, 0, 0, 0])
    np.testing.assert_array_equal(batch.response_mask[1], [0, 1, 0, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(batch.rollout_log_probs[0], [0, 0, -0.1, -0.2, -0.3, 0, 0, 0], atol=1e-7)
    # the outcome score sits on the last token the policy produced
    np.testing.assert_array_equal(batch.token_level_scores[0], [0, 0, 0, 0, 1.0, 0, 0, 0])
    np.testing.assert_array_equal(batch.token_level_scores[1], [0, 0, 0, 0, 0.5, 0, 0, 0])
    np.testing.assert_array_equal(batch.group_ids, [0, 1])


def _rollout(scores_per_group, offset, acc_per_group=None):
    samples = [Sample([1], [2], [1], [0.0], group_id=offset + g, score=s)
               for g, scores in enumerate(scores_per_group) for s in scores]
    acc = [a for accs in (acc_per_group or scores_per_group) for a in accs]
    return ScoredRollout(samples, {"reward/errors": 0.0}, [{"acc": a} for a in acc])


def test_dynamic_sampling_fills_the_batch_with_informative_groups():
    # rollout 1: groups 0 and 2 informative; rollout 2: only group 1 informative
    rollouts = iter([[[1, 0], [1, 1], [0, 1]], [[0, 0], [1, 0], [1, 1]]])
    out = dynamic_sampling(lambda: None, lambda prompts, offset: _rollout(next(rollouts), offset), num_groups=3,
                           max_gen_batches=4)
    kept, dropped = keep_informative_groups(out.samples, [x.score for x in out.samples])
    assert len(out.samples) == 6 and len(kept) == 3 and not dropped
    assert out.metrics["train/num_gen_batches"] == 2 and out.metrics["train/filter_groups_underfilled"] == 0


def test_dynamic_sampling_tops_up_when_rounds_run_out():
    out = dynamic_sampling(lambda: None, lambda prompts, offset: _rollout([[1, 1], [0, 1]], offset), num_groups=2,
                           max_gen_batches=1)
    assert len(out.samples) == 4  # shape kept: 1 informative group + 1 uninformative filler
    assert out.metrics["train/filter_groups_underfilled"] == 1


def test_dynamic_sampling_combines_round_metrics_by_their_reduction():
    # two rollouts of 4 samples: overlong 0.5 then 1.0 -> 0.75 over the 8 samples (not 1.5);
    # errors 1 then 2 -> 3; a max stays the max; a mean is weighted by the rollouts' samples
    metrics = iter([{"reward/overlong_frac": 0.5, "reward/errors": 1.0, "agent/num_turns/max": 4.0,
                     "agent/tool_use_rate": 0.25},
                    {"reward/overlong_frac": 1.0, "reward/errors": 2.0, "agent/num_turns/max": 2.0,
                     "agent/tool_use_rate": 1.0}])

    def rollout_fn(prompts, offset):
        rollout = _rollout([[1, 1], [0, 0]], offset) if offset == 0 else _rollout([[1, 0], [0, 1]], offset)
        rollout.metrics = next(metrics)
        return rollout

    out = dynamic_sampling(lambda: None, rollout_fn, num_groups=2, max_gen_batches=2)
    assert out.metrics["train/num_gen_batches"] == 2
    assert out.metrics["reward/overlong_frac"] == 0.75
    assert out.metrics["reward/errors"] == 3.0
    assert out.metrics["agent/num_turns/max"] == 4.0
    assert out.metrics["agent/tool_use_rate"] == 0.625


def test_dynamic_sampling_filters_on_the_configured_metric():
    """`algorithm.filter_groups.metric=acc` compares the reward's `acc`, not the score:
    group 0's scores vary (a format bonus) but its accuracy does not, so it is dropped;
    group 1's accuracy varies, so it is kept."""
    scores, acc = [[1.0, 0.9], [1.0, 0.0]], [[1, 1], [1, 0]]
    by_score = dynamic_sampling(lambda: None, lambda p, offset: _rollout(scores, offset, acc), num_groups=2,
                                max_gen_batches=1, metric="score")
    assert by_score.metrics["train/filter_groups_underfilled"] == 0
    by_acc = dynamic_sampling(lambda: None, lambda p, offset: _rollout(scores, offset, acc), num_groups=2,
                              max_gen_batches=1, metric="acc")
    assert by_acc.metrics["train/filter_groups_underfilled"] == 1
    assert [s.score for s in by_acc.samples[:2]] == [1.0, 0.0]  # group 1 kept first, group 0 is the filler
    with pytest.raises(KeyError, match="filter_groups.metric='pred'"):
        dynamic_sampling(lambda: None, lambda p, offset: _rollout(scores, offset, acc), num_groups=2,
                         max_gen_batches=1, metric="pred")
