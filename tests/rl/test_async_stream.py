"""The scheduling of `trainer.mode: async` (`rljax.rl.async_stream.StreamProducer`) on a
fake sampler whose requests take a known number of steps: admission, the staleness bound
under `wait` and `drop`, partial rollouts, determinism whatever the timing, and a resume
from a snapshot that goes on as the uninterrupted stream does."""

from __future__ import annotations

import concurrent.futures
import json
import random
import time
from types import SimpleNamespace

import numpy as np
import pytest

from rljax.rl.async_stream import StreamProducer, off_policy_metrics, update_off_policy_metrics
from rljax.rl.batch import Sample
from rljax.rl.scoring import ScoredRollout
from rljax.rollout.params import Completion, PartialRequest, PartialSample, SamplingParams

B, N = 4, 2  # groups per batch, samples per group


class FakeSampler:
    """A manual sampler: each step gives one token to every sample of the first `slots`
    requests in flight; sample s of a request whose prompt starts with L ends after L + s
    tokens. A token's value encodes (request, sample, position, version); its log-prob is
    -version - position / 1000."""

    def __init__(self, slots: int = 6):
        self.slots, self.version = slots, 0
        self.requests: list[list] = []  # [request, future, samples (PartialSample)]
        self.resumed = 0  # requests submitted again from their tokens so far

    def submit_many(self, requests):
        futures = []
        for r in requests:
            self.resumed += r.resume is not None and any(s.token_ids for s in r.resume.samples)
            f = concurrent.futures.Future()
            samples = ([PartialSample(s.sample_index, list(s.token_ids), list(s.log_probs), list(s.policy_versions),
                                      s.finish_reason) for s in r.resume.samples] if r.resume is not None
                       else [PartialSample(i) for i in range(r.sampling_params.n)])
            self.requests.append([r, f, samples])
            futures.append(f)
        return futures

    def step(self, k: int) -> int:
        ran = 0
        for _ in range(k):
            self.requests = [q for q in self.requests if not q[1].cancelled()]
            if not self.requests:
                break
            for q in self.requests[: self.slots]:
                r, _, samples = q
                length = r.prompt_token_ids[0]
                for s in samples:
                    if s.finish_reason is None:
                        p = len(s.token_ids)
                        s.token_ids.append(int(r.request_id) * 10_000 + s.sample_index * 1000 + p * 10 + self.version)
                        s.log_probs.append(-self.version - p / 1000)
                        s.policy_versions.append(self.version)
                        if len(s.token_ids) == length + s.sample_index:
                            s.finish_reason = "stop"
            for q in [q for q in self.requests if all(s.finish_reason for s in q[2])]:
                r, f, samples = q
                self.requests.remove(q)
                f.set_result([Completion(r.request_id, s.sample_index, list(r.prompt_token_ids), s.token_ids,
                                         s.log_probs, s.finish_reason, policy_versions=s.policy_versions)
                              for s in samples])
            ran += 1
        return ran

    def unfinished(self):
        return [PartialRequest(r.request_id, list(r.prompt_token_ids), r.sampling_params,
                               [PartialSample(s.sample_index, list(s.token_ids), list(s.log_probs),
                                              list(s.policy_versions), s.finish_reason) for s in samples])
                for r, f, samples in self.requests if not f.cancelled()]

    def update_params(self, state, version=None):
        self.version = version


class FakeReplicas:
    def __init__(self, num: int = 2):
        self.local = list(range(num))
        self.samplers = {r: FakeSampler() for r in self.local}
        self.main_thread = None

    def assign(self, prompts, n):
        rows = len(prompts["prompt_ids"])
        per = -(-rows // len(self.local))
        return SimpleNamespace(per_replica=[list(range(r * per, min(rows, (r + 1) * per))) for r in self.local])

    def hand_off(self, params):
        return [params] * len(self.local), SimpleNamespace(metrics=lambda: {"memory/update_weights_GiB": 0.0})

    def install(self, states, version):
        for r in self.local:
            self.samplers[r].update_params(states[r], version=version)


def lengths(j: int) -> list[int]:
    """Prompt batch j's response lengths: a long one now and then, so groups overtake."""
    rng = random.Random(j)
    return [rng.choice([2, 3, 4, 30]) for _ in range(B)]


def make(max_staleness: int, on_stale: str = "wait", total: int = 8, segment: int = 3, replicas=None):
    data = {"next": 0}
    replicas = replicas or FakeReplicas()

    def next_prompts():
        j = data["next"]
        data["next"] += 1
        return {"prompt_ids": [[L, j, i] for i, L in enumerate(lengths(j))], "ground_truth": [str(j)] * B}

    def score(completions, prompts):
        samples = [Sample(prompt_ids=list(c.prompt_token_ids), response_ids=list(c.token_ids),
                          response_mask=[1] * len(c.token_ids), response_log_probs=list(c.log_probs),
                          group_id=int(c.request_index), policy_version=min(c.policy_versions))
                   for c in completions]
        return ScoredRollout(samples, {}, [{"versions": [list(c.policy_versions) for c in completions]}])

    params = lambda j: SamplingParams(n=N, max_tokens=64, seed=0, stream=j * 1000)  # noqa: E731
    producer = StreamProducer(replicas, next_prompts, lambda: dict(data), score, params, B, total, max_staleness,
                              on_stale, segment, timeout_s=30)
    return producer, data


def drive(producer, steps, start=0, delay=None, log=None, snapshot_at=None):
    """The trainer's side: collect batch k, (train), publish k + 1. -> per step, the batch's
    (prompt ids, response ids, versions) and its metrics."""
    out, snaps = [], {}
    for k in range(start, steps):
        rollout = producer.collect(k)
        if delay:
            time.sleep(delay())
        staleness = max(k - s.policy_version for s in rollout.samples)
        out.append(([(tuple(s.prompt_ids), tuple(s.response_ids)) for s in rollout.samples],
                    rollout.records[0]["versions"], staleness, rollout.metrics))
        producer.publish(f"weights-{k + 1}", k + 1)
        if snapshot_at is not None and k + 1 == snapshot_at:
            snaps[k + 1] = producer.snapshot(k + 1)
    return out, snaps


def run(max_staleness, on_stale="wait", total=8, delay=None, **kw):
    producer, _ = make(max_staleness, on_stale, total, **kw)
    producer.start(0)
    try:
        return drive(producer, total, delay=delay)[0], producer
    finally:
        producer.close()


def test_max_staleness_0_trains_each_prompt_batch_under_the_version_that_sampled_it():
    out, producer = run(0)
    for k, (rows, versions, staleness, metrics) in enumerate(out):
        assert {p[1] for p, _ in rows} == {k}, "batch k is prompt batch k"
        assert len(rows) == B * N and staleness == 0
        assert {v for vs in versions for seq in [vs] for v in seq} == {k}
        assert metrics["async/dropped_groups"] == 0 and metrics["async/waited_groups"] == 0


@pytest.mark.parametrize("max_staleness", [1, 2, 3])
def test_wait_keeps_every_group_within_the_bound_and_drops_nothing(max_staleness):
    out, producer = run(max_staleness)
    seen = [pr for rows, *_ in out for pr in rows]
    assert len(seen) == len(set(seen)) == 8 * B * N, "every sample trained once"
    assert max(staleness for _, _, staleness, _ in out) <= max_staleness
    assert sum(m["async/dropped_groups"] for *_, m in out) == 0
    if max_staleness >= 2:  # groups continued under newer weights: partial rollouts
        mixed = [vs for _, versions, _, _ in out for vs in versions if len(set(vs)) > 1]
        assert mixed, "no sample spans two versions"
        assert all(vs == sorted(vs) for vs in mixed)
        assert sum(s.resumed for s in producer.replicas.samplers.values()) > 0


def test_drop_aborts_groups_that_would_go_over_the_bound():
    out, _ = run(2, "drop")
    assert max(staleness for _, _, staleness, _ in out) <= 2
    assert sum(m["async/dropped_groups"] for *_, m in out) > 0
    seen = [pr for rows, *_ in out for pr in rows]
    assert len(seen) == len(set(seen)) == 8 * B * N, "every batch full, no sample twice"


def test_the_stream_is_the_same_whatever_the_timing():
    fast, _ = run(2)
    rng = random.Random(0)
    slow, _ = run(2, delay=lambda: rng.choice([0.0, 0.002, 0.02]))
    assert [(rows, versions) for rows, versions, *_ in fast] == [(rows, versions) for rows, versions, *_ in slow]


def test_admission_never_exceeds_the_bound():
    producer, _ = make(2, total=10)
    checked = []
    original = producer._admit

    def admit():
        original()
        checked.append(producer.prompt_batches * B - producer.dropped <= (producer.version + 2 + 1) * B)

    producer._admit = admit
    producer.start(0)
    try:
        drive(producer, 10)
    finally:
        producer.close()
    assert checked and all(checked)


@pytest.mark.parametrize("cut", [2, 3, 5])
def test_a_resume_from_a_snapshot_goes_on_as_the_uninterrupted_stream(cut):
    whole, _ = run(3, total=9)
    producer, data = make(3, total=9)
    producer.start(0)
    try:
        before, snaps = drive(producer, cut, snapshot_at=cut)
    finally:
        producer.close()
    snap = json.loads(json.dumps(snaps[cut]))  # what a checkpoint's meta holds
    assert snap["in_flight"] or cut == 5, "the cut leaves groups in flight"
    resumed, data2 = make(3, total=9)
    data2["next"] = snap["data_state"]["next"]
    resumed.replicas.install(*resumed.replicas.hand_off(f"weights-{cut}")[:1], cut)  # the restored weights
    resumed.start(cut, snap)
    try:
        after, _ = drive(resumed, 9, start=cut)
    finally:
        resumed.close()
    assert [(r, v) for r, v, *_ in before + after] == [(r, v) for r, v, *_ in whole]


def test_off_policy_kl_is_k3_of_the_behaviour_to_proximal_ratio():
    behaviour = np.array([[-1.0, -2.0, 0.0]])
    old = np.array([[-1.5, -1.0, 9.0]])
    mask = np.array([[1, 1, 0]])
    # r = exp(old - behaviour): exp(-0.5), exp(1.0); k3 = r - log r - 1, by hand
    k3 = ((np.exp(-0.5) + 0.5 - 1) + (np.exp(1.0) - 1.0 - 1)) / 2
    m = off_policy_metrics(behaviour, old, mask)
    assert m["async/off_policy_kl"] == pytest.approx(k3)
    assert m["async/off_policy_kl_k1"] == pytest.approx((0.5 - 1.0) / 2)


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.filter_groups.enable=true"], "algorithm.filter_groups.enable: DAPO's dynamic sampling"),
    (["algorithm.adv_estimator=remax"], "algorithm.adv_estimator=remax: a greedy rollout per batch"),
    (["async.on_stale=later"], "async.on_stale"),
    (["async.segment_steps=0"], "async.segment_steps"),
])
def test_async_mode_refuses_what_needs_whole_batches_in_one_line(overrides, message):
    from rljax.config import ConfigError, load_config
    from rljax.rl.config import RLConfig

    base = ["model.tokenizer=char", "trainer.mode=async", "rollout.tensor_parallel_size=1"]
    assert load_config(RLConfig, None, base).async_.max_staleness == 1
    with pytest.raises(ConfigError, match=message) as e:
        load_config(RLConfig, None, base + overrides)
    assert "\n" not in str(e.value)


class DeadSampler(FakeSampler):
    def step(self, k):
        raise RuntimeError("replica 1 lost its device")


class StalledSampler(FakeSampler):
    def step(self, k):
        time.sleep(3600)


def test_a_dead_replica_fails_the_trainer_with_its_error():
    replicas = FakeReplicas()
    replicas.samplers[1] = DeadSampler()
    producer, _ = make(1, replicas=replicas)
    producer.start(0)
    try:
        with pytest.raises(RuntimeError, match="replica 1 lost its device"):
            producer.collect(0)
    finally:
        producer.close()


def test_a_stalled_sampler_times_out_with_one_line_naming_the_batch():
    from rljax.rl.async_producer import RolloutTimeout

    replicas = FakeReplicas()
    replicas.samplers[0] = StalledSampler()
    producer, _ = make(1, replicas=replicas)
    producer.timeout_s = 0.5
    producer.start(0)
    start = time.perf_counter()
    with pytest.raises(RolloutTimeout, match=r"batch 0 is not ready after async.timeout_s=0.5 s") as e:
        producer.collect(0)
    assert time.perf_counter() - start < 5 and "\n" not in str(e.value)
    producer._stop = True  # the stalled thread is a daemon: nothing waits for it


def test_off_policy_kl_in_bypass_mode_is_the_updates_measurement():
    # the old log-probs are the sampler's, so the update's rollout_corr/ KLs (pi_theta vs pi_sampler) are the ones
    update = {"rollout_corr/k3_kl": 0.25, "rollout_corr/kl": 0.2, "actor/pg_loss": 1.0}
    assert update_off_policy_metrics(update) == {"async/off_policy_kl": 0.25, "async/off_policy_kl_k1": 0.2}
    assert update_off_policy_metrics({"actor/pg_loss": 1.0}) == {}  # nothing measured: nothing reported (not 0)
