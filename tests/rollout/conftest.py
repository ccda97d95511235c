"""Random tiny Hugging Face models (the reference) and rljax samplers over them.

Weights are drawn with a large initializer range so that logits are far apart and
greedy decoding is decided by the model, not by float noise. Every sampler here uses
one fixed set of buckets, so each compiles two programs (one prefill, one decode).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

from rljax.models import load_hf
from rljax.rollout import KVCacheConfig, Sampler, SamplerConfig

torch.set_num_threads(1)  # tiny models; a shared machine punishes spinning OpenMP threads

VOCAB = 128
COMMON = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=VOCAB, max_position_embeddings=256, initializer_range=0.2, eos_token_id=None, bos_token_id=None,
    pad_token_id=None,
)
HF_CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON),
    "qwen2": lambda: Qwen2Config(**COMMON, tie_word_embeddings=True),
    "qwen3": lambda: Qwen3Config(**COMMON, head_dim=32),
    # mixtures of experts: 8 experts of width 32 (Qwen3-MoE) / 128 (Mixtral), top 2
    "qwen3_moe": lambda: Qwen3MoeConfig(**COMMON, head_dim=32, moe_intermediate_size=32, num_experts=8,
                                        num_experts_per_tok=2, norm_topk_prob=True),
    "mixtral": lambda: MixtralConfig(**COMMON, num_local_experts=8, num_experts_per_tok=2),
}


def sampler_config(num_pages: int, **overrides) -> SamplerConfig:
    """Small engine: 4 sequences, pages of 4 tokens, sequences of up to 48 tokens."""
    base = dict(
        max_num_seqs=4, max_num_batched_tokens=64, max_model_len=48,
        kv_cache=KVCacheConfig(page_size=4, num_pages=num_pages), batch_buckets=(4,),
        prefill_chunk_buckets=(16,), page_table_buckets=(12,), num_scheduler_steps=4,
    )
    return SamplerConfig(**{**base, **overrides})


def build_hf(family: str, path, seed: int = 0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(HF_CONFIGS[family]()).eval()
    with torch.no_grad():  # perturb norms / biases too, so every parameter matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model


def random_prompts(lengths, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=n).tolist() for n in lengths]


class _LazyModels(dict):
    """family -> (transformers model, HF folder), built on first use."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, family):
        path = self.factory.mktemp(f"hf_{family}")
        self[family] = (build_hf(family, path), str(path))
        return self[family]


_FORWARDS: dict = {}  # graphdef -> jitted full forward


def training_log_probs(model, completions, temperature: float = 1.0) -> list[np.ndarray]:
    """Per completion, log_softmax(model(ids) / temperature) of its tokens from the
    training forward: one padded [4, 32] call per 4 completions (one compiled shape)."""
    import jax
    import jax.numpy as jnp

    graphdef, state = nnx.split(model)
    forward = _FORWARDS.setdefault(graphdef, jax.jit(lambda st, i, m: nnx.merge(graphdef, st)(i, attention_mask=m)))
    out = []
    for start in range(0, len(completions), 4):
        chunk = completions[start:start + 4]
        ids = np.zeros((4, 32), np.int32)
        mask = np.zeros((4, 32), np.int32)
        for i, c in enumerate(chunk):
            row = c.prompt_token_ids + c.token_ids
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        logits = forward(state, jnp.asarray(ids), jnp.asarray(mask))
        logp = np.asarray(jax.nn.log_softmax(logits / temperature, axis=-1))
        for i, c in enumerate(chunk):
            p = len(c.prompt_token_ids)
            out.append(logp[i, np.arange(p - 1, p - 1 + len(c.token_ids)), c.token_ids])
    return out


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    return _LazyModels(tmp_path_factory)


@pytest.fixture(scope="session")
def llama(hf_models):
    """The rljax Decoder of the tiny Llama."""
    return load_hf(hf_models["llama"][1])


@pytest.fixture(scope="session")
def roomy_sampler(llama):
    """A Llama sampler with pages to spare (no preemption unless a test forces it)."""
    sampler = Sampler(llama, sampler_config(num_pages=64))
    yield sampler
    sampler.close()
