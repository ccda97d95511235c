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
