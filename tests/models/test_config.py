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


@pytest.mark.parametrize("bad, message", [
    ({"hidden_size": -64}, r"^cfg: hidden_size: must be in \[1, 2147483647\], got -64$"),
    ({"num_hidden_layers": 0}, r"^cfg: num_hidden_layers: must be in"),
    ({"intermediate_size": 2.5}, r"^cfg: intermediate_size: must be a whole number, got 2.5$"),
    ({"num_key_value_heads": 3}, r"^cfg: num_key_value_heads: 3 does not divide num_attention_heads=4$"),
    ({"num_attention_heads": 3, "num_key_value_heads": 1}, r"^cfg: num_attention_heads: 3 does not divide hidden_size"),
    ({"rope_theta": -1.0}, r"^cfg: rope_theta: must be a finite number > 0, got -1.0$"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, r"^cfg: rope_parameters.rope_theta: must be"),
    ({"rms_norm_eps": float("nan")}, r"^cfg: rms_norm_eps: must be a finite number > 0"),
    ({"initializer_range": -0.02}, r"^cfg: initializer_range: must be a finite number >= 0"),
    ({"eos_token_id": [2, -1]}, r"^cfg: eos_token_id: must be a token id >= 0"),
    ({"tie_word_embeddings": "yes"}, r"^cfg: tie_word_embeddings: must be true or false"),
])
def test_impossible_values_are_named_with_their_key(bad, message):
    from rljax.models.config import ModelConfigError

    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_hf_dict({**BASE, "model_type": "llama", **bad}, "cfg: ")


def test_head_dim_given_need_not_divide_hidden():
    """Qwen3 sets head_dim explicitly: heads x head_dim may differ from hidden_size."""
    config = ModelConfig.from_hf_dict({**BASE, "model_type": "qwen3", "num_attention_heads": 3,
                                       "num_key_value_heads": 1, "head_dim": 32})
    assert config.head_dim == 32 and config.num_attention_heads == 3
