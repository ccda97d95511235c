"""LoRA adapters on the decoder, checked against Hugging Face PEFT on transformers models
(the reference we did not write): adapters exported by rljax load into `peft` with the
same logits, and adapters made by `peft` load into rljax with the same logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import peft  # a test dependency (pyproject: [test])
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

from rljax.models import load_hf
from rljax.models.lora import TARGET_INDEX, Dropout, LoRAConfig, add_adapters, add_delta, dropout, merge_into_base, \
    split_trainable
from rljax.models.lora_peft import load_peft_adapters, save_peft_adapters
from tests.models.hf_fixtures import build_hf_model, hf_logits, padded_batch


TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _randomise_adapters(decoder, seed: int) -> None:
    """Non-zero B (fresh adapters compute the base model exactly)."""
    for i, (name, var) in enumerate(sorted(decoder.layers.variables().items())):
        if name.endswith("_lora_b"):
            var[...] = 0.05 * jax.random.normal(jax.random.key(seed + i), var.shape, var.dtype)


@pytest.fixture(scope="module", params=["qwen3"])
def base(request, tmp_path_factory):
    model = build_hf_model(request.param)
    path = str(tmp_path_factory.mktemp(request.param))
    model.save_pretrained(path)
    return model, path


def _ours(decoder, ids, mask):
    return np.asarray(decoder(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))


@pytest.mark.slow
def test_rljax_adapters_load_into_peft_with_the_same_logits(base, tmp_path):
    hf_model, path = base
    config = LoRAConfig(rank=4, alpha=8.0, target_modules=TARGETS)
    decoder = load_hf(path)
    add_adapters(decoder, config)
    _randomise_adapters(decoder, 0)
    out = str(tmp_path / "adapter")
    save_peft_adapters(decoder, out, config, base_model=path)
    peft_model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), out).eval()
    ids, mask = padded_batch(seed=2)
    ref = hf_logits(peft_model, ids, mask)
    base_ref = hf_logits(hf_model, ids, mask)
    keep = mask.astype(bool)
    assert np.abs(ref - base_ref)[keep].max() > 1e-2  # the adapters change the function
    np.testing.assert_allclose(_ours(decoder, ids, mask)[keep], ref[keep], atol=1e-5)


@pytest.mark.slow
def test_peft_adapters_load_into_rljax_with_the_same_logits(base, tmp_path):
    hf_model, path = base
    name = "llama" if hf_model.config.model_type == "llama" else "qwen3"
    torch.manual_seed(3)
    config = peft.LoraConfig(r=3, lora_alpha=6, target_modules=["q_proj", "o_proj", "down_proj", "up_proj"],
                             init_lora_weights=False)  # random A and B
    peft_model = peft.get_peft_model(build_hf_model(name), config).eval()
    out = str(tmp_path / "peft")
    peft_model.save_pretrained(out)
    decoder = load_hf(path)
    add_adapters(decoder, LoRAConfig(rank=3, alpha=6.0, target_modules=["q_proj", "up_proj", "o_proj", "down_proj"]))
    load_peft_adapters(decoder, out)
    ids, mask = padded_batch(seed=4)
    keep = mask.astype(bool)
    ref = hf_logits(peft_model, ids, mask)
    assert np.abs(ref - hf_logits(hf_model, ids, mask))[keep].max() > 1e-2
    np.testing.assert_allclose(_ours(decoder, ids, mask)[keep], ref[keep], atol=1e-5)

    wrong = load_hf(path)
    add_adapters(wrong, LoRAConfig(rank=4, alpha=6.0, target_modules=["q_proj", "up_proj", "o_proj", "down_proj"]))
    with pytest.raises(ValueError, match="rank=4"):
        load_peft_adapters(wrong, out)


@pytest.mark.slow
def test_adapters_off_is_the_base_model_and_merging_keeps_the_function(base):
    _, path = base
    plain = load_hf(path)
    decoder = load_hf(path)
    add_adapters(decoder, LoRAConfig(rank=2, alpha=4.0, target_modules=["v_proj", "gate_proj"]))
    ids, mask = padded_batch(seed=5)
    np.testing.assert_array_equal(_ours(decoder, ids, mask), _ours(plain, ids, mask))  # B = 0 at init
    _randomise_adapters(decoder, 7)
    with_adapters = _ours(decoder, ids, mask)
    off = np.asarray(decoder.logits(decoder.hidden_states(jnp.asarray(ids), jnp.asarray(mask), adapters=False)))
    np.testing.assert_array_equal(off, _ours(plain, ids, mask))
    trainable, frozen = split_trainable(decoder)
    assert {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(trainable)} == {
        f"['layers']['{t}_lora_{w}'].value" for t in ("v_proj", "gate_proj") for w in "ab"}
    assert len(jax.tree.leaves(frozen)) == len(jax.tree.leaves(nnx.state(plain)))
    merge_into_base(decoder)
    np.testing.assert_allclose(_ours(decoder, ids, mask), with_adapters, atol=1e-5)


@pytest.mark.slow
def test_config_errors_and_a_reward_model_trains_adapters_and_its_head():
    import os

    from rljax.config import ConfigError, load_config
    from rljax.models import ModelConfig, init_model
    from rljax.models.heads import ScalarHeadModel
    from rljax.train.run_config import RunConfig

    sft = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "configs", "sft_tiny.yaml")
    for overrides, message in ((["model.lora.target_modules=[q_proj,qkv]"], "unknown module 'qkv'"),
                               (["model.lora.rank=4", "model.lora.dropout=1.0"], "dropout: must be in \\[0, 1\\)"),
                               (["model.lora.path=/x"], "needs rank > 0")):
        with pytest.raises(ConfigError, match=message):
            load_config(RunConfig, sft, overrides)
    config = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    decoder = init_model(config)
    add_adapters(decoder, LoRAConfig(rank=2, target_modules=["q_proj"]))
    trainable, _ = split_trainable(ScalarHeadModel(decoder, rngs=nnx.Rngs(0)))
    assert sorted(jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(trainable)) == [
        "['backbone']['layers']['q_proj_lora_a'].value", "['backbone']['layers']['q_proj_lora_b'].value",
        "['score'].value"]


class _FixedMask(torch.nn.Module):
    """Stands in for PEFT's `lora_dropout` module: multiplies by a given `m / (1 - p)`."""

    def __init__(self, scaled_mask: np.ndarray):
        super().__init__()
        self.scaled_mask = torch.tensor(scaled_mask)

    def forward(self, x):
        return x * self.scaled_mask


def test_lora_dropout_is_on_the_branch_input_as_peft_and_inverted():
    """`lora.dropout`: PEFT's lora.Linear in train mode computes W x + s B(A(dropout(x)));
    given our mask in place of its `nn.Dropout`, it must give our `add_delta`."""
    rate, rank, alpha = 0.4, 3, 6.0
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 12)).astype(np.float32)  # [B, T, in]
    key = jax.random.key(7)
    # the mask by hand: every entry of dropout(x) is 0 or x / (1 - p), kept with frequency 1 - p
    dropped = np.asarray(dropout(jnp.asarray(x), key, rate))
    keep = dropped != 0
    np.testing.assert_allclose(dropped[keep], x[keep] / (1 - rate), rtol=1e-6)
    assert abs(keep.mean() - (1 - rate)) < 0.1, keep.mean()
    big = np.asarray(dropout(jnp.ones((200, 200)), key, rate)) != 0
    assert abs(big.mean() - (1 - rate)) < 0.01

    for target, out_shape in (("q_proj", (2, 4)), ("down_proj", (8,))):
        w = rng.normal(size=(12, *out_shape)).astype(np.float32)  # [in, *out]
        a = rng.normal(size=(12, rank)).astype(np.float32)
        b = rng.normal(size=(rank, *out_shape)).astype(np.float32)
        out = int(np.prod(out_shape))
        layer = torch.nn.Sequential()
        layer.add_module(target, torch.nn.Linear(12, out, bias=False))
        peft_layer = peft.inject_adapter_in_model(
            peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=rate, target_modules=[target]), layer)
        lora_linear = getattr(peft_layer, target)
        with torch.no_grad():
            lora_linear.base_layer.weight.copy_(torch.tensor(w.reshape(12, out).T))
            lora_linear.lora_A["default"].weight.copy_(torch.tensor(a.T))
            lora_linear.lora_B["default"].weight.copy_(torch.tensor(b.reshape(rank, out).T))
        p = {target: jnp.asarray(w), f"{target}_lora_a": jnp.asarray(a),
             f"{target}_lora_b": jnp.asarray(b) * (alpha / rank)}  # B scaled as `scaled` hands it over
        base_y = jnp.tensordot(jnp.asarray(x), p[target], axes=1)
        drop = Dropout(key, rate)
        ours = np.asarray(add_delta(p, target, jnp.asarray(x), base_y, drop)).reshape(2, 5, out)
        mask = np.asarray(dropout(jnp.ones(x.shape), jax.random.fold_in(key, TARGET_INDEX[target]), rate))
        torch_dropout = lora_linear.lora_dropout["default"]
        assert isinstance(torch_dropout, torch.nn.Dropout) and torch_dropout.p == rate
        lora_linear.lora_dropout["default"] = _FixedMask(mask)
        with torch.no_grad():
            ref = peft_layer.train()(torch.tensor(x)).numpy()
        lora_linear.lora_dropout["default"] = torch_dropout
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
        # a direct formula: y = x W + (alpha / r) ((x * m / (1 - p)) A) B
        direct = x @ w.reshape(12, out) + (alpha / rank) * ((x * mask) @ a) @ b.reshape(rank, out)
        np.testing.assert_allclose(ours, direct, rtol=1e-5, atol=1e-5)
        # no `drop` (every forward but the train step's): PEFT in eval mode, no dropout
        plain = np.asarray(add_delta(p, target, jnp.asarray(x), base_y)).reshape(2, 5, out)
        with torch.no_grad():
            np.testing.assert_allclose(plain, peft_layer.eval()(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-5)
        assert np.abs(plain - ours).max() > 1e-2
