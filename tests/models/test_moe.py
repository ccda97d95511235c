"""Mixture-of-experts decoder (Qwen3-MoE, Mixtral): sharded HF checkpoints in and out,
configs refused in one line, the router against its formula and the dispatch against a
dense computation of every expert."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

from rljax.models import UnsupportedModelError, load_hf, save_hf
from rljax.models.config import ModelConfig
from rljax.models.hf import load_hf_sharded
from rljax.models.lora import LoRAConfig, add_adapters
from rljax.models.moe import dense_reference, dispatch, route
from rljax.models.transformer import init_model
from rljax.parallel import MeshConfig, make_mesh
from tests.models.hf_fixtures import build_hf_model, hf_logits, padded_batch


def test_sharded_moe_checkpoints_in_and_out(tmp_path):
    """A multi-file HF Qwen3-MoE checkpoint loads (whole and straight into an
    experts-over-fsdp layout) with logits equal to transformers'; `save_hf` writes a
    multi-file one transformers loads with no missing keys and the same logits."""
    hf_model = build_hf_model("qwen3_moe", seed=4)
    hf_model.save_pretrained(tmp_path / "src", max_shard_size="40KB")
    assert len(set(json.loads((tmp_path / "src" / "model.safetensors.index.json").read_text())["weight_map"]
                   .values())) > 2
    ids, mask = padded_batch(seed=2)
    ref = hf_logits(hf_model, ids, mask)[mask.astype(bool)]
    model = load_hf(str(tmp_path / "src"))
    forward = nnx.jit(lambda m, i, a: m(i, attention_mask=a))  # one program, not one per operation
    ours = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(mask)))[mask.astype(bool)]
    assert np.abs(ours - ref).max() <= 1e-4

    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    sharded = load_hf_sharded(str(tmp_path / "src"), mesh)
    gate = sharded.layers.expert_gate[...]  # [L, X, E, F]: experts over fsdp, F over tensor
    assert gate.sharding.shard_shape(gate.shape) == (2, 2, 64, 16)
    np.testing.assert_array_equal(np.asarray(gate), np.asarray(model.layers.expert_gate[...]))

    save_hf(model, str(tmp_path / "out"), max_shard_size="40KB")
    assert os.path.exists(tmp_path / "out" / "model.safetensors.index.json")
    reloaded, info = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert reloaded.config.num_experts == 8 and reloaded.config.norm_topk_prob is False
    np.testing.assert_allclose(hf_logits(reloaded, ids, mask)[mask.astype(bool)], ref, atol=1e-6)


def _qwen3_moe_dict(**changes):
    d = build_hf_model("qwen3_moe").config.to_dict()
    d.update(changes)
    return d


@pytest.mark.parametrize("changes, message", [
    ({"mlp_only_layers": [1]}, r"mlp_only_layers=\[1\].*every layer to be MoE"),
    ({"decoder_sparse_step": 2}, r"decoder_sparse_step=2"),
])
def test_partly_dense_moe_configs_are_refused(changes, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_hf_dict(_qwen3_moe_dict(**changes))


@pytest.mark.slow
def test_mixtral_sliding_window_and_lora_on_experts_are_refused():
    d = build_hf_model("mixtral").config.to_dict()
    d["sliding_window"] = 16
    with pytest.raises(UnsupportedModelError, match="sliding_window=16"):
        ModelConfig.from_hf_dict(d)
    model = init_model(ModelConfig.from_hf_dict(_qwen3_moe_dict()))
    with pytest.raises(ValueError, match=r"\['gate_proj', 'up_proj', 'down_proj'\].*expert weights"):
        add_adapters(model, LoRAConfig(rank=2))
    add_adapters(model, LoRAConfig(rank=2, target_modules=["q_proj", "o_proj"]))  # attention only: fine


def test_router_by_hand():
    """Logits (1, 3, 2, 0) -> softmax p; top-2 {1, 2}; renormalised p_j / (p_1 + p_2)."""
    router = jnp.eye(4)  # [E=4, X=4]: logits = h
    h = jnp.asarray([[[1.0, 3.0, 2.0, 0.0]]])  # [1, 1, 4]
    p = np.exp([1.0, 3.0, 2.0, 0.0]) / np.exp([1.0, 3.0, 2.0, 0.0]).sum()
    w, experts, probs = route(h, router, 2, renormalise=False)
    assert experts.tolist() == [[[1, 2]]]
    np.testing.assert_allclose(np.asarray(w)[0, 0], [p[1], p[2]], rtol=1e-6)
    w, _, _ = route(h, router, 2, renormalise=True)
    np.testing.assert_allclose(np.asarray(w)[0, 0], [p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(w)[0, 0], np.exp([3.0, 2.0]) / np.exp([3.0, 2.0]).sum(), rtol=1e-6)


def _moe_inputs(seed=0, b=4, t=6, e=16, x=8, f=12, k=2):
    keys = jax.random.split(jax.random.key(seed), 5)
    h = jax.random.normal(keys[0], (b, t, e))
    gate, up = (0.3 * jax.random.normal(kk, (x, e, f)) for kk in keys[1:3])
    down = 0.3 * jax.random.normal(keys[3], (x, f, e))
    router = jax.random.normal(keys[4], (e, x))
    return h, router, gate, up, down, k


@pytest.mark.slow
def test_dispatch_equals_every_expert_computed_densely():
    h, router, gate, up, down, k = _moe_inputs()
    w, experts, _ = route(h, router, k, renormalise=True)
    np.testing.assert_allclose(dispatch(h, w, experts, gate, up, down),
                               dense_reference(h, w, experts, gate, up, down), atol=1e-5)
    # experts 4..7 held here: only the slots routed to them count
    held = np.asarray((experts >= 4) & (experts < 8))
    part = dispatch(h, w, experts, gate[4:], up[4:], down[4:], first_expert=4)
    np.testing.assert_allclose(part, dense_reference(h, jnp.where(held, w, 0.0), experts, gate, up, down), atol=1e-5)


def test_router_stays_float32_under_bf16_compute():
    from rljax.models.config import DTypePolicy

    config = ModelConfig.from_hf_dict(_qwen3_moe_dict())
    # traced, not compiled: the dtypes are decided while tracing
    arrays = jax.eval_shape(lambda: init_model(config, policy=DTypePolicy("float32", "bfloat16")).layer_arrays())
    assert arrays["router"].dtype == jnp.float32 and arrays["expert_gate"].dtype == jnp.bfloat16
