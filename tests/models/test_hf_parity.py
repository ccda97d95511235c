"""The Flax decoder against Hugging Face's PyTorch models, and HF checkpoints in and out."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

from rljax.models import CheckpointMismatchError, UnsupportedModelError, load_hf, save_hf
from tests.models.hf_fixtures import CONFIGS, build_hf_model, hf_logits, padded_batch


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def hf_checkpoint(request, tmp_path_factory):
    model = build_hf_model(request.param)
    path = str(tmp_path_factory.mktemp(request.param))
    model.save_pretrained(path)
    return request.param, model, path


def _params(model):
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(nnx.state(model))}


@pytest.mark.slow
def test_logits_match_transformers_on_padded_batch(hf_checkpoint):
    name, hf_model, path = hf_checkpoint
    ids, mask = padded_batch()
    ours = np.asarray(load_hf(path)(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    ref = hf_logits(hf_model, ids, mask)
    diff = np.abs(ours - ref)[mask.astype(bool)].max()
    print(f"{name}: max |logit diff| = {diff:.3g}")
    assert diff <= 1e-4


def test_export_roundtrip_transformers_and_rljax(hf_checkpoint, tmp_path):
    name, hf_model, path = hf_checkpoint
    model = load_hf(path)
    out = str(tmp_path / "export")
    save_hf(model, out)
    reloaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert reloaded.config.model_type == hf_model.config.model_type
    ids, mask = padded_batch(seed=1)
    np.testing.assert_allclose(
        hf_logits(reloaded, ids, mask)[mask.astype(bool)], hf_logits(hf_model, ids, mask)[mask.astype(bool)],
        atol=1e-6,
    )
    again = _params(load_hf(out))
    for key, value in _params(model).items():
        assert np.array_equal(again[key], value), key  # bit-identical


@pytest.mark.slow
def test_left_padding_and_packing_do_not_change_logits(tmp_path):
    hf_model = build_hf_model("qwen3")
    hf_model.save_pretrained(tmp_path)
    model = load_hf(str(tmp_path))
    rng = np.random.RandomState(3)
    a, b = rng.randint(0, 128, 5), rng.randint(0, 128, 7)
    alone_a = np.asarray(model(jnp.asarray(a[None], jnp.int32)))[0]
    alone_b = np.asarray(model(jnp.asarray(b[None], jnp.int32)))[0]
    left = np.concatenate([np.zeros(3, np.int32), a])[None]
    left_mask = (np.arange(8) >= 3).astype(np.int32)[None]
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(left), attention_mask=jnp.asarray(left_mask)))[0, 3:],
                               alone_a, atol=1e-5)
    packed = np.concatenate([a, b, [0, 0]])[None].astype(np.int32)
    segments = np.array([[1] * 5 + [2] * 7 + [0, 0]], np.int32)
    out = np.asarray(model(jnp.asarray(packed), segment_ids=jnp.asarray(segments)))[0]
    np.testing.assert_allclose(out[:5], alone_a, atol=1e-5)
    np.testing.assert_allclose(out[5:12], alone_b, atol=1e-5)


def test_bf16_and_sharded_checkpoints_load(tmp_path):
    hf_model = build_hf_model("llama", seed=2)
    hf_model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", max_shard_size="40KB")
    assert os.path.exists(tmp_path / "bf16" / "model.safetensors.index.json")
    model = load_hf(str(tmp_path / "bf16"), dtype="float32")
    ref = hf_model.model.layers[1].self_attn.k_proj.weight.detach().float().numpy()  # [kv*hd, hidden]
    ours = np.asarray(model.layers.k_proj[...][1])  # [hidden, kv, hd]
    np.testing.assert_array_equal(ours.reshape(ours.shape[0], -1).T, ref)
    bf16 = load_hf(str(tmp_path / "bf16"), dtype="bfloat16")
    assert bf16.embed[...].dtype == jnp.bfloat16
    ids, mask = padded_batch()
    logits = nnx.jit(lambda m, i, a: m(i, attention_mask=a))(bf16, jnp.asarray(ids), jnp.asarray(mask))  # one program
    diff = np.abs(np.asarray(logits) - hf_logits(hf_model.float(), ids, mask))[mask.astype(bool)].max()
    assert diff < 0.1  # bf16 compute against fp32 compute of the same bf16 weights


def test_sharded_export_has_index_and_loads(tmp_path):
    hf_model = build_hf_model("qwen2_tied")
    hf_model.save_pretrained(tmp_path / "src")
    model = load_hf(str(tmp_path / "src"))
    save_hf(model, str(tmp_path / "out"), max_shard_size="30KB", dtype="bfloat16")
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert "lm_head.weight" not in index["weight_map"]  # tied
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["dtype"] == "bfloat16"
    reloaded, info = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert reloaded.dtype == torch.bfloat16
    # every file readable by others, as a plain open() would leave it under the umask (safetensors writes 0600)
    import os
    import stat

    mask = os.umask(0o022)
    try:
        save_hf(model, str(tmp_path / "shared"), tokenizer=None)
    finally:
        os.umask(mask)
    for f in list((tmp_path / "out").iterdir()) + list((tmp_path / "shared").iterdir()):
        assert stat.S_IMODE(f.stat().st_mode) & 0o044 == 0o044, f
    assert stat.S_IMODE((tmp_path / "shared" / "model.safetensors").stat().st_mode) == 0o644


def test_unsupported_architecture_is_named(tmp_path):
    build_hf_model("llama").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = "deepseek_v3"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="deepseek_v3"):
        load_hf(str(tmp_path))


def test_mismatched_checkpoint_names_the_tensor(tmp_path):
    build_hf_model("llama").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 80
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointMismatchError, match=r"model\.layers\.0\.mlp\.(gate|up|down)_proj\.weight"):
        load_hf(str(tmp_path))
    cfg["intermediate_size"] = 96
    cfg["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointMismatchError, match=r"missing tensors \['model\.layers\.2\."):
        load_hf(str(tmp_path))
