"""Many concurrent asyncio callers share one engine loop and get the sync API's results."""

import asyncio
import threading

from rljax.rollout import GenerationRequest, SamplingParams

from .conftest import random_prompts

import pytest


@pytest.mark.slow
def test_concurrent_generate_async_equals_sync(roomy_sampler):
    prompts = random_prompts([4, 9, 15, 2, 11, 6, 8, 13, 3, 10], seed=21)
    params = [
        SamplingParams(temperature=0.0, max_tokens=7) if i % 3 == 0
        else SamplingParams(n=1 + i % 2, temperature=1.0, top_k=30, max_tokens=5 + i % 4, seed=100 + i)
        for i in range(len(prompts))
    ]
    expected = [roomy_sampler.generate([p], sp) for p, sp in zip(prompts, params)]
    before = roomy_sampler.stats()

    async def episode(i):
        await asyncio.sleep(0.001 * (i % 4))  # callers arrive while others are running
        request = GenerationRequest(prompts[i], params[i], request_id=f"episode-{i}")
        return await roomy_sampler.generate_async(request)

    async def everyone():
        return await asyncio.gather(*(episode(i) for i in range(len(prompts))))

    results = asyncio.run(everyone())
    after = roomy_sampler.stats()
    for i, (got, want) in enumerate(zip(results, expected)):
        assert [c.request_index for c in got] == [f"episode-{i}"] * len(want)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
    # They were batched together: fewer engine calls than running them one by one.
    calls = lambda s: s["num_prefill_steps"] + s["num_decode_calls"]  # noqa: E731
    assert calls(after) - calls(before) < calls(before)


def test_async_from_several_threads_and_plain_token_lists(roomy_sampler):
    prompt = random_prompts([7], seed=4)[0]
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=8)
    want = roomy_sampler.generate([prompt], params)[0].token_ids
    results = []

    def worker():
        results.append(asyncio.run(roomy_sampler.generate_async(prompt, params))[0].token_ids)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want] * 4


def test_failures_reach_their_callers_and_the_loop_keeps_serving(llama, roomy_sampler):
    import pytest

    from rljax.rollout import Sampler

    from .conftest import sampler_config

    with pytest.raises(ValueError, match="token ids"):
        roomy_sampler.generate([[1, 2, 999]], SamplingParams(max_tokens=2))  # a bad request fails alone
    from rljax.rollout.scheduler import StepKind

    programs = roomy_sampler.engine.device.programs
    real = programs[StepKind.PREFILL]

    def broken(*args):
        raise RuntimeError("device on fire")

    programs[StepKind.PREFILL] = broken
    try:
        with pytest.raises(RuntimeError, match="device on fire"):
            roomy_sampler.generate([[1, 2, 3]], SamplingParams(max_tokens=3))
    finally:
        programs[StepKind.PREFILL] = real
    out = roomy_sampler.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=3))
    assert len(out[0].token_ids) == 3
    assert roomy_sampler.stats()["pages_used"] == 0

    closed = Sampler(llama, sampler_config(num_pages=16))
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        closed.generate([[1, 2]], SamplingParams(max_tokens=1))


def test_cancelled_caller_frees_its_pages(roomy_sampler):
    prompts = random_prompts([9, 6], seed=50)

    async def scenario():
        slow = asyncio.ensure_future(roomy_sampler.generate_async(
            prompts[0], SamplingParams(n=3, temperature=1.0, max_tokens=38, ignore_eos=True, seed=1)))
        fast = await roomy_sampler.generate_async(prompts[1], SamplingParams(temperature=0.0, max_tokens=3))
        slow.cancel()
        return fast

    fast = asyncio.run(scenario())
    assert len(fast[0].token_ids) == 3
    # The cancelled request leaves the engine and returns its pages (checked from the
    # engine thread's side: a later request runs and everything is free afterwards).
    roomy_sampler.generate([prompts[1]], SamplingParams(temperature=0.0, max_tokens=2))
    stats = roomy_sampler.stats()
    assert stats["pages_used"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0
