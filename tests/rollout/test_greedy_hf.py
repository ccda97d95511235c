"""Greedy decoding equals transformers `generate` token for token, under continuous
batching (more requests than slots) and preemption (a cache too small for all)."""

import pytest
import torch

from rljax.models import load_hf
from rljax.rollout import Sampler, SamplingParams

from .conftest import random_prompts, sampler_config

LENGTHS = [3, 21, 8, 13, 5, 17, 10]
NEW = 20


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"])
def test_greedy_matches_transformers_with_preemption(hf_models, family):
    hf, path = hf_models[family]
    prompts = random_prompts(LENGTHS, seed=1)
    # 15 usable pages of 4 tokens; 4 running sequences of up to 41 tokens need 44.
    with Sampler(load_hf(path), sampler_config(num_pages=16)) as sampler:
        out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW))
        stats = sampler.stats()
    assert stats["num_preemptions"] > 0, stats
    assert stats["num_compiled_programs"] == 2, stats["compiled_shapes"]
    assert stats["pages_used"] == 0  # every page came back
    assert [c.request_index for c in out] == list(range(len(prompts)))
    for prompt, completion in zip(prompts, out):
        assert completion.finish_reason == "length"
        assert completion.token_ids == hf_greedy(hf, prompt, NEW)
