"""Tiny model shapes that several test modules build (random weights; compiling them is fast).

On CPU a random init compiles one program per distinct parameter shape (about half a second
each): test modules that share a config share those programs."""

import dataclasses

from rljax.models import ModelConfig


def tiny_qwen2_hf(**overrides) -> dict:
    """`model.hf_config` of the RL end-to-end tests (char tokenizer): one qwen2 layer, hidden 32,
    2 attention heads sharing one KV head, tied embeddings. A new dict each call."""
    return {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": True, **overrides}


# two qwen2 layers over a 64-token vocabulary: hidden 32, 4 heads of 8 sharing 2 KV heads
TWO_LAYER_QWEN2 = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)


CHAR_VOCAB = 102  # len(build_char_tokenizer())


def char_qwen2(tied: bool = True) -> ModelConfig:
    """TWO_LAYER_QWEN2's layer shapes with q/k/v biases over the char tokenizer's vocabulary
    (pad id 0, eos id 3, 64 positions): the reward models of the tests."""
    return dataclasses.replace(TWO_LAYER_QWEN2, vocab_size=CHAR_VOCAB, qkv_bias=True, tie_word_embeddings=tied,
                               max_position_embeddings=64, eos_token_id=3, pad_token_id=0)
