"""Building what a run needs from its config: tokenizer, model, mesh placement, throughput."""

from __future__ import annotations

import jax
from flax import nnx

from rljax.models import DTypePolicy, ModelConfig, init_model, load_hf, read_config
from rljax.models.transformer import Decoder
from rljax.parallel import state_shardings
from rljax.train.run_config import ModelSection

# Dense bf16 peak FLOP/s per chip, from the vendors' spec sheets; for perf/mfu.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "TPU v6": 918e12,
    "TPU v5p": 459e12,
    "TPU v5": 197e12,  # v5e / "TPU v5 lite"
    "TPU v4": 275e12,
}


def peak_flops(configured: float = 0.0) -> float:
    """Per-device peak, or 0 when unknown (CPU): then perf/mfu is not reported."""
    if configured:
        return configured
    kind = jax.devices()[0].device_kind
    for name, flops in PEAK_FLOPS.items():
        if name.lower() in kind.lower():
            return flops
    return 0.0


def load_tokenizer(section: ModelSection):
    source = section.tokenizer or section.path
    if source == "char":
        from rljax.data.tokenizer import build_char_tokenizer

        return build_char_tokenizer()
    if not source:
        raise ValueError("model.tokenizer: no tokenizer; set model.tokenizer (a folder or 'char') or model.path")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


def model_config_from_section(section: ModelSection, tokenizer) -> ModelConfig:
    """An HF-style config dict completed from the tokenizer (vocab size, special ids)."""
    hf = dict(section.hf_config)
    hf.setdefault("vocab_size", len(tokenizer))
    if tokenizer is not None:
        hf.setdefault("eos_token_id", tokenizer.eos_token_id)
        hf.setdefault("pad_token_id", tokenizer.pad_token_id)
        hf.setdefault("bos_token_id", tokenizer.bos_token_id)
    if "model_type" not in hf:
        raise ValueError("model.hf_config.model_type: required for a randomly initialised model (llama|qwen2|qwen3)")
    return ModelConfig.from_hf_dict(hf)


def build_decoder(section: ModelSection, tokenizer, *, weights: bool = True) -> Decoder:
    """The configured decoder: loaded from `model.path` or randomly initialised. With
    `weights=False` the checkpoint is not read (for `nnx.eval_shape`: shapes only)."""
    policy = DTypePolicy(section.param_dtype, section.compute_dtype)
    if section.path and weights:
        return load_hf(section.path, section.param_dtype, compute_dtype=section.compute_dtype,
                       remat=section.remat, attention=section.attention)
    config = read_config(section.path) if section.path else model_config_from_section(section, tokenizer)
    return init_model(config, seed=section.init_seed, policy=policy, remat=section.remat, attention=section.attention)


def place(module: nnx.Module, mesh) -> tuple[nnx.GraphDef, nnx.State]:
    """Split a module once and put its state on the mesh by its logical axes."""
    graphdef, state = nnx.split(module)
    return graphdef, jax.device_put(state, state_shardings(state, mesh))
