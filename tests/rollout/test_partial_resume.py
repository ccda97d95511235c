"""Partial rollouts: a request taken out of a sampler mid-generation (`unfinished`) and
continued elsewhere (`resume=`) ends exactly as an uninterrupted run; a weight switch with
`recompute=True` recomputes the running sequences under the new weights and records the
new policy version from that point; a resumed sample's budget is what remains; a manual
sampler runs exactly the steps it is told to."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.rollout import GenerationRequest, PartialRequest, PartialSample, Sampler, SamplingParams

from .conftest import random_prompts, sampler_config

# A resumed or recomputed sequence's keys / values come from one prefill program where the
# uninterrupted run built them over decode steps: the same math in another float32
# summation order (measured here: up to 3e-6 on log-probs of magnitude ~2). The bound of
# the preemption tests (`test_sharing_and_seeds`).
LOGP_ATOL = 1e-5
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
SEEDED = SamplingParams(n=3, temperature=1.0, top_p=0.9, max_tokens=12, seed=7, stream=5)


def workload() -> list[GenerationRequest]:
    """A greedy request (5-token prompt) and a seeded n=3 one whose 21-token prompt shares
    its first 5 pages (page size 4) between the samples. With prefill chunks of 16 and 4
    decode steps per call the engine runs: 1. prefill greedy + 16 tokens of the shared
    prefix (greedy: 1 token); 2. prefill the prefix's last 4 tokens, fork the samples;
    3-5. decode (greedy: 5, 9, 12 tokens; samples: 4, 8, 12)."""
    short, long = random_prompts([5, 21], seed=50)
    return [GenerationRequest(short, GREEDY, request_id="greedy"),
            GenerationRequest(long, SEEDED, request_id="seeded")]


def run_to_end(sampler: Sampler, requests: list[GenerationRequest], max_steps: int = 100):
    futures = sampler.submit_many(requests)
    sampler.step(max_steps)
    assert all(f.done() for f in futures)
    return [c for f in futures for c in f.result()]


def tokens(completions):
    return [c.token_ids for c in completions]


def resubmit(partials: list[PartialRequest]) -> list[GenerationRequest]:
    return [GenerationRequest(p.prompt_token_ids, p.sampling_params, p.request_id, resume=p) for p in partials]


@pytest.fixture(scope="module")
def manual(llama):
    """A manual sampler with pages to spare and no prefix cache (so the step counts in
    `workload`'s docstring hold whatever ran before)."""
    with Sampler(llama, sampler_config(num_pages=64, enable_prefix_caching=False), manual=True) as sampler:
        yield sampler


@pytest.fixture(scope="module")
def reference(llama):
    """The workload run without interruption (engine thread, default mode)."""
    with Sampler(llama, sampler_config(num_pages=64)) as sampler:
        futures = sampler.submit_many(workload())
        return [c for f in futures for c in f.result()]


def flipped(llama):
    """Another model of the same shape: the layers in reverse order, matrices flipped."""
    _, state = nnx.split(llama)
    return jax.tree.map(lambda a: jnp.flip(a, 0) if a.ndim > 1 else a, state)


def test_step_runs_exactly_k_engine_steps(manual, llama):
    """Prompt of 5 tokens, max_tokens 12, 4 decode steps per call: step 1 is the prefill
    (token 1), then decode calls give tokens 2-5, 6-9 and 10-12: 4 steps in all."""
    assert manual.step(3) == 0  # no work
    prompt = random_prompts([5], seed=51)[0]
    future = manual.submit(GenerationRequest(prompt, GREEDY, request_id="a"))
    [queued] = manual.unfinished()  # submitted, not yet in the engine
    assert queued.request_id == "a" and queued.samples == [PartialSample(0)]
    assert manual.step(1) == 1
    [partial] = manual.unfinished()
    assert len(partial.samples[0].token_ids) == 1 and partial.samples[0].finish_reason is None
    assert manual.step(1) == 1
    assert [len(p.samples[0].token_ids) for p in manual.unfinished()] == [5]
    assert manual.unfinished() == manual.unfinished()  # reading changes nothing
    assert not future.done()
    assert manual.step(10) == 2  # 4 + 3 tokens, then the engine is out of work
    assert future.done() and manual.unfinished() == []
    [done] = future.result()
    assert len(done.token_ids) == 12 and done.finish_reason == "length"
    assert done.policy_versions == [0] * 12


def test_two_manual_samplers_driven_alike_give_the_same_completions(llama):
    """Unseeded requests (the seed comes from each sampler's own generator), a weight
    switch with recompute mid-flight: the same calls give the same completions."""
    outs = []
    other = flipped(llama)
    for _ in range(2):
        with Sampler(llama, sampler_config(num_pages=64), manual=True) as sampler:
            params = SamplingParams(n=2, temperature=1.0, max_tokens=10)
            first = sampler.submit_many([GenerationRequest(p, params) for p in random_prompts([6, 11], seed=52)])
            assert sampler.step(2) == 2
            sampler.update_params(other, version=4, recompute=True)
            second = sampler.submit(GenerationRequest(random_prompts([7], seed=53)[0], params))
            sampler.step(100)
            outs.append([c for f in first + [second] for c in f.result()])
    assert tokens(outs[0]) == tokens(outs[1])
    assert [c.log_probs for c in outs[0]] == [c.log_probs for c in outs[1]]
    assert [c.policy_versions for c in outs[0]] == [c.policy_versions for c in outs[1]]
    assert {v for c in outs[0] for v in c.policy_versions} == {0, 4}


@pytest.mark.parametrize("cut", [1, 2, 3, 4])  # prefix mid-prefill, just forked, decoding
def test_interrupted_and_resumed_elsewhere_equals_uninterrupted(llama, manual, reference, cut):
    """Run `cut` steps, take the requests out (JSON round trip), drop them, continue them
    on another sampler with the same weights: the same tokens, the log-probs of the
    tokens generated before the cut unchanged and the others within LOGP_ATOL."""
    futures = manual.submit_many(workload())
    assert manual.step(cut) == cut
    partials = [PartialRequest.from_json(json.loads(json.dumps(p.to_json()))) for p in manual.unfinished()]
    for f in futures:
        f.cancel()
    assert manual.unfinished() == []  # cancelled: left out at once
    manual.step(0)  # takes the cancellations in: the engine drops them
    assert manual.engine.unfinished() == [] and manual.stats()["pages_used"] == 0
    done_before = {(p.request_id, s.sample_index): len(s.token_ids) for p in partials for s in p.samples}
    assert any(0 < n < 12 for n in done_before.values())  # cut mid-generation
    with Sampler(llama, sampler_config(num_pages=64), manual=True) as fresh:
        out = run_to_end(fresh, resubmit(partials))
    assert [(c.request_index, c.sample_index) for c in out] == [(c.request_index, c.sample_index) for c in reference]
    assert tokens(out) == tokens(reference)
    for c, ref in zip(out, reference):
        m = done_before[(c.request_index, c.sample_index)]
        assert c.log_probs[:m] == ref.log_probs[:m]  # carried through JSON bit for bit
        np.testing.assert_allclose(c.log_probs, ref.log_probs, atol=LOGP_ATOL, rtol=0)
        assert c.finish_reason == ref.finish_reason
        assert c.policy_versions == [0] * len(c.token_ids)


def test_recompute_with_the_same_weights_changes_no_token(llama, manual, reference):
    manual.update_params(llama, version=0)
    futures = manual.submit_many(workload())
    manual.step(3)
    before = {(p.request_id, s.sample_index): len(s.token_ids) for p in manual.unfinished() for s in p.samples}
    assert before == {("greedy", 0): 5, ("seeded", 0): 4, ("seeded", 1): 4, ("seeded", 2): 4}
    stats = manual.stats()
    manual.update_params(llama, version=1, recompute=True)
    # prefill greedy's 10 tokens and 16 of each sample's 25 (greedy: 6 tokens), prefill the
    # samples' last 9 (5 tokens), decode (greedy 10, samples 9), decode (12, 12)
    assert manual.step(100) == 4
    out = [c for f in futures for c in f.result()]
    after = manual.stats()
    assert after["num_recomputed_sequences"] - stats["num_recomputed_sequences"] == 4
    assert after["num_prefill_steps"] - stats["num_prefill_steps"] == 2
    assert tokens(out) == tokens(reference)
    np.testing.assert_allclose([c.log_probs for c in out], [c.log_probs for c in reference], atol=LOGP_ATOL, rtol=0)
    for c in out:
        m = before[(c.request_index, c.sample_index)]
        assert c.policy_versions == [0] * m + [1] * (len(c.token_ids) - m)
    manual.update_params(llama, version=0)


def test_recompute_with_new_weights_equals_a_resume_under_them(llama, manual, reference):
    """Switch to other weights after 3 steps with recompute: each sample's tokens from the
    switch on are those a sampler holding the new weights produces when it resumes the
    request from the tokens before the switch."""
    other = flipped(llama)
    manual.update_params(llama, version=0)
    futures = manual.submit_many(workload())
    manual.step(3)
    at_switch = manual.unfinished()
    manual.update_params(other, version=1, recompute=True)
    manual.step(100)
    switched = [c for f in futures for c in f.result()]
    manual.update_params(llama, version=0)
    with Sampler(llama, sampler_config(num_pages=64), manual=True) as fresh:
        fresh.update_params(other)
        resumed = run_to_end(fresh, resubmit(at_switch))
    assert tokens(switched) == tokens(resumed)
    np.testing.assert_allclose([c.log_probs for c in switched], [c.log_probs for c in resumed], atol=LOGP_ATOL, rtol=0)
    assert tokens(switched) != tokens(reference)  # the switch did change the continuation
    before = {(p.request_id, s.sample_index): s for p in at_switch for s in p.samples}
    for c, ref in zip(switched, reference):
        s = before[(c.request_index, c.sample_index)]
        m = len(s.token_ids)
        assert c.token_ids[:m] == ref.token_ids[:m] == s.token_ids and c.log_probs[:m] == s.log_probs
        assert c.policy_versions == [0] * m + [1] * (len(c.token_ids) - m)


def test_a_resumed_sample_generates_only_what_its_budget_leaves(manual):
    """max_tokens 8. Sample 0 arrives finished (3 tokens, "stop"): delivered unchanged.
    Sample 1 has 5 tokens: 3 more, "length" at exactly 8. Sample 2 has 8 tokens and no
    finish reason: "length" at once, nothing generated. Sample 3 has none: 8 tokens.
    Generated in all: 3 + 8 = 11 tokens."""
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=3)
    prompt = random_prompts([6], seed=54)[0]
    partial = PartialRequest("budget", prompt, params, [
        PartialSample(0, [1, 2, 3], [-0.5, -0.25, -0.125], [2, 2, 2], "stop"),
        PartialSample(1, [9, 8, 7, 6, 5], [-1.0] * 5, [0, 0, 1, 1, 1]),
        PartialSample(2, list(range(10, 18)), [-2.0] * 8, [3] * 8),
        PartialSample(3),
    ])
    manual.update_params(manual.engine.state, version=5)
    generated = manual.stats()["num_generated_tokens"]
    out = run_to_end(manual, resubmit([partial]))
    assert manual.stats()["num_generated_tokens"] - generated == 11
    assert [c.sample_index for c in out] == [0, 1, 2, 3]
    assert (out[0].token_ids, out[0].log_probs, out[0].policy_versions, out[0].finish_reason) == (
        [1, 2, 3], [-0.5, -0.25, -0.125], [2, 2, 2], "stop")
    assert out[1].token_ids[:5] == [9, 8, 7, 6, 5] and len(out[1].token_ids) == 8
    assert out[1].log_probs[:5] == [-1.0] * 5 and out[1].policy_versions == [0, 0, 1, 1, 1, 5, 5, 5]
    assert out[2].token_ids == list(range(10, 18)) and out[2].policy_versions == [3] * 8
    assert len(out[3].token_ids) == 8 and out[3].policy_versions == [5] * 8
    assert [c.finish_reason for c in out[1:]] == ["length"] * 3
    manual.update_params(manual.engine.state, version=0)


def test_a_resume_whose_samples_all_finished_is_delivered_by_the_next_step(manual):
    partial = PartialRequest("done", [4, 5, 6], SamplingParams(max_tokens=4, seed=1),
                             [PartialSample(0, [7, 8], [-0.5, -1.5], [1, 1], "stop")])
    future = manual.submit(GenerationRequest([4, 5, 6], partial.sampling_params, resume=partial))
    assert manual.step(5) == 1 and future.done()
    [c] = future.result()
    assert (c.request_index, c.token_ids, c.log_probs, c.policy_versions, c.finish_reason) == (
        "done", [7, 8], [-0.5, -1.5], [1, 1], "stop")


def test_a_resume_must_be_the_requests_own(manual):
    partial = PartialRequest("x", [4, 5, 6], SamplingParams(max_tokens=4, seed=1), [PartialSample(0)])
    bad_prompt = manual.submit(GenerationRequest([4, 5], partial.sampling_params, resume=partial))
    bad_params = manual.submit(GenerationRequest([4, 5, 6], SamplingParams(max_tokens=5, seed=1), resume=partial))
    manual.step(1)
    with pytest.raises(ValueError, match="prompt"):
        bad_prompt.result()
    with pytest.raises(ValueError, match="sampling params"):
        bad_params.result()
    with pytest.raises(ValueError, match="0 .. n-1"):
        PartialRequest("y", [1], SamplingParams(n=2), [PartialSample(0)])
    with pytest.raises(ValueError, match="differ in length"):
        PartialSample(0, [1, 2], [-1.0], [0, 0])


def test_partial_request_json_round_trip_is_exact():
    log_probs = [float(x) for x in np.array([-0.1, -1e-8, -23.456789], np.float32)]
    partial = PartialRequest(
        17, [3, 1, 4], SamplingParams(n=2, temperature=0.7, top_p=0.95, top_k=5, min_p=0.05, max_tokens=9,
                                      stop_token_ids=(2, 5), ignore_eos=True, seed=2**31 - 2, stream=2**64 - 1),
        [PartialSample(0, [1, 5, 9], log_probs, [0, 1, 1], None), PartialSample(1, [2], [-0.5], [3], "stop")])
    d = json.loads(json.dumps(partial.to_json()))
    back = PartialRequest.from_json(d)
    assert back == partial
    assert np.array_equal(np.array(back.samples[0].log_probs, np.float32), np.array(log_probs, np.float32))
    assert d["sampling_params"]["stop_token_ids"] == [2, 5] and d["samples"][1]["finish_reason"] == "stop"
    assert PartialRequest.from_json(json.loads(json.dumps(back.to_json()))) == partial


def test_step_is_for_manual_samplers(roomy_sampler):
    with pytest.raises(RuntimeError, match="manual"):
        roomy_sampler.step(1)


# ---- the host scheduler alone (no model: a fake device answers every row with token 5) ----

def host_scheduler():
    """Pages of 4 tokens, 4 slots, prefill chunks of 8 within 32 padded tokens, 2 decode
    steps per call, shared prompt pages, no prefix cache."""
    from rljax.rollout import KVCacheConfig, SamplerConfig
    from rljax.rollout.scheduler import Scheduler

    config = SamplerConfig(max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32,
                           kv_cache=KVCacheConfig(page_size=4), batch_buckets=(4,), prefill_chunk_buckets=(8,),
                           page_table_buckets=(8,), num_scheduler_steps=2, enable_prefix_caching=False,
                           share_prefix=True)
    return Scheduler(config, 32, eos_ids=frozenset({99}), vocab_size=100)


def fake_step(s) -> None:
    plan = s.schedule()
    shape = (len(plan.rows), max(r.num_steps for r in plan.rows))
    s.apply(plan, np.full(shape, 5, np.int32), np.full(shape, -0.5, np.float32))


def test_recompute_frees_shared_prompt_pages_and_recomputes_from_position_0():
    from rljax.rollout.scheduler import StepKind

    s = host_scheduler()
    prompt = list(range(10))  # 2 full pages shared by the 3 samples
    request = s.add_request("r", prompt, SamplingParams(n=3, max_tokens=6, seed=0))
    fake_step(s)  # the shared prefix: prompt[:8]
    fake_step(s)  # each sample: prompt[8:], samples its token 1
    fake_step(s)  # decode: tokens 2 and 3
    assert s.allocator.num_used == 2 + 3  # the shared pages once, one page per sample
    s.recompute_running()
    s.version = 1
    assert s.allocator.num_used == 0 and not s.running
    assert [q.sample_index for q in s.waiting] == [0, 1, 2]
    plan = s.schedule()
    assert plan.kind is StepKind.PREFILL
    assert [(r.tokens, r.start, r.sample_index) for r in plan.rows] == [(tuple(prompt[:8]), 0, i) for i in range(3)]
    s.apply(plan, np.full((3, 1), 5, np.int32), np.full((3, 1), -0.5, np.float32))
    while s.has_work():
        fake_step(s)
    assert [c.token_ids for c in request.completions] == [[5] * 6] * 3
    assert [c.policy_versions for c in request.completions] == [[0, 0, 0, 1, 1, 1]] * 3
    assert s.allocator.num_used == 0 and s.stats.num_recomputed_sequences == 3


def test_a_resumed_request_shares_its_prompt_pages_between_its_unfinished_samples():
    from rljax.rollout.scheduler import StepKind

    s = host_scheduler()
    prompt = list(range(10))
    partial = PartialRequest("r", prompt, SamplingParams(n=3, max_tokens=5, seed=4), [
        PartialSample(0, [7], [-1.0], [0], "stop"),
        PartialSample(1, [8, 9], [-1.0, -2.0], [0, 1]),
        PartialSample(2, [6], [-3.0], [1]),
    ])
    s.version = 2
    request = s.add_request("r", prompt, SamplingParams(n=3, max_tokens=5, seed=4), resume=partial)
    assert s.unfinished() == [partial]  # nothing ran: what came in goes out
    assert [q.slots for q in s.waiting] == [2]  # one shared prefix for the two unfinished samples
    prefix = s.schedule()
    assert [(r.tokens, r.start) for r in prefix.rows] == [(tuple(prompt[:8]), 0)]
    s.apply(prefix, np.full((1, 1), 5, np.int32), np.full((1, 1), -0.5, np.float32))
    plan = s.schedule()  # each unfinished sample: the last prompt tokens and its own tokens
    assert plan.kind is StepKind.PREFILL
    assert [(r.tokens, r.start, r.sample_index) for r in plan.rows] == [((8, 9, 8, 9), 8, 1), ((8, 9, 6), 8, 2)]
    assert {r.pages[:2] for r in plan.rows} == {prefix.rows[0].pages}
    s.apply(plan, np.full((2, 1), 5, np.int32), np.full((2, 1), -0.5, np.float32))
    assert [q.tokens[10:] for q in s.running] == [[8, 9, 5], [6, 5]]
    while s.has_work():
        fake_step(s)
    done = request.completions
    assert [c.token_ids for c in done] == [[7], [8, 9, 5, 5, 5], [6, 5, 5, 5, 5]]
    assert [c.policy_versions for c in done] == [[0], [0, 1, 2, 2, 2], [1, 2, 2, 2, 2]]
    assert done[1].log_probs == [-1.0, -2.0, -0.5, -0.5, -0.5]
    assert [c.finish_reason for c in done] == ["stop", "length", "length"]
    assert s.unfinished() == [] and s.allocator.num_used == 0


def test_unfinished_of_a_running_sampler_misses_no_pending_request(roomy_sampler):
    """Engine thread running: a request still pending after `unfinished()` returned was
    pending during it, so it must be in the result (queued or in the engine)."""
    params = SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=9)
    futures = {}
    for i, prompt in enumerate(random_prompts([5, 8, 13, 6, 9, 11, 4, 7], seed=55)):
        futures[f"u{i}"] = roomy_sampler.submit(GenerationRequest(prompt, params, request_id=f"u{i}"))
        seen = {p.request_id for p in roomy_sampler.unfinished()}
        assert {rid for rid, f in futures.items() if not f.done()} <= seen
    for f in futures.values():
        f.result()
    assert roomy_sampler.unfinished() == []
