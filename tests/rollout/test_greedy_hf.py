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


@pytest.mark.slow
@pytest.mark.parametrize("mixed", [False, True], ids=["split", "mixed"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"])
def test_greedy_matches_transformers_with_preemption(hf_models, family, mixed):
    """With `mixed_steps` the later prompts and the preempted sequences' recomputes are
    prefilled beside running decodes (mixed steps), which never wait."""
    hf, path = hf_models[family]
    prompts = random_prompts(LENGTHS, seed=1)
    # 15 usable pages of 4 tokens; 4 running sequences of up to 41 tokens need 44.
    with Sampler(load_hf(path), sampler_config(num_pages=16, mixed_steps=mixed)) as sampler:
        out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW))
        stats = sampler.stats()
    assert stats["num_preemptions"] > 0, stats
    kinds = {shape.split("[")[0] for shape in stats["compiled_shapes"]}
    assert kinds == ({"mixed", "decode"} if mixed else {"prefill", "decode"}), stats["compiled_shapes"]
    # one program per bucket: split steps have one of each; mixed steps one per flat chunk-token count
    assert mixed or stats["num_compiled_programs"] == 2, stats["compiled_shapes"]
    assert (stats["num_mixed_steps"] > 0) == mixed and (stats["num_stalled_calls"] == 0) == mixed, stats
    assert stats["pages_used"] == 0  # every page came back
    assert [c.request_index for c in out] == list(range(len(prompts)))
    for prompt, completion in zip(prompts, out):
        assert completion.finish_reason == "length"
        assert completion.token_ids == hf_greedy(hf, prompt, NEW)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe"])
def test_greedy_on_the_tpu_kernel_arguments_matches_transformers(hf_models, family):
    """`attention=pallas_tpu` with mixed steps: every call's attention takes the TPU ragged
    kernel's arguments (off TPU, the jnp reference of the kernel on them), mixed calls as
    one ragged call over their flat stream; greedy tokens are still transformers', with
    preemption."""
    hf, path = hf_models[family]
    prompts = random_prompts(LENGTHS, seed=2)
    with Sampler(load_hf(path), sampler_config(num_pages=16, mixed_steps=True, attention="pallas_tpu")) as sampler:
        out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW))
        stats = sampler.stats()
    assert stats["num_preemptions"] > 0 and stats["num_mixed_steps"] > 0, stats
    for prompt, completion in zip(prompts, out):
        assert completion.token_ids == hf_greedy(hf, prompt, NEW)


@pytest.mark.slow
def test_moe_greedy_with_experts_over_the_mesh_matches_transformers(hf_models, monkeypatch):
    """Qwen3-MoE with its experts split over fsdp = 4 (and their width over tensor = 2):
    the sampler traces its programs under the experts' mesh, so its forward runs the
    expert-parallel dispatch (`shard_map`), and greedy tokens are still transformers'."""
    import jax
    from flax import nnx

    import rljax.parallel
    from rljax.parallel import MeshConfig, make_mesh, state_shardings

    seen = []  # the mesh each MoE layer's dispatch saw when traced
    active = rljax.parallel.active_mesh
    monkeypatch.setattr(rljax.parallel, "active_mesh", lambda: seen.append(active()) or seen[-1])
    hf, path = hf_models["qwen3_moe"]
    mesh = make_mesh(MeshConfig(fsdp=4, tensor=2))
    graphdef, state = nnx.split(load_hf(path))
    shardings = jax.tree.map(lambda v: v.get_value(), state_shardings(state, mesh),
                             is_leaf=lambda x: isinstance(x, nnx.Variable))
    model = nnx.merge(graphdef, jax.device_put(state, shardings))
    assert model.layers.expert_gate[...].sharding.spec[:4] == (None, "fsdp", None, "tensor")
    prompts = random_prompts([3, 21, 8, 13], seed=2)
    with Sampler(model, sampler_config(num_pages=64)) as sampler:
        out = sampler.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW))
    assert seen and all(m is not None and m.shape["fsdp"] == 4 for m in seen)
    for prompt, completion in zip(prompts, out):
        assert completion.token_ids == hf_greedy(hf, prompt, NEW)
