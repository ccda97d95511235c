"""LoRA adapters on the stacked-layer decoder: config, parameters, forward delta, the
trainable / frozen split, merging.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
arXiv:2106.09685, eq. 3) replaces a frozen projection `y = x W` by

    y = x W + (alpha / r) * (x A) B,      A: [in, r] ~ N(0, 1/in),  B: [r, out] = 0

so training starts from the base model exactly (B = 0) and only A and B (2 r (in + out)
numbers per projection and layer) are trained. A target is named as in Hugging Face /
PEFT (`q_proj`, ..., `down_proj`); its base weight is `[*in, *out]` in the decoder's
layout (`q_proj` `[E, N, D]`: in = (E,), out = (N, D); `o_proj` `[N, D, E]`: in = (N, D)).
The adapters are stacked on the `layers` axis like their base weights and carry the base
weight's logical axes on their `in` / `out` dimensions, so they shard like it; the rank
axis (`lora_rank`) is never split.

Adapters live in `DecoderLayers` as `LoRAParam` variables named `{target}_lora_a` /
`{target}_lora_b`. `Decoder.layer_arrays` hands them to the block's pure functions
with B already scaled by alpha / r, where `add_delta` adds the low-rank path; the sampler
runs the same pure functions, so it applies the adapters on the fly with no extra code.
`layer_arrays(adapters=False)` drops them: the base model, which is the reference policy
of DPO and of RL's KL terms (no second copy of the weights).

Dropout (`lora.dropout` = p, PEFT's `lora_dropout`) acts on the input of the low-rank
path only, and only in training forwards (PEFT: `nn.Dropout` in train mode):

    y = x W + (alpha / r) * (dropout(x) A) B,     dropout(x) = x * m / (1 - p),  m ~ Bernoulli(1 - p)

with an independent mask per target and layer. A forward is a training forward when the
train step gave its decoder a key (`set_dropout_key`, from the step's key, so a resumed
run draws the masks of the uninterrupted one); log-prob, reference, value and
evaluation forwards and the sampler never get one, so they compute `dropout(x) = x`.

Why not qwix (the JAX LoRA library Tunix uses): qwix adds adapters by intercepting the
einsum / dot_general calls of Flax modules matched by module path. This decoder has no
per-projection modules: one `lax.scan` over a dict of stacked arrays, shared with the
paged-KV sampler. The adapters here are a parameter spec table and one function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.config import Bounds, FieldError, PositiveFloat, Seed

# target -> number of leading `in` dimensions of its base weight (the rest are `out`)
TARGETS: dict[str, int] = {
    "q_proj": 1,  # [E | N, D]
    "k_proj": 1,  # [E | K, D]
    "v_proj": 1,  # [E | K, D]
    "o_proj": 2,  # [N, D | E]
    "gate_proj": 1,  # [E | F]
    "up_proj": 1,  # [E | F]
    "down_proj": 1,  # [F | E]
}

TARGET_INDEX = {target: i for i, target in enumerate(TARGETS)}  # folded into a layer's dropout key

RANK_AXIS = "lora_rank"

DROPOUT_STREAM = 0x4C6F5241  # purpose of the dropout keys, folded into the train step's key


@dataclass
class LoRAConfig:
    """`model.lora`: low-rank adapters instead of full fine-tuning (rank 0: off).

    With rank > 0 only the adapters (and a reward-model / critic head) are trained and
    checkpointed; the base weights are read-only and serve as the reference policy."""

    rank: Annotated[int, Bounds(ge=0, le=65536)] = 0  # r; 0: no adapters (full fine-tuning)
    alpha: PositiveFloat = 16.0  # the delta is scaled by alpha / rank (PEFT: lora_alpha)
    dropout: float = 0.0  # p of dropout on the adapters' input, in training forwards only (PEFT: lora_dropout)
    # projections that get adapters (HF / PEFT module names)
    target_modules: list[str] = field(default_factory=lambda: list(TARGETS))
    path: str = ""  # a PEFT adapter folder to start from (adapter_config.json + adapter_model.safetensors)
    init_seed: Seed = 0  # seed of A's random init

    def check(self) -> None:
        for name in self.target_modules:
            if name not in TARGETS:
                raise FieldError("target_modules", f"unknown module {name!r}; choose from {list(TARGETS)}")
        if len(set(self.target_modules)) != len(self.target_modules):
            raise FieldError("target_modules", f"repeated names in {self.target_modules}")
        if self.rank and not self.target_modules:
            raise FieldError("target_modules", "empty: with rank > 0 at least one module gets adapters")
        if not 0.0 <= self.dropout < 1.0:
            raise FieldError("dropout", f"must be in [0, 1) (got {self.dropout:g})")
        if self.path and not self.rank:
            raise FieldError("path", "an adapter folder needs rank > 0 (set it to the folder's r)")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class LoRAParam(nnx.Param):
    """An adapter matrix: trained (with a head, if any) while the base `nnx.Param`s stay frozen."""


def adapter_names(target: str) -> tuple[str, str]:
    return f"{target}_lora_a", f"{target}_lora_b"


def adapter_specs(target: str, base_shape: tuple[int, ...], base_axes: tuple[str, ...], rank: int):
    """Shapes and logical axes of A and B for a stacked base weight `[L, *in, *out]`."""
    n_in = TARGETS[target]
    layers, dims, axes = base_shape[0], base_shape[1:], base_axes[1:]
    a = ((layers, *dims[:n_in], rank), (base_axes[0], *axes[:n_in], RANK_AXIS))
    b = ((layers, rank, *dims[n_in:]), (base_axes[0], RANK_AXIS, *axes[n_in:]))
    return a, b


def add_adapters(decoder, config: LoRAConfig) -> None:
    """Give `decoder` (a `Decoder`) fresh adapters on `config.target_modules`: A ~ N(0,
    1/fan_in), B = 0, in the parameter dtype. Works under `nnx.eval_shape` too."""
    layers = decoder.layers
    on_experts = [t for t in config.target_modules if not hasattr(layers, t)]
    if on_experts and decoder.config.is_moe:
        raise ValueError(f"model.lora.target_modules {on_experts}: LoRA on mixture-of-experts expert weights is not "
                         "supported; target the attention projections (q_proj, k_proj, v_proj, o_proj)")
    key = jax.random.key(config.init_seed)
    for i, target in enumerate(config.target_modules):
        base = getattr(layers, target)
        (a_shape, a_axes), (b_shape, b_axes) = adapter_specs(
            target, base.shape, base.get_metadata()["logical_axes"], config.rank)
        fan_in = math.prod(a_shape[1:-1])
        a = jax.random.normal(jax.random.fold_in(key, i), a_shape, jnp.float32) / math.sqrt(fan_in)
        name_a, name_b = adapter_names(target)
        setattr(layers, name_a, LoRAParam(a.astype(base.dtype), logical_axes=a_axes))
        setattr(layers, name_b, LoRAParam(jnp.zeros(b_shape, base.dtype), logical_axes=b_axes))
    decoder.lora_scale = config.scale
    decoder.lora_dropout = config.dropout


def dropout(x: jax.Array, key: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout, as `torch.nn.Dropout` in train mode: `x * m / (1 - rate)` with
    `m ~ Bernoulli(1 - rate)` drawn per element of `x` from `key`."""
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


@dataclass(frozen=True)
class Dropout:
    """LoRA dropout of one layer in a training forward: `key` is the layer's key; each
    target draws its own mask from `fold_in(key, TARGET_INDEX[target])`."""

    key: jax.Array
    rate: float

    def __call__(self, x: jax.Array, target: str) -> jax.Array:
        return dropout(x, jax.random.fold_in(self.key, TARGET_INDEX[target]), self.rate)


def set_dropout_key(module: nnx.Module, step_key: jax.Array | None) -> None:
    """Make the next forwards of `module` (a module just merged inside the train step)
    training forwards: every decoder in it with `lora.dropout > 0` draws its masks from
    `fold_in(fold_in(step_key, DROPOUT_STREAM), d)` (d: the decoder's index in the graph),
    split over its layers. `step_key` is the step's key per (seed, step, micro-batch),
    `rljax.train.steps.step_key`. No-op without LoRA dropout or without a key."""
    if step_key is None:
        return
    decoders = [node for _, node in nnx.iter_graph(module)
                if isinstance(node, nnx.Module) and getattr(node, "lora_dropout", 0.0)]
    for d, decoder in enumerate(decoders):
        decoder.lora_dropout_key = jax.random.fold_in(jax.random.fold_in(step_key, DROPOUT_STREAM), d)


def add_delta(p: dict, target: str, x: jax.Array, y: jax.Array, drop: Dropout | None = None) -> jax.Array:
    """`y + (drop(x) A) B` when one layer's arrays `p` hold adapters for `target` (B
    already scaled by alpha / r, see `scaled`), else `y`. `x` is `[..., *in]`, `y`
    `[..., *out]`; `drop` (a training forward with LoRA dropout) or None: `drop(x) = x`."""
    name_a, name_b = adapter_names(target)
    if name_a not in p:
        return y
    n_in = TARGETS[target]
    if drop is not None:
        x = drop(x, target)
    low = jnp.tensordot(x, p[name_a], axes=n_in)  # [..., r]
    return y + jnp.tensordot(low, p[name_b], axes=1).astype(y.dtype)  # [..., *out]


def scaled(arrays: dict[str, jax.Array], scale: float, adapters: bool = True) -> dict[str, jax.Array]:
    """A layer-array dict with every B multiplied by `scale` (alpha / r), or with the
    adapters dropped (`adapters=False`: the base model)."""
    out = {}
    for name, w in arrays.items():
        if name.endswith("_lora_a") or name.endswith("_lora_b"):
            if not adapters:
                continue
            if name.endswith("_lora_b"):
                w = w * jnp.asarray(scale, w.dtype)
        out[name] = w
    return out


def has_adapters(module: nnx.Module) -> bool:
    return any(isinstance(v, LoRAParam) for _, v in nnx.iter_graph(module))


def frozen_filter(module: nnx.Module):
    """The nnx filter of the frozen weights of `module`: every non-adapter `nnx.Param`
    inside a decoder that has adapters (a head on top stays trainable). Nothing is frozen
    in a module without adapters (full fine-tuning)."""
    prefixes = [path for path, node in nnx.iter_graph(module)
                if isinstance(node, nnx.Module) and getattr(node, "lora_scale", 0.0)]

    def frozen(path, var) -> bool:
        return (isinstance(var, nnx.Param) and not isinstance(var, LoRAParam)
                and any(tuple(path[:len(p)]) == tuple(p) for p in prefixes))

    return frozen


def split_trainable(module: nnx.Module, state: nnx.State | None = None) -> tuple[nnx.State, nnx.State]:
    """(trainable, frozen) parts of `module`'s state (or of `state`, a state of it). With
    no adapters the frozen part is empty. `nnx.merge(graphdef, trainable, frozen)` (or
    `join`) gives the module back."""
    state = nnx.state(module) if state is None else state
    frozen = frozen_filter(module)
    return nnx.split_state(state, nnx.Not(frozen), frozen)


def join(trainable: nnx.State, frozen: nnx.State) -> nnx.State:
    """The whole state from its two parts (no copy: the same arrays)."""
    return nnx.merge_state(trainable, frozen)


def sharing_base(decoder) -> nnx.Module:
    """A second decoder on the very arrays of `decoder`'s frozen base (no copy) with its
    own copy of the adapters: the PPO critic's backbone, which starts from the actor's
    base model. The base is never donated or written (`split_trainable`), so the two
    modules read it side by side."""
    graphdef, state = nnx.split(decoder)
    adapters, base = split_trainable(decoder, state)
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, adapters), base)


def merge_into_base(decoder) -> None:
    """Fold the adapters into the base weights in place: W += (alpha / r) A B, then drop
    them; `decoder` becomes a plain decoder computing the same function."""
    layers = decoder.layers
    for target, n_in in TARGETS.items():
        name_a, name_b = adapter_names(target)
        if not hasattr(layers, name_a):
            continue
        base = getattr(layers, target)
        a, b = getattr(layers, name_a)[...], getattr(layers, name_b)[...]
        delta = jax.vmap(lambda a_, b_: jnp.tensordot(a_, b_, axes=1))(a.astype(jnp.float32), b.astype(jnp.float32))
        base[...] = (base[...].astype(jnp.float32) + decoder.lora_scale * delta).astype(base.dtype)
        delattr(layers, name_a)
        delattr(layers, name_b)
    decoder.lora_scale = 0.0
    decoder.lora_dropout = 0.0
