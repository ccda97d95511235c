"""Routing record (`SamplerConfig.record_routing`): the experts the sampler reports for
each token are the ones the trainer's teacher-forced forward chooses on the same tokens,
under chunked prefill, multi-step decode, shared prompt prefixes and preemption."""

import jax
import numpy as np
import pytest

from rljax.models import load_hf
from rljax.rollout import Sampler, SamplingParams

from .conftest import random_prompts, sampler_config

LENGTHS = [3, 21, 8, 13, 5]
NEW = 12


def teacher_forced_experts(model, completions) -> list[np.ndarray]:
    """Per completion, the trainer forward's experts `[P + R, L, k]` on prompt + response."""
    ids = np.zeros((len(completions), 48), np.int32)
    mask = np.zeros_like(ids)
    for i, c in enumerate(completions):
        row = c.prompt_token_ids + c.token_ids
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    _, routing = jax.jit(lambda i, m: model.hidden_states_and_routing(i, m))(ids, mask)
    experts = np.asarray(routing.experts)  # [B, T, L, k]
    return [experts[i, : len(c.prompt_token_ids) + len(c.token_ids)] for i, c in enumerate(completions)]


@pytest.mark.slow
@pytest.mark.parametrize("mixed", [False, True], ids=["split", "mixed"])
def test_recorded_experts_equal_the_trainer_forwards_with_preemption(hf_models, mixed):
    model = load_hf(hf_models["qwen3_moe"][1])
    prompts = random_prompts(LENGTHS, seed=3)
    # 15 usable pages of 4 tokens (13 with mixed steps, which admit later sequences sooner)
    # for 4 running sequences of up to 33 tokens: preemption; n = 2 with the prompt's full
    # pages shared (forked samples copy the prefix's record)
    config = sampler_config(num_pages=13 if mixed else 16, record_routing=True, mixed_steps=mixed)
    with Sampler(model, config) as sampler:
        out = sampler.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=NEW, seed=5))
        stats = sampler.stats()
        # the same prompts again: their pages are in the prefix cache, which recording does not read
        again = sampler.generate(prompts[1:2], SamplingParams(temperature=1.0, max_tokens=4, seed=6))
        assert sampler.stats()["num_cached_prompt_tokens"] == stats["num_cached_prompt_tokens"] == 0
    assert stats["num_cached_pages"] > 0  # there was something to read
    assert (again[0].expert_ids[:-1] >= 0).all()
    assert stats["num_preemptions"] > 0, stats
    kinds = {shape.split("[")[0] for shape in stats["compiled_shapes"]}
    assert kinds == ({"mixed", "decode"} if mixed else {"prefill", "decode"}), stats["compiled_shapes"]
    # one program per bucket: split steps have one of each; mixed steps one per flat chunk-token count
    assert mixed or stats["num_compiled_programs"] == 2, stats["compiled_shapes"]
    assert (stats["num_mixed_steps"] > 0) == mixed
    k, layers = model.config.num_experts_per_tok, model.config.num_hidden_layers
    for c, want in zip(out, teacher_forced_experts(model, out)):
        got = c.expert_ids
        assert got.shape == (len(c.prompt_token_ids) + len(c.token_ids), layers, k)
        assert (got[-1] == -1).all()  # the last token is sampled, never fed back
        # the same set of experts (their order within the top-k is the probabilities')
        np.testing.assert_array_equal(np.sort(got[:-1], -1), np.sort(want[:-1], -1))
    assert len({tuple(e) for c in out for e in c.expert_ids[:-1].reshape(-1, k)}) > 4  # routing varies


@pytest.mark.slow
def test_no_record_without_the_option(hf_models):
    model = load_hf(hf_models["qwen3_moe"][1])
    with Sampler(model, sampler_config(num_pages=32)) as sampler:
        out = sampler.generate(random_prompts([5], seed=0), SamplingParams(temperature=0.0, max_tokens=3))
    assert out[0].expert_ids is None
