"""Random tiny Hugging Face checkpoints built with transformers + torch (the reference)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

VOCAB = 128

CONFIGS = {
    "llama": lambda: LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, rope_theta=10000.0,
    ),
    "llama3_rope": lambda: LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=64,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        rope_theta=500000.0,
    ),
    "qwen2_tied": lambda: Qwen2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=True, max_position_embeddings=64,
    ),
    "qwen3": lambda: Qwen3Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, vocab_size=VOCAB, max_position_embeddings=64,
    ),
}

# Mixtures of experts: 8 experts, top 2 (Qwen3-MoE with and without renormalised top-k).
MOE_CONFIGS = {
    "qwen3_moe": lambda: Qwen3MoeConfig(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=False, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        vocab_size=VOCAB, max_position_embeddings=64,
    ),
    "qwen3_moe_norm": lambda: Qwen3MoeConfig(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3,
        norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=VOCAB, max_position_embeddings=64,
    ),
    "mixtral": lambda: MixtralConfig(
        hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
    ),
}
CONFIGS.update(MOE_CONFIGS)


def build_hf_model(name: str, seed: int = 0):
    """A random HF model whose biases and norm weights are perturbed too, so every
    parameter matters in a logits comparison."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(CONFIGS[name]()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        for name, p in model.named_parameters():
            if name.endswith(".gate.weight"):  # routers: spread the logits so the top-k is far from ties
                p.copy_(0.5 * torch.randn_like(p))
    return model


def padded_batch(seed: int = 0, batch: int = 3, length: int = 12):
    """Token ids with one full row, one right-padded row, one left-padded row."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, VOCAB, (batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[1, length - 4:] = 0
    mask[2, :3] = 0
    return ids, mask


def hf_logits(model, ids, mask):
    positions = np.clip(mask.cumsum(1) - 1, 0, None)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        )
    return out.logits.float().numpy()
