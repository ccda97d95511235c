"""The rollout producer without a model: a scripted rollout function stands in for the
sampler. Depth 0 returns exactly the rollouts' samples, in order, stamped with the policy
version they were submitted with; rollouts come back in submission order; dynamic
sampling starts from the submitted prompts and draws the rest from the data; ReMax's
greedy rollout sets each sample's baseline."""

import pytest

from rljax.rl.batch import Sample
from rljax.rl.config import FilterGroupsConfig
from rljax.rl.producer import SyncProducer
from rljax.rl.scoring import ScoredRollout
from rljax.rollout.params import SamplingParams


class Rollouts:
    """Rollout r of prompts [p0, p1, ...]: n samples per prompt, group offset + i, scored by
    a table; records every call."""

    def __init__(self, scores=None):
        self.calls = []
        self.scores = scores or {}

    def __call__(self, prompts, params, offset):
        self.calls.append((list(prompts["prompt_ids"]), params, offset))
        samples = [Sample([p], [p, j], [1, 1], [-0.5, -0.5], group_id=offset + i,
                          score=self.scores.get((p, j, params.temperature), float(j)))
                   for i, p in enumerate(prompts["prompt_ids"]) for j in range(params.n)]
        return ScoredRollout(samples, {"reward/errors": 0.0}, [{"acc": s.score} for s in samples])


def prompts(*ids):
    return {"prompt_ids": list(ids)}


def test_depth_zero_is_the_round_itself_stamped_with_its_version():
    rollouts = Rollouts()
    producer = SyncProducer(rollouts, lambda: pytest.fail("no further prompts at depth 0"), num_groups=2)
    params = SamplingParams(n=3, temperature=1.0)
    producer.submit(prompts(4, 7), policy_version=5, params=params)
    rollout = producer.collect()
    direct = Rollouts()(prompts(4, 7), params, 0)
    assert rollouts.calls == [([4, 7], params, 0)]
    assert [(s.prompt_ids, s.response_ids, s.group_id, s.score) for s in rollout.samples] == [
        (s.prompt_ids, s.response_ids, s.group_id, s.score) for s in direct.samples]
    assert rollout.metrics == direct.metrics and rollout.records == direct.records
    assert {s.policy_version for s in rollout.samples} == {5}
    with pytest.raises(RuntimeError, match="collect\\(\\) before submit\\(\\)"):
        producer.collect()


def test_rollouts_come_back_in_submission_order():
    producer = SyncProducer(Rollouts(), lambda: None, num_groups=1)
    params = SamplingParams(n=1)
    for version, prompt in ((0, 1), (1, 2), (2, 3)):
        producer.submit(prompts(prompt), version, params)
    got = [producer.collect() for _ in range(3)]
    assert [(r.samples[0].prompt_ids, r.samples[0].policy_version) for r in got] == [([1], 0), ([2], 1), ([3], 2)]


def test_dynamic_sampling_starts_from_the_submitted_prompts():
    """Prompt 1's group is uninformative (every score 1.0), prompt 2's too; the data's
    next batch (prompts 3, 4) brings two informative groups."""
    flat = {(p, j, 1.0): 1.0 for p in (1, 2) for j in range(2)}
    rollouts = Rollouts(flat)
    data = iter([prompts(3, 4), prompts(5, 6)])
    producer = SyncProducer(rollouts, lambda: next(data), num_groups=2, filter_groups=FilterGroupsConfig(enable=True))
    params = SamplingParams(n=2, temperature=1.0)
    producer.submit(prompts(1, 2), 7, params)
    rollout = producer.collect()
    assert [c[0] for c in rollouts.calls] == [[1, 2], [3, 4]] and [c[2] for c in rollouts.calls] == [0, 2]
    assert sorted({s.prompt_ids[0] for s in rollout.samples}) == [3, 4]
    assert rollout.metrics["train/num_gen_batches"] == 2.0
    assert {s.policy_version for s in rollout.samples} == {7}
    assert next(data) == prompts(5, 6)  # one further batch drawn, no more


def test_greedy_round_gives_each_sample_its_prompts_baseline():
    greedy = {(4, 0, 0.0): 0.25, (7, 0, 0.0): 0.75}
    rollouts = Rollouts(greedy)
    producer = SyncProducer(rollouts, lambda: None, num_groups=2, greedy_baseline=True)
    params = SamplingParams(n=2, temperature=1.0)
    producer.submit(prompts(4, 7), 0, params)
    rollout = producer.collect()
    assert rollouts.calls[1] == ([4, 7], SamplingParams(n=1, temperature=0.0), 0)
    assert [(s.prompt_ids[0], s.baseline) for s in rollout.samples] == [(4, 0.25), (4, 0.25), (7, 0.75), (7, 0.75)]
    assert rollout.metrics["critic/reward_baseline/mean"] == 0.5
