"""Building what a run needs from its config: tokenizer, model, mesh placement, throughput.

Models are created in their sharded layout: random init is one jitted call with
`out_shardings` (`rljax.parallel.sharded_init`), checkpoints are read slice by slice into
the shards each process owns (`rljax.models.hf.load_hf_sharded`). No device or host ever
holds the whole model.
"""

from __future__ import annotations

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from rljax.data.tokenizer import load_tokenizer  # noqa: F401  (re-exported: callers build the model beside it)
from rljax.models import DTypePolicy, ModelConfig, init_model, read_config
from rljax.models.hf import load_hf_sharded
from rljax.models.lora import add_adapters, split_trainable
from rljax.models.lora_peft import load_peft_adapters
from rljax.models.transformer import Decoder
from rljax.parallel import MeshConfig, make_mesh, optimizer_shardings, replicated, sharded_init, state_shardings
from rljax.train.run_config import ModelRunConfig
from rljax.train.steps import TrainState, init_train_state

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


def model_config_from_section(section: ModelRunConfig, tokenizer) -> ModelConfig:
    """An HF-style config dict completed from the tokenizer (vocab size, special ids)."""
    hf = dict(section.hf_config)
    if "vocab_size" not in hf:
        hf["vocab_size"] = len(tokenizer)
    if tokenizer is not None:
        hf.setdefault("eos_token_id", tokenizer.eos_token_id)
        hf.setdefault("pad_token_id", tokenizer.pad_token_id)
        hf.setdefault("bos_token_id", tokenizer.bos_token_id)
    if "model_type" not in hf:
        raise ValueError("model.hf_config.model_type: required for a randomly initialised model (llama|qwen2|qwen3)")
    return ModelConfig.from_hf_dict(hf, "model.hf_config.")


def _default_mesh() -> Mesh:
    """The active mesh (`jax.set_mesh`) if there is one, else fsdp over every device."""
    active = jax.sharding.get_mesh()
    return active if not active.empty else make_mesh(MeshConfig())


def build_decoder(section: ModelRunConfig, tokenizer, *, weights: bool = True, mesh: Mesh | None = None) -> Decoder:
    """The configured decoder, created directly in its sharded layout on `mesh`: loaded
    from `model.path` (each process reads only its shards) or randomly initialised (one
    jitted call with out_shardings). Without `mesh`: the active mesh, else fsdp over all
    devices (`place` then moves shards device-to-device if the run's mesh differs).

    With `weights=False` nothing is allocated or read: the plain constructor, for
    `nnx.eval_shape` (shapes only).

    With `model.lora.rank > 0` the decoder gets LoRA adapters (`rljax.models.lora`):
    fresh ones, or those of the PEFT folder `model.lora.path`, placed by their logical axes."""
    policy = DTypePolicy(section.param_dtype, section.compute_dtype)
    if not weights:
        config = read_config(section.path) if section.path else model_config_from_section(section, tokenizer)
        decoder = init_model(config, seed=section.init_seed, policy=policy, remat=section.remat,
                             attention=section.attention)
        if section.lora.enabled:
            add_adapters(decoder, section.lora)
        return decoder
    mesh = mesh if mesh is not None else _default_mesh()
    if section.path:
        decoder = load_hf_sharded(section.path, mesh, section.param_dtype, compute_dtype=section.compute_dtype,
                                  remat=section.remat, attention=section.attention)
    else:
        config = model_config_from_section(section, tokenizer)
        decoder = sharded_init(lambda: init_model(config, seed=section.init_seed, policy=policy, remat=section.remat,
                                                  attention=section.attention), mesh)
    if section.lora.enabled:
        add_adapters(decoder, section.lora)
        if section.lora.path:
            load_peft_adapters(decoder, section.lora.path)
        adapters, _ = split_trainable(decoder)
        nnx.update(decoder, jax.device_put(adapters, state_shardings(adapters, mesh)))
    return decoder


def place(module: nnx.Module, mesh) -> tuple[nnx.GraphDef, nnx.State]:
    """Split a module once and put its state on the mesh by its logical axes. Arrays
    already in that layout (from `build_decoder`) stay where they are; others move
    device-to-device (or, for a small fresh head, from the default device)."""
    graphdef, state = nnx.split(module)
    return graphdef, jax.device_put(state, state_shardings(state, mesh))


def place_trainable(module: nnx.Module, mesh) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """`place`, then the state cut in (trainable, frozen) parts (`rljax.models.lora.
    split_trainable`): with LoRA the adapters (and a head) and the base weights; without,
    every parameter and an empty state."""
    graphdef, state = place(module, mesh)
    trainable, frozen = split_trainable(module, state)
    return graphdef, trainable, frozen


def train_state_shardings(params, optimizer: optax.GradientTransformation, mesh) -> TrainState:
    """Shardings of `init_train_state(params, optimizer)`: params as placed, optimizer
    moments like their params, scalars replicated."""
    param_shardings = state_shardings(params, mesh)
    return TrainState(
        params=param_shardings,
        opt_state=optimizer_shardings(optimizer, param_shardings, mesh),
        step=replicated(mesh),
        skipped_steps=replicated(mesh),
        rng=replicated(mesh),
    )


def init_sharded_train_state(params, optimizer: optax.GradientTransformation, seed: int, mesh) -> TrainState:
    """`init_train_state` with every part in its sharded layout (AdamW's mu and nu split
    like the params, not replicated as XLA would otherwise leave them)."""
    shardings = train_state_shardings(params, optimizer, mesh)
    return jax.jit(lambda p: init_train_state(p, optimizer, seed), out_shardings=shardings)(params)
