"""GGUF files without the real model: llama.cpp's query/key row order (hand-computed),
a tiny random Llama written as GGUF (F32, F16 and Q8_0 tensors) whose logits equal
transformers' on the same file, and the one-line errors."""

import numpy as np
import pytest

from rljax.models.gguf import is_gguf, permute_rows, unpermute_rows


def test_query_key_row_order_hand_computed():
    # one head of dim 4: HF rotates halves (rows 0,1 | 2,3), llama.cpp adjacent pairs, so its
    # pair (0, 1) holds HF rows (0, 2) and its pair (2, 3) HF rows (1, 3)
    hf = np.array([[0.0], [1.0], [2.0], [3.0]])
    stored = np.array([[0.0], [2.0], [1.0], [3.0]])
    np.testing.assert_array_equal(permute_rows(hf, 1), stored)
    np.testing.assert_array_equal(unpermute_rows(stored, 1), hf)
    # two heads: each head reordered on its own
    hf2 = np.arange(8.0)[:, None]
    np.testing.assert_array_equal(permute_rows(hf2, 2)[:, 0], [0, 2, 1, 3, 4, 6, 5, 7])
    w = np.random.default_rng(0).normal(size=(3 * 8, 5))
    np.testing.assert_array_equal(unpermute_rows(permute_rows(w, 3), 3), w)


def test_is_gguf_by_suffix():
    assert is_gguf("/x/model.Q4_1.gguf") and is_gguf("M.GGUF")
    assert not is_gguf("/x/folder") and not is_gguf("/x/model.gguf/config.json")


def _write_tiny(path, hf_model, architecture: str = "llama", extra_tensor: bool = False):
    """A random transformers Llama as llama.cpp's converter lays it out."""
    gguf = pytest.importorskip("gguf", reason="RLJAX_TEST_GGUF: the gguf package is absent")
    from gguf.quants import quantize

    cfg = hf_model.config
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for name, tensor in hf_model.state_dict().items():
        a = tensor.numpy().astype(np.float32)
        if name in names:
            out = names[name]
        else:
            _, _, i, rest = name.split(".", 3)
            out = f"blk.{i}.{layer[rest.removesuffix('.weight')]}.weight"
            if rest.startswith("self_attn.q_proj"):
                a = permute_rows(a, cfg.num_attention_heads)
            elif rest.startswith("self_attn.k_proj"):
                a = permute_rows(a, cfg.num_key_value_heads)
        if a.ndim == 1:
            w.add_tensor(out, a)  # norms stay F32, as llama.cpp writes them
        elif "ffn_up" in out:
            w.add_tensor(out, a.astype(np.float16))
        else:
            q = quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(out, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    if extra_tensor:
        w.add_tensor("rope_freqs.weight", np.ones(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=256,
                         initializer_range=0.2, rope_theta=10000.0, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config).eval()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_tiny(path, model)
    return path


@pytest.mark.slow
def test_tiny_file_logits_equal_transformers_reading_it(tiny):
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM

    from rljax.models import load_hf

    reference = AutoModelForCausalLM.from_pretrained(str(tiny.parent), gguf_file=tiny.name,
                                                     dtype=torch.float32).eval()
    model = load_hf(str(tiny))
    assert model.config.num_attention_heads == 4 and not model.config.tie_word_embeddings
    ids = np.random.default_rng(1).integers(0, 128, size=(2, 12)).astype(np.int32)
    ours = np.asarray(model(jnp.asarray(ids)))
    with torch.no_grad():
        theirs = reference(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    assert np.abs(ours - theirs).max() <= 1e-4


def test_errors_name_the_file_and_the_problem(tmp_path):
    pytest.importorskip("gguf", reason="RLJAX_TEST_GGUF: the gguf package is absent")
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rljax.models import CheckpointMismatchError, UnsupportedModelError, load_hf, read_config

    with pytest.raises(FileNotFoundError, match="absent.gguf: no such GGUF file"):
        read_config(str(tmp_path / "absent.gguf"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="broken.gguf: not a readable GGUF file"):
        read_config(str(broken))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=64, max_position_embeddings=64)).eval()
    other = tmp_path / "other.gguf"
    _write_tiny(other, model, architecture="gpt2")
    with pytest.raises(UnsupportedModelError, match=r"other.gguf: general.architecture='gpt2'"):
        read_config(str(other))
    extra = tmp_path / "extra.gguf"
    _write_tiny(extra, model, extra_tensor=True)
    with pytest.raises(CheckpointMismatchError, match=r"extra.gguf: .*unexpected tensors \['rope_freqs.weight'\]"):
        load_hf(str(extra))


@pytest.mark.slow
def test_bench_sampler_runs_a_gguf_model_in_both_systems(tiny, tmp_path):
    import json

    from rljax.cli import main

    out = tmp_path / "sampler.json"
    assert main(["bench", "sampler", "--model", str(tiny), "--batch-sizes", "1,2", "--prompt-len", "8",
                 "--new-tokens", "4", "--share-n", "2", "--share-prompts", "1", "--share-prompt-len", "8",
                 "--repeats", "1", "--torch-threads", "1", "--rl-prompts", "0", "--agent-episodes", "0",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"] == str(tiny) and result["preset"] is None
    assert [r["batch"] for r in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert row["rljax_tok_s"] > 0 and row["hf_tok_s"] > 0 and row["ratio"] > 0
