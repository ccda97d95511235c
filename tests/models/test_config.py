"""ModelConfig <-> HF config.json in both the transformers 4 and 5 forms."""

import pytest

from rljax.models import ModelConfig, UnsupportedModelError

BASE = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def test_transformers4_and_5_rope_forms_agree():
    v4 = ModelConfig.from_hf_dict({**BASE, "model_type": "llama", "rope_theta": 500000.0,
                                   "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
    v5 = ModelConfig.from_hf_dict({**BASE, "model_type": "llama", "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
    assert v4 == v5 and v4.rope.theta == 500000.0 and v4.rope.rope_type == "llama3"
    assert ModelConfig.from_hf_dict(v5.to_hf_dict()) == v5


def test_family_specific_options():
    qwen2 = ModelConfig.from_hf_dict({**BASE, "model_type": "qwen2", "tie_word_embeddings": True})
    assert qwen2.qkv_bias and not qwen2.out_bias and qwen2.tie_word_embeddings and not qwen2.qk_norm
    qwen3 = ModelConfig.from_hf_dict({**BASE, "model_type": "qwen3", "head_dim": 128})
    assert qwen3.qk_norm and qwen3.head_dim == 128 and not qwen3.qkv_bias
    llama = ModelConfig.from_hf_dict({**BASE, "model_type": "llama"})
    assert llama.head_dim == 16 and llama.num_params() > 0


@pytest.mark.parametrize("bad, match", [
    ({"model_type": "gpt2"}, "gpt2"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "sliding"),
    ({"model_type": "llama", "hidden_act": "gelu"}, "gelu"),
])
def test_unsupported_options_are_named(bad, match):
    with pytest.raises(UnsupportedModelError, match=match):
        ModelConfig.from_hf_dict({**BASE, **bad})
