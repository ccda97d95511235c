"""Rollout log_probs equal the training forward's log_probs of the same tokens:
log_softmax(model(ids) / temperature), before any top-k / top-p / min-p filtering."""

import numpy as np
import pytest

from rljax.rollout import SamplingParams

from .conftest import random_prompts, training_log_probs

PARAMS = {
    "t1": SamplingParams(temperature=1.0, max_tokens=10, seed=1),
    "t0.7_filtered": SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=10, seed=2),
    "t1.3_min_p": SamplingParams(temperature=1.3, min_p=0.05, max_tokens=10, seed=3),
    "greedy": SamplingParams(temperature=0.0, max_tokens=10),
}


@pytest.mark.parametrize("name", list(PARAMS))
def test_log_probs_equal_training_forward(llama, roomy_sampler, name):
    params = PARAMS[name]
    prompts = random_prompts([5, 11, 16, 2], seed=7)
    out = roomy_sampler.generate(prompts, params)
    refs = training_log_probs(llama, out, params.temperature or 1.0)
    worst = 0.0
    for c, ref in zip(out, refs):
        assert len(c.log_probs) == len(c.token_ids)
        worst = max(worst, float(np.abs(ref - np.asarray(c.log_probs)).max()))
    print(f"{name}: max |rollout - training| log_prob = {worst:.2e}")
    assert worst <= 1e-5, worst


@pytest.mark.slow
def test_mixed_steps_sample_what_split_steps_sample(llama, roomy_sampler):
    """Seeded requests of different lengths, 7 for 4 slots: each later one is admitted
    while others decode, and with mixed steps it is prefilled beside them. Every request
    draws the same tokens as with split steps (its keys depend on its seed, stream and
    positions, not on the batch around it), with log-probs equal to the training
    forward's."""
    from rljax.rollout import GenerationRequest, Sampler

    from .conftest import sampler_config

    prompts = random_prompts([5, 11, 16, 2, 9, 14, 3], seed=8)
    requests = [GenerationRequest(p, SamplingParams(temperature=1.0, max_tokens=4 + 3 * (i % 3), seed=4, stream=i))
                for i, p in enumerate(prompts)]

    def sample(sampler):
        return [f.result()[0] for f in sampler.submit_many(requests)]

    split = sample(roomy_sampler)
    with Sampler(llama, sampler_config(num_pages=64, mixed_steps=True)) as sampler:
        mixed = sample(sampler)
        stats = sampler.stats()
    assert stats["num_mixed_steps"] > 0 and stats["num_stalled_calls"] == 0, stats
    assert [c.token_ids for c in mixed] == [c.token_ids for c in split]
    worst = max(float(np.abs(ref - np.asarray(c.log_probs)).max())
                for c, ref in zip(mixed, training_log_probs(llama, mixed)))
    assert worst <= 1e-5, worst
