"""Same-shaped rollout replicas compile each sampler program once: the first replica to
reach a shape compiles it, every other one loads that executable onto its own devices,
and the tokens and log-probs are the ones each replica's own compile gives.

The counting tests turn off jax's persistent compilation cache, which the suite turns on
(tests/conftest.py) and which would otherwise answer some compiles."""

import dataclasses

import jax
import numpy as np
import pytest

from rljax.rl.replica_rollout import ReplicatedRollout
from rljax.rollout import Sampler, SamplingParams
from rljax.rollout.program_share import PROCESS_SHARE, ProgramShare
from rljax.rollout.replicas import ReplicaLayout

from .conftest import random_prompts, sampler_config

PROGRAMS = 2  # fixed buckets: one prefill and one decode program per replica


@pytest.fixture(autouse=True)
def empty_share():
    PROCESS_SHARE.clear()
    yield
    PROCESS_SHARE.clear()


@pytest.fixture
def no_persistent_cache(monkeypatch):
    from jax._src import compilation_cache

    monkeypatch.setattr(compilation_cache, "is_cache_used", lambda backend: False)


def sample_on_replicas(llama, tp: int, share: bool):
    """Every replica samples 2 prompts at once (one thread each); returns the completions
    in prompt order, each replica's engine stats and where its KV pool lives."""
    config = sampler_config(num_pages=48, share_programs=share)
    layout = ReplicaLayout.create(tensor_parallel_size=tp)
    rollout = ReplicatedRollout(llama, layout, lambda model: Sampler(model, config), max_response_len=8)
    try:
        params = SamplingParams(temperature=1.0, max_tokens=8, seed=7)
        generate = {r: (lambda items, s=sampler: s.generate(items, params)) for r, sampler in rollout.samplers.items()}
        prompts = random_prompts([5, 9] * layout.num_replicas, seed=3)
        completions = rollout.generate_everywhere(generate, prompts)
        stats = {r: s.stats() for r, s in rollout.samplers.items()}
        pools = {r: s.engine.device.pool.kv.sharding.device_set for r, s in rollout.samplers.items()}
        return completions, stats, pools, layout
    finally:
        rollout.close()


def counts(stats: dict) -> tuple[list[int], list[int]]:
    assert all(s["programs_cached"] == 0 for s in stats.values())
    return [s["programs_compiled"] for s in stats.values()], [s["programs_loaded"] for s in stats.values()]


def assert_same_samples(a, b):
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.log_probs, y.log_probs)


def check_sharing(llama, tp: int):
    own, own_stats, _, layout = sample_on_replicas(llama, tp, share=False)
    shared, shared_stats, pools, _ = sample_on_replicas(llama, tp, share=True)
    replicas = layout.num_replicas

    compiled, loaded = counts(own_stats)  # unshared: every replica compiles every program
    assert compiled == [PROGRAMS] * replicas and loaded == [0] * replicas
    compiled, loaded = counts(shared_stats)  # shared: each program compiled once, in all
    assert sum(compiled) == PROGRAMS and sum(loaded) == PROGRAMS * (replicas - 1)
    assert [c + n for c, n in zip(compiled, loaded)] == [PROGRAMS] * replicas
    assert len(PROCESS_SHARE) == PROGRAMS

    assert len({tuple(c.token_ids) for c in shared}) > len(shared) // 2  # really sampled
    assert_same_samples(shared, own)
    for r, devices in pools.items():  # each replica ran on its own devices
        assert devices == set(layout.replicas[r].devices.flat)


@pytest.mark.slow  # two sets of 4 replicas, 10 compiles
def test_four_replicas_of_two_devices_compile_each_program_once(llama, no_persistent_cache):
    check_sharing(llama, tp=2)


@pytest.mark.slow  # three sets of 4 replicas
def test_programs_from_the_persistent_cache_are_not_shared(llama, monkeypatch):
    """A program jax's persistent cache answers is used by its replica and not passed on
    (on XLA:CPU its serialized copy lacks its functions): the next replica asks the cache
    too, and every replica samples what it samples with nothing shared."""
    from jax._src import compilation_cache

    monkeypatch.setattr(compilation_cache, "is_cache_used", lambda backend: False)
    own, _, _, _ = sample_on_replicas(llama, tp=2, share=False)
    monkeypatch.undo()
    # the suite's setting (tests/conftest.py), here too when a developer brings their own cache directory
    min_seconds = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    try:
        sample_on_replicas(llama, tp=2, share=False)  # fills the persistent cache, if the suite has none yet
        PROCESS_SHARE.clear()
        shared, stats, _, _ = sample_on_replicas(llama, tp=2, share=True)
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_seconds)
    assert_same_samples(shared, own)
    assert all(s["programs_cached"] == PROGRAMS and s["programs_compiled"] == 0 for s in stats.values())
    assert len(PROCESS_SHARE) == 0


@pytest.mark.slow  # 4 replicas, then 8
def test_replicas_of_another_shape_compile_their_own(llama, no_persistent_cache):
    """A program of 2-device replicas is not loaded onto 1-device replicas: each device
    count is its own program (partitioned differently). The 8 one-device replicas then
    share theirs: 2 compiles, 14 loads."""
    sample_on_replicas(llama, tp=2, share=True)
    _, stats, _, _ = sample_on_replicas(llama, tp=1, share=True)
    compiled, loaded = counts(stats)
    assert sum(compiled) == PROGRAMS and sum(loaded) == 7 * PROGRAMS
    assert len(PROCESS_SHARE) == 2 * PROGRAMS


def test_tpu_programs_are_never_shared():
    """A TPU executable is compiled for its chips: no key, so every replica compiles."""
    tpu = dataclasses.make_dataclass("Backend", [("platform", str), ("platform_version", str)])("tpu", "v")
    devices = jax.devices()[:1]
    assert ProgramShare().key(tpu, None, None, [], devices) is None
    assert ProgramShare(enabled=False).key(devices[0].client, None, None, [], devices) is None
