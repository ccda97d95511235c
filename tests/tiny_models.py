"""Tiny model shapes that several test modules build (random weights; compiling them is fast)."""

from rljax.models import ModelConfig


def tiny_qwen2_hf(**overrides) -> dict:
    """`model.hf_config` of the RL end-to-end tests (char tokenizer): one qwen2 layer, hidden 32,
    2 attention heads sharing one KV head, tied embeddings. A new dict each call."""
    return {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": True, **overrides}


# two qwen2 layers over a 64-token vocabulary: hidden 32, 4 heads of 8 sharing 2 KV heads
TWO_LAYER_QWEN2 = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
