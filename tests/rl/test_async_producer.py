"""The depth-1 producer of `trainer.mode: one_step_off` without a model: a scripted
rollout function stands in for the sampler, and a scripted sampler state records which
weights each rollout ran with. Step k is handed the batch sampled by version max(k-1, 0),
every sample is stamped with the weights it was sampled with, weights never change
during a rollout, staleness never exceeds 1; the checkpoint's JSON form of a batch is
exact; the device split and the mode's config checks."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from rljax.config import ConfigError, load_config
from rljax.rl.async_config import split_devices
from rljax.rl.async_producer import (OneStepOffProducer, RolloutTimeout, rollout_from_json, rollout_to_json,
                                     staleness_metrics)
from rljax.rl.batch import Sample
from rljax.rl.config import RLConfig
from rljax.rl.main_thread import MainThreadCalls
from rljax.rl.producer import SyncProducer
from rljax.rl.scoring import ScoredRollout
from rljax.rollout.params import SamplingParams


class ScriptedSampler:
    """Weights are a version number; a rollout records the weights at its start and end
    (they must agree) and takes `seconds`."""

    def __init__(self, seconds=0.0):
        self.weights = 0
        self.seconds = seconds
        self.ran_with = []  # (prompt, weights at start, weights at end)

    def update(self, version):
        self.weights = version
        return {"memory/update_weights_GiB": 0.0}

    def __call__(self, prompts, params, offset):
        start = self.weights
        time.sleep(self.seconds)
        self.ran_with.append((prompts["prompt_ids"][0], start, self.weights))
        samples = [Sample([p], [p, start], [1, 1], [-0.5, -0.5], group_id=offset + i, score=float(start))
                   for i, p in enumerate(prompts["prompt_ids"]) for _ in range(params.n)]
        return ScoredRollout(samples, {"reward/errors": 0.0}, [{} for _ in samples])


def make_producer(sampler, **kwargs):
    inner = SyncProducer(sampler, lambda: pytest.fail("no further prompts"), num_groups=1)
    return OneStepOffProducer(inner, lambda params: sampler.update(params), **kwargs)


def run_steps(producer, steps, sampler):
    """The trainer's one_step_off schedule (`RLTrainer.rollout`), weights = the version."""
    params = SamplingParams(n=2)
    trained = []
    for k in range(steps):
        if not producer.pending:
            producer.submit({"prompt_ids": [100 + k]}, k, params)
        rollout = producer.collect()
        producer.update_weights(k, k)
        if k + 1 < steps:
            producer.submit({"prompt_ids": [100 + k + 1]}, k, params)
        trained.append(rollout)
    return trained


def test_step_k_trains_the_batch_sampled_by_version_k_minus_1():
    sampler = ScriptedSampler(seconds=0.01)
    trained = run_steps(make_producer(sampler), 5, sampler)
    # step k: prompt 100 + k, sampled by the weights of version max(k - 1, 0), stamped with that version
    assert [r.samples[0].prompt_ids[0] for r in trained] == [100, 101, 102, 103, 104]
    assert [{s.policy_version for s in r.samples} for r in trained] == [{0}, {0}, {1}, {2}, {3}]
    assert [{s.response_ids[1] for s in r.samples} for r in trained] == [{0}, {0}, {1}, {2}, {3}]
    assert all(start == end for _, start, end in sampler.ran_with)  # no weight change inside a rollout
    stale = [staleness_metrics(r.samples, k) for k, r in enumerate(trained)]
    assert [m["async/staleness/max"] for m in stale] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert all(r.metrics["timing_s/gen"] >= 0.01 for r in trained)


def test_weights_wait_for_the_rollout_in_flight():
    """update_weights while a rollout runs: the rollout finishes on the old weights first."""
    sampler = ScriptedSampler(seconds=0.3)
    producer = make_producer(sampler)
    producer.submit({"prompt_ids": [1]}, 0, SamplingParams(n=1))
    time.sleep(0.05)  # the rollout has started
    producer.update_weights(1, 1)
    assert sampler.ran_with == [(1, 0, 0)] and sampler.weights == 1
    assert {s.policy_version for s in producer.collect().samples} == {0}


def test_a_submit_at_another_version_than_the_samplers_is_an_error():
    sampler = ScriptedSampler()
    producer = make_producer(sampler)
    with pytest.raises(RuntimeError, match="sampler holds version 0: its weights were not updated"):
        producer.submit({"prompt_ids": [1]}, 1, SamplingParams(n=1))
    producer.submit({"prompt_ids": [1]}, 0, SamplingParams(n=1))
    with pytest.raises(RuntimeError, match="depth 1 holds one batch"):
        producer.submit({"prompt_ids": [2]}, 0, SamplingParams(n=1))


def test_a_stalled_rollout_is_an_error_after_the_timeout():
    release = threading.Event()

    def stalled(prompts, params, offset):
        release.wait(10)
        return ScoredRollout([], {})

    producer = OneStepOffProducer(SyncProducer(stalled, lambda: None, 1), lambda p: {}, timeout_s=0.2)
    producer.submit({"prompt_ids": [1]}, 0, SamplingParams(n=1))
    start = time.perf_counter()
    with pytest.raises(RolloutTimeout, match="policy version 0 is not done after async.timeout_s=0.2 s"):
        producer.collect()
    assert time.perf_counter() - start < 2.0
    release.set()


def test_main_thread_calls_are_served_while_waiting():
    """An inline reward's call from the rollout thread runs on the thread that collects."""
    calls = MainThreadCalls()
    ran_on = []

    def rollout(prompts, params, offset):
        calls.call(lambda: ran_on.append(threading.get_ident()))
        return ScoredRollout([Sample([1], [2], [1], [0.0], group_id=0)], {})

    producer = OneStepOffProducer(SyncProducer(rollout, lambda: None, 1), lambda p: {}, calls, timeout_s=5)
    producer.submit({"prompt_ids": [1]}, 0, SamplingParams(n=1))
    producer.collect()
    assert ran_on == [threading.get_ident()]


def test_a_restored_batch_is_collected_first():
    sampler = ScriptedSampler()
    producer = make_producer(sampler)
    saved = ScoredRollout([Sample([7], [7, 2], [1, 1], [-0.25, -1.5], group_id=0, policy_version=2)], {"x": 1.0})
    producer.restore(rollout_from_json(rollout_to_json(saved)), sampler_version=3)
    assert producer.pending
    got = producer.collect()
    assert got.samples == saved.samples and not producer.pending
    producer.submit({"prompt_ids": [8]}, 3, SamplingParams(n=1))  # the sampler holds the restored version


def test_rollout_json_round_trip_is_exact():
    log_probs = np.asarray([-0.1, -2.718281828, -1e-7], np.float32)
    experts = np.arange(3 * 2 * 2, dtype=np.int32).reshape(3, 2, 2)
    sample = Sample([1, 2], [3], [1], list(log_probs), group_id=4, score=np.float32(0.3), truncated=True,
                    baseline=0.5, expert_ids=experts, policy_version=6)
    back = rollout_from_json(rollout_to_json(ScoredRollout([sample], {"a": np.float32(0.1)}, [{"s": "x"}])))
    s = back.samples[0]
    np.testing.assert_array_equal(np.asarray(s.response_log_probs, np.float32), log_probs)
    np.testing.assert_array_equal(s.expert_ids, experts)
    assert (s.prompt_ids, s.response_ids, s.group_id, s.truncated, s.baseline, s.policy_version) == (
        [1, 2], [3], 4, True, 0.5, 6)
    assert np.float32(s.score) == np.float32(0.3) and back.records == [{"s": "x"}]


def test_staleness_is_per_group_from_its_oldest_sample():
    samples = [Sample([1], [1], [1], [0.0], group_id=g, policy_version=v)
               for g, v in ((0, 5), (0, 3), (1, 5), (2, 4))]
    # groups' oldest versions 3, 5, 4 trained at version 6: staleness 3, 1, 2
    assert staleness_metrics(samples, 6) == {"async/staleness/mean": 2.0, "async/staleness/max": 3.0}


def devices(processes, per_process):
    return [SimpleNamespace(id=p * per_process + i, process_index=p) for p in range(processes)
            for i in range(per_process)]


def test_each_process_gives_devices_to_both():
    split = split_devices(devices(2, 4)[::-1], "one_step_off", 1)
    assert [d.id for d in split.rollout] == [0, 4]
    assert [d.id for d in split.trainer] == [1, 2, 3, 5, 6, 7]
    half = split_devices(devices(1, 8), "one_step_off", 0)
    assert [d.id for d in half.rollout] == [0, 1, 2, 3]
    both = split_devices(devices(1, 8), "sync", 3)
    assert both.rollout == both.trainer and len(both.trainer) == 8
    with pytest.raises(ConfigError, match="async.rollout_devices=4: process 0 has 4 devices"):
        split_devices(devices(2, 4), "one_step_off", 4)


def config(*overrides):
    return load_config(RLConfig, None, ["model.tokenizer=char", *overrides])


def test_mode_config():
    assert config().trainer.mode == "sync"
    cfg = config("trainer.mode=one_step_off", "rollout.tensor_parallel_size=1", "async.rollout_devices=4")
    assert cfg.trainer.mode == "one_step_off" and cfg.async_.rollout_devices == 4
    with pytest.raises(ConfigError, match="trainer.mode=one_step_off: the sampler needs devices of its own"):
        config("trainer.mode=one_step_off")
    with pytest.raises(ConfigError, match="trainer.mode"):
        config("trainer.mode=one_step")
    cfg.check_run(8)  # the trainer's 4 devices and the rollout's 4
    with pytest.raises(ConfigError, match="not divisible by the data-parallel size 5"):
        config("trainer.mode=one_step_off", "rollout.tensor_parallel_size=1", "async.rollout_devices=3").check_run(8)
    with pytest.raises(ConfigError, match="must fit the 2 rollout devices"):
        config("trainer.mode=one_step_off", "rollout.tensor_parallel_size=4", "async.rollout_devices=2").check_run(8)


def test_several_processes_give_the_rollout_half_of_each_process():
    """The union transfer pairs each trainer device with a rollout device of its process:
    a multi-process asynchronous run needs the half split; one process, or sync, does not."""
    from rljax.rl.async_config import check_processes

    half = config("trainer.mode=one_step_off", "rollout.tensor_parallel_size=1")
    check_processes(half, 2, 4)
    check_processes(config("trainer.mode=one_step_off", "rollout.tensor_parallel_size=1", "async.rollout_devices=2"),
                    2, 4)
    check_processes(config("trainer.mode=one_step_off", "rollout.tensor_parallel_size=1", "async.rollout_devices=1"),
                    1, 4)
    check_processes(config("async.rollout_devices=1"), 2, 4)
    with pytest.raises(ConfigError, match=r"^async.rollout_devices=1: a run of 2 processes in trainer.mode=one_step_off"):
        check_processes(config("trainer.mode=one_step_off", "rollout.tensor_parallel_size=1",
                               "async.rollout_devices=1"), 2, 4)
    with pytest.raises(ConfigError, match=r"^async.rollout_devices=0: .* each process's 3 devices"):
        check_processes(half, 2, 3)


def test_an_error_the_rollout_ends_with_at_the_deadline_is_reported_not_the_timeout():
    """A main-thread call of the rollout (the gather's meeting of the processes) that
    fails at the wait's deadline: collect raises that call's error, which names the cause,
    rather than a RolloutTimeout."""
    from rljax.hostsync import ProcessesTimeout

    calls = MainThreadCalls()

    def meeting():
        time.sleep(0.3)  # until past the 0.2 s deadline, as a meeting that waits until the deadline does
        raise ProcessesTimeout("process 0: process(es) [1] did not reach the gather")

    def rollout(prompts, params, offset):
        calls.call(meeting)
        return ScoredRollout([], {})

    producer = OneStepOffProducer(SyncProducer(rollout, lambda: None, 1), lambda p: {}, calls, timeout_s=0.2)
    producer.submit({"prompt_ids": [1]}, 0, SamplingParams(n=1))
    with pytest.raises(ProcessesTimeout, match=r"process\(es\) \[1\] did not reach the gather"):
        producer.collect()
