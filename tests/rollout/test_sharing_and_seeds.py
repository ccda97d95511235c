"""Prefix sharing is invisible in the outputs and saves pages; a seeded sample gets the
same tokens whatever else is in the batch, and after preemption; stop tokens and
lengths end samples as documented."""

import dataclasses

import numpy as np
import pytest

from rljax.rollout import Sampler, SamplingParams

from .conftest import random_prompts, sampler_config


def tokens(completions):
    return [c.token_ids for c in completions]


def test_shared_prefix_equals_independent_samples(roomy_sampler):
    prompts = random_prompts([17, 14], seed=3)  # shared prefixes: 16 and 12 tokens
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=11)
    engine = roomy_sampler.engine
    engine.set_prefix_caching(False)  # peak pages would include what the cache keeps
    peaks, outs = {}, {}
    for share in (True, False):
        engine.share_prefix = share
        roomy_sampler.reset_peak_memory()
        outs[share] = roomy_sampler.generate(prompts, params)
        peaks[share] = roomy_sampler.stats()["peak_pages_used"]
    engine.share_prefix = True
    engine.set_prefix_caching(True)
    assert [(c.request_index, c.sample_index) for c in outs[True]] == [(r, s) for r in range(2) for s in range(4)]
    assert tokens(outs[True]) == tokens(outs[False])
    np.testing.assert_allclose([c.log_probs for c in outs[True]], [c.log_probs for c in outs[False]], atol=1e-5)
    assert len({tuple(t) for t in tokens(outs[True])}) > 2  # the samples do differ
    # Sharing: 4 + 3 prompt pages once, each sample only its own 2 pages.
    assert peaks[True] < peaks[False], peaks


def test_seeded_sample_ignores_batch_company(roomy_sampler):
    target = random_prompts([9], seed=5)[0]
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, max_tokens=8, seed=1234)
    # the same request (seed and stream: prompt 3 of a call samples stream 3) alone and in company
    alone = roomy_sampler.generate([target], dataclasses.replace(params, stream=3))
    crowd = roomy_sampler.generate(random_prompts([4, 13, 7], seed=6) + [target], params)
    assert tokens(alone) == tokens(crowd[-3:])
    other_seed = roomy_sampler.generate([target], SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=99))
    assert tokens(other_seed) != tokens(alone)


def test_copies_of_one_prompt_draw_independent_samples(roomy_sampler):
    """8 copies of one prompt, n=4, T=1, with the RL loop's sampling params (one seed for
    the whole step): 32 distinct samples. Before per-request streams, sample i of every
    copy used the same key, so the 8 groups were identical (4 distinct samples)."""
    from rljax.rl.config import RLConfig

    cfg = RLConfig()
    cfg.rollout.n, cfg.rollout.response_length = 4, 12
    params = cfg.sampling_params(step=7)
    prompt = random_prompts([6], seed=21)[0]
    out = roomy_sampler.generate([prompt] * 8, params)
    assert len(out) == 32
    assert len({tuple(c.token_ids) for c in out}) == 32
    # the next step draws other samples for the same prompts
    again = roomy_sampler.generate([prompt] * 8, cfg.sampling_params(step=8))
    assert {tuple(c.token_ids) for c in again}.isdisjoint({tuple(c.token_ids) for c in out})


@pytest.mark.slow  # a second sampler with fewer pages: its own prefill and decode compiles
@pytest.mark.parametrize("mixed", [False, True], ids=["split", "mixed"])
def test_preempted_sampled_sequences_continue_identically(llama, roomy_sampler, mixed):
    """Forked samples (n=2, shared prompt pages) preempted and recomputed draw what an
    uninterrupted split-step run draws; with mixed steps the recomputes and the forks'
    prompt tails are prefilled beside running decodes."""
    prompts = random_prompts([3, 21, 8, 13, 5, 17], seed=8)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=5)
    reference = roomy_sampler.generate(prompts, params)
    with Sampler(llama, sampler_config(num_pages=14, mixed_steps=mixed)) as tight:
        out = tight.generate(prompts, params)
        stats = tight.stats()
        assert stats["num_preemptions"] > 0 and (stats["num_mixed_steps"] > 0) == mixed
    assert tokens(out) == tokens(reference)
    np.testing.assert_allclose([c.log_probs for c in out], [c.log_probs for c in reference], atol=1e-5)


def test_stop_tokens_eos_and_lengths(roomy_sampler):
    prompt = random_prompts([6], seed=9)[0]
    free = roomy_sampler.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    stop = free.token_ids[4]
    cut = free.token_ids.index(stop) + 1
    stopped = roomy_sampler.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop]))
    assert stopped[0].finish_reason == "stop"
    assert stopped[0].token_ids == free.token_ids[:cut]
    assert stopped[0].log_probs == pytest.approx(free.log_probs[:cut], abs=1e-6)

    scheduler = roomy_sampler.engine.scheduler
    scheduler.eos_ids = frozenset({stop})  # as if the model config named it EOS
    try:
        eos = roomy_sampler.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12))[0]
        ignored = roomy_sampler.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    finally:
        scheduler.eos_ids = frozenset()
    assert (eos.finish_reason, eos.token_ids) == ("stop", free.token_ids[:cut])
    assert (ignored.finish_reason, ignored.token_ids) == ("length", free.token_ids)

    # max_model_len (48) caps a long request: 40 prompt tokens leave room for 8.
    long = roomy_sampler.generate(random_prompts([40], seed=2), SamplingParams(temperature=0.0, max_tokens=30))[0]
    assert (long.finish_reason, len(long.token_ids)) == ("length", 8)
    with pytest.raises(ValueError, match="max_model_len"):
        roomy_sampler.generate(random_prompts([48]), SamplingParams(max_tokens=1))
    assert roomy_sampler.stats()["pages_used"] == 0
