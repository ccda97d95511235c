"""One NNX decoder for the Llama, Qwen2 and Qwen3 families and the Qwen3-MoE / Mixtral
mixtures of experts.

Layout: token embedding -> `num_hidden_layers` pre-norm blocks (RMSNorm, grouped-query
attention with RoPE, RMSNorm, SwiGLU MLP or routed SwiGLU experts, `rljax.models.moe`)
-> final RMSNorm -> unembedding (tied to the
embedding for Qwen2-style checkpoints). Per-layer parameters are stacked on a leading
`layers` axis and the blocks run under one `lax.scan`, so compile time does not grow
with depth.

The block is written as two pure functions of a dict of one layer's arrays
(`attention_inputs`, `attention_output_and_mlp`) so that the sampler can run the very
same math with a paged KV cache in place of full attention.

Shape letters in the comments: B batch rows, T positions, E hidden size, N query heads,
K key/value heads, D head dim, F MLP width, V vocabulary, X experts, k experts per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.algos.log_probs import log_probs_from_hidden, logits_chunk_bytes, positions_per_chunk
from rljax.models.attention import branch_mask, get_attention, segment_positions, target_backend
from rljax.models.config import DTypePolicy, ModelConfig, RopeConfig
from rljax.models.lora import Dropout, add_delta, scaled
from rljax.models.mlp import swiglu
from rljax.models.moe import Routing, moe_mlp
from rljax.parallel import activation_block, constrain, gather_weight

# Logical axes of the residual stream (batch over data x fsdp; see rljax.parallel).
ACTIVATION = ("batch", "length", "act_embed")

# ---- parameter specs ------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """One stacked per-layer parameter: its shape (without the layers axis), the logical
    axis names (with it), how it is initialised, and whether the config has it."""

    shape: Callable[[ModelConfig], tuple[int, ...]]
    axes: tuple[str, ...]
    init: str  # normal | zeros | ones
    present: Callable[[ModelConfig], bool] = lambda c: True


LAYER_PARAMS: dict[str, ParamSpec] = {
    "attn_norm": ParamSpec(lambda c: (c.hidden_size,), ("layers", "embed"), "ones"),
    "q_proj": ParamSpec(
        lambda c: (c.hidden_size, c.num_attention_heads, c.head_dim), ("layers", "embed", "heads", "head_dim"), "normal"
    ),
    "k_proj": ParamSpec(
        lambda c: (c.hidden_size, c.num_key_value_heads, c.head_dim), ("layers", "embed", "kv_heads", "head_dim"), "normal"
    ),
    "v_proj": ParamSpec(
        lambda c: (c.hidden_size, c.num_key_value_heads, c.head_dim), ("layers", "embed", "kv_heads", "head_dim"), "normal"
    ),
    "o_proj": ParamSpec(
        lambda c: (c.num_attention_heads, c.head_dim, c.hidden_size), ("layers", "heads", "head_dim", "embed"), "normal"
    ),
    "q_bias": ParamSpec(
        lambda c: (c.num_attention_heads, c.head_dim), ("layers", "heads", "head_dim"), "zeros", lambda c: c.qkv_bias
    ),
    "k_bias": ParamSpec(
        lambda c: (c.num_key_value_heads, c.head_dim), ("layers", "kv_heads", "head_dim"), "zeros", lambda c: c.qkv_bias
    ),
    "v_bias": ParamSpec(
        lambda c: (c.num_key_value_heads, c.head_dim), ("layers", "kv_heads", "head_dim"), "zeros", lambda c: c.qkv_bias
    ),
    "o_bias": ParamSpec(lambda c: (c.hidden_size,), ("layers", "embed"), "zeros", lambda c: c.out_bias),
    "q_norm": ParamSpec(lambda c: (c.head_dim,), ("layers", "head_dim"), "ones", lambda c: c.qk_norm),
    "k_norm": ParamSpec(lambda c: (c.head_dim,), ("layers", "head_dim"), "ones", lambda c: c.qk_norm),
    "mlp_norm": ParamSpec(lambda c: (c.hidden_size,), ("layers", "embed"), "ones"),
    "gate_proj": ParamSpec(lambda c: (c.hidden_size, c.intermediate_size), ("layers", "embed", "mlp"), "normal",
                           lambda c: not c.is_moe),
    "up_proj": ParamSpec(lambda c: (c.hidden_size, c.intermediate_size), ("layers", "embed", "mlp"), "normal",
                         lambda c: not c.is_moe),
    "down_proj": ParamSpec(lambda c: (c.intermediate_size, c.hidden_size), ("layers", "mlp", "embed"), "normal",
                           lambda c: not c.is_moe),
    "gate_bias": ParamSpec(lambda c: (c.intermediate_size,), ("layers", "mlp"), "zeros", lambda c: c.mlp_bias),
    "up_bias": ParamSpec(lambda c: (c.intermediate_size,), ("layers", "mlp"), "zeros", lambda c: c.mlp_bias),
    "down_bias": ParamSpec(lambda c: (c.hidden_size,), ("layers", "embed"), "zeros", lambda c: c.mlp_bias),
    # mixture of experts (`rljax.models.moe`): the router and the experts stacked on `expert`
    "router": ParamSpec(lambda c: (c.hidden_size, c.num_experts), ("layers", "embed", "router_experts"), "normal",
                        lambda c: c.is_moe),
    "expert_gate": ParamSpec(lambda c: (c.num_experts, c.hidden_size, c.moe_intermediate_size),
                             ("layers", "expert", "expert_embed", "expert_mlp"), "normal", lambda c: c.is_moe),
    "expert_up": ParamSpec(lambda c: (c.num_experts, c.hidden_size, c.moe_intermediate_size),
                           ("layers", "expert", "expert_embed", "expert_mlp"), "normal", lambda c: c.is_moe),
    "expert_down": ParamSpec(lambda c: (c.num_experts, c.moe_intermediate_size, c.hidden_size),
                             ("layers", "expert", "expert_mlp", "expert_embed"), "normal", lambda c: c.is_moe),
}


def _init(kind: str, key, shape, dtype, std: float) -> jax.Array:
    if kind == "normal":
        return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    if kind == "ones":
        return jnp.ones(shape, dtype)
    return jnp.zeros(shape, dtype)


# ---- rotary embeddings ----------------------------------------------------------------


def _default_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / (np.float32(rope.theta) ** exponents)).astype(np.float32)


def _linear_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    return _default_inv_freq(rope, head_dim) / np.float32(rope.factor)


def _llama3_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """Llama 3.1 frequency scaling: wavelengths longer than original_context/low_freq_factor
    are divided by `factor`, shorter than original_context/high_freq_factor kept, and the
    band in between interpolated smoothly (Meta's Llama 3.1 reference code)."""
    inv_freq = _default_inv_freq(rope, head_dim)
    old_ctx = np.float32(rope.original_max_position_embeddings)
    low_wavelen = old_ctx / np.float32(rope.low_freq_factor)
    high_wavelen = old_ctx / np.float32(rope.high_freq_factor)
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(rope.factor), inv_freq)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / np.float32(rope.factor) + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


ROPE_INV_FREQ: dict[str, Callable[[RopeConfig, int], np.ndarray]] = {
    "default": _default_inv_freq,
    "linear": _linear_inv_freq,
    "llama3": _llama3_inv_freq,
}


def rope_cos_sin(positions: jax.Array, config: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables `[..., head_dim]` (float32) for integer `positions` `[...]`."""
    inv_freq = jnp.asarray(ROPE_INV_FREQ[config.rope.rope_type](config.rope, config.head_dim))  # [D/2]
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # [..., D]
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x * cos + rotate_half(x) * sin on `[B, T, heads, D]` with tables `[B, T, D]`."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # [B, T, N, D]
    cos = cos[:, :, None, :].astype(x.dtype)  # [B, T, 1, D]
    sin = sin[:, :, None, :].astype(x.dtype)  # [B, T, 1, D]
    return x * cos + rotated * sin


# ---- the block, as pure functions ------------------------------------------------------


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """weight * x / sqrt(mean(x^2) + eps), the statistics in float32 (as HF)."""
    x32 = x.astype(jnp.float32)  # [..., E]
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)  # [..., E]
    return weight * normed.astype(x.dtype)


def attention_inputs(p: dict, x: jax.Array, cos: jax.Array, sin: jax.Array, config: ModelConfig,
                     drop: Dropout | None = None):
    """Pre-norm, q/k/v projections (+bias), Qwen3 q/k norm, RoPE. Returns q `[B,T,N,D]`,
    k and v `[B,T,K,D]`. `drop`: LoRA dropout of a training forward (`rljax.models.lora`)."""
    h = rms_norm(x, p["attn_norm"], config.rms_norm_eps)  # [B, T, E]
    q = add_delta(p, "q_proj", h, jnp.einsum("bte,ehd->bthd", h, p["q_proj"]), drop)  # [B, T, N, D]
    k = add_delta(p, "k_proj", h, jnp.einsum("bte,ehd->bthd", h, p["k_proj"]), drop)  # [B, T, K, D]
    v = add_delta(p, "v_proj", h, jnp.einsum("bte,ehd->bthd", h, p["v_proj"]), drop)  # [B, T, K, D]
    if config.qkv_bias:
        q, k, v = q + p["q_bias"], k + p["k_bias"], v + p["v_bias"]
    if config.qk_norm:
        q = rms_norm(q, p["q_norm"], config.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], config.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    return (constrain(q, ("batch", "length", "heads", "head_dim")),
            constrain(k, ("batch", "length", "kv_heads", "head_dim")),
            constrain(v, ("batch", "length", "kv_heads", "head_dim")))


def attention_output_and_mlp(p: dict, x: jax.Array, attn: jax.Array, config: ModelConfig,
                             drop: Dropout | None = None,
                             valid: jax.Array | None = None,
                             replay: jax.Array | None = None) -> tuple[jax.Array, Routing | None]:
    """Output projection and residual, then the SwiGLU MLP (or the MoE MLP) and its
    residual: `x` `[B, T, E]` and `attn` `[B, T, N, D]` -> (`[B, T, E]`, the MoE layer's
    `Routing` with statistics over `valid` `[B, T]` tokens, or None for a dense layer).
    `drop`: as `attention_inputs`. `replay` `[B, T, k]`: this layer's recorded experts
    (routing replay, `rljax.models.moe.replay_routing`; -1: the router's own top-k)."""
    out = add_delta(p, "o_proj", attn, jnp.einsum("bthd,hde->bte", attn, p["o_proj"]), drop)  # [B, T, E]
    if config.out_bias:
        out = out + p["o_bias"]
    x = x + out  # [B, T, E]
    h = rms_norm(x, p["mlp_norm"], config.rms_norm_eps)  # [B, T, E]
    if config.is_moe:
        down, routing = moe_mlp(p, h, config, valid, replay)  # [B, T, E]
        return constrain(x + down, ACTIVATION), routing
    gate = add_delta(p, "gate_proj", h, h @ p["gate_proj"], drop)  # [B, T, F]
    up = add_delta(p, "up_proj", h, h @ p["up_proj"], drop)  # [B, T, F]
    if config.mlp_bias:
        gate, up = gate + p["gate_bias"], up + p["up_bias"]
    act = swiglu(gate, up)  # [B, T, F]
    down = add_delta(p, "down_proj", act, act @ p["down_proj"], drop)  # [B, T, E]
    if config.mlp_bias:
        down = down + p["down_bias"]
    return constrain(x + down, ACTIVATION), None


REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def cast_tree(tree, dtype):
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


# ---- the module -----------------------------------------------------------------------


class DecoderLayers(nnx.Module):
    """All blocks' parameters, each stacked on a leading `layers` axis."""

    def __init__(self, config: ModelConfig, policy: DTypePolicy, rngs: nnx.Rngs):
        for name, spec in LAYER_PARAMS.items():
            if spec.present(config):
                shape = (config.num_hidden_layers, *spec.shape(config))
                value = _init(spec.init, rngs.params(), shape, policy.param, config.initializer_range)
                setattr(self, name, nnx.Param(value, logical_axes=spec.axes))

    def variables(self) -> dict[str, nnx.Variable]:
        """name -> variable: the base weights, then LoRA adapters (`rljax.models.lora`) if any."""
        return {name: v for name, v in vars(self).items() if isinstance(v, nnx.Variable)}

    def arrays(self) -> dict[str, jax.Array]:
        return {name: v[...] for name, v in self.variables().items()}

    def axes(self) -> dict[str, tuple[str, ...]]:
        """name -> logical axes of one layer's slice (without `layers`)."""
        return {name: tuple(v.get_metadata()["logical_axes"][1:]) for name, v in self.variables().items()}


class Decoder(nnx.Module):
    """Causal LM: `model(input_ids, attention_mask=None, positions=None, segment_ids=None)`
    returns float32 logits `[B, T, vocab]`.

    `attention_mask` is 0/1 `[B, T]` (right or left padding). `segment_ids` `[B, T]`
    (0 = padding) marks packed rows; tokens attend only within their segment. Positions
    default to 0, 1, ... restarting at each segment's (or the unpadded text's) start.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        policy: DTypePolicy = DTypePolicy(),
        remat: str = "none",
        attention: str = "xla",
        rngs: nnx.Rngs,
    ):
        if remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat policy {remat!r}; choose from {sorted(REMAT_POLICIES)}")
        get_attention(attention)
        self.config = config
        self.policy = policy
        self.remat = remat
        self.attention = attention
        self.lora_scale = 0.0  # alpha / r once `rljax.models.lora.add_adapters` gave it adapters
        self.lora_dropout = 0.0  # LoRA dropout's p (`add_adapters`)
        self.lora_dropout_key = None  # set in the train step only (`rljax.models.lora.set_dropout_key`)
        std = config.initializer_range
        self.embed = nnx.Param(
            _init("normal", rngs.params(), (config.vocab_size, config.hidden_size), policy.param, std),
            logical_axes=("vocab", "embed"),
        )
        self.layers = DecoderLayers(config, policy, rngs)
        self.final_norm = nnx.Param(jnp.ones((config.hidden_size,), policy.param), logical_axes=("embed",))
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Param(
                _init("normal", rngs.params(), (config.hidden_size, config.vocab_size), policy.param, std),
                logical_axes=("embed", "vocab"),
            )

    # -- pieces the sampler and the chunked-log_prob losses reuse --

    def embed_tokens(self, input_ids: jax.Array) -> jax.Array:
        """`[B, T]` ids -> `[B, T, E]` embeddings in the compute dtype."""
        table = gather_weight(self.embed[...], ("vocab", "embed"))  # [V, E]
        return constrain(table[input_ids].astype(self.policy.compute), ACTIVATION)

    def unembedding(self) -> jax.Array:
        """The `[hidden, vocab]` output matrix, in the compute dtype."""
        w = self.embed[...].T if self.config.tie_word_embeddings else self.lm_head[...]  # [E, V]
        return gather_weight(w, ("embed", "vocab")).astype(self.policy.compute)

    def layer_arrays(self, adapters: bool = True) -> dict[str, jax.Array]:
        """Stacked per-layer arrays, cast to the compute dtype; LoRA B matrices scaled by
        alpha / r, or the adapters left out (`adapters=False`: the base model). A MoE
        router stays float32 (at least): routing decisions are not made in bf16."""
        arrays = scaled(self.layers.arrays(), self.lora_scale, adapters)
        out = cast_tree(arrays, self.policy.compute)
        if "router" in arrays:
            out["router"] = arrays["router"].astype(jnp.promote_types(arrays["router"].dtype, jnp.float32))
        return out

    def final_hidden(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.final_norm[...].astype(self.policy.compute), self.config.rms_norm_eps)

    # -- forward --

    def hidden_states(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        adapters: bool = True,
        *,
        expert_ids: jax.Array | None = None,
        branch_ids: jax.Array | None = None,
    ) -> jax.Array:
        """Final-norm hidden states `[B, T, hidden]` in the compute dtype; with
        `adapters=False` those of the base model (LoRA adapters off). LoRA dropout acts
        only when the train step set `lora_dropout_key` (a training forward).
        `expert_ids` `[B, T, L, k]` (MoE only): routing replay; `branch_ids`: shared
        prefixes; see `hidden_states_and_routing`."""
        return self.hidden_states_and_routing(input_ids, attention_mask, positions, segment_ids, adapters,
                                              expert_ids=expert_ids, branch_ids=branch_ids)[0]

    def hidden_states_and_routing(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        adapters: bool = True,
        *,
        expert_ids: jax.Array | None = None,
        branch_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, Routing | None]:
        """`hidden_states` and, for a MoE model, every layer's routing: `Routing` with
        experts `[B, T, L, k]`, counts and prob_sum `[L, X]` over the non-padding tokens
        (None for a dense model). `expert_ids` `[B, T, L, k]` int32 replays recorded
        routing (the sampler's, `SamplerConfig.record_routing`): token t of layer l uses
        experts `expert_ids[b, t, l]` instead of its top-k wherever they are >= 0
        (`rljax.models.moe.replay_routing`); the reported experts are the ones used.
        `branch_ids` `[B, T]` (with `segment_ids` and `positions`): segments that share a
        prefix among branches (`rljax.models.attention.branch_mask`); they run the xla
        kernel, the one that takes any mask."""
        config = self.config
        if expert_ids is not None and not config.is_moe:
            raise ValueError("expert_ids: routing replay needs a mixture-of-experts model; this one is dense")
        if segment_ids is None:
            segment_ids = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
        segment_ids = segment_ids.astype(jnp.int32)  # [B, T]
        if positions is None:
            positions = segment_positions(segment_ids)  # [B, T]
        cos, sin = rope_cos_sin(positions, config)  # [B, T, D] each
        attend = get_attention(self.attention)
        visible = segment_ids  # what attention takes: segment ids, or a mask
        if branch_ids is not None:
            attend, visible = get_attention("xla"), branch_mask(segment_ids, branch_ids)
        axes = self.layers.axes()

        key = self.lora_dropout_key if adapters and self.lora_dropout else None
        layer_keys = None if key is None else jax.random.split(key, config.num_hidden_layers)  # [L]

        def block(x, xs):
            p, layer_key, replay = xs  # replay: this layer's recorded experts [B, T, k] or None
            drop = None if layer_key is None else Dropout(layer_key, self.lora_dropout)
            # FSDP: gather this layer's weights right before use; pin the residual's layout
            p = {name: gather_weight(w, axes[name]) for name, w in p.items()}
            x = constrain(x, ACTIVATION)  # [B, T, E]
            q, k, v = attention_inputs(p, x, cos, sin, config, drop)  # [B, T, N, D], [B, T, K, D] x 2
            return attention_output_and_mlp(p, x, attend(q, k, v, visible), config, drop, segment_ids > 0,
                                            replay)

        policy = REMAT_POLICIES[self.remat]
        if self.remat != "none":
            block = jax.checkpoint(block, policy=policy, prevent_cse=False)
        replay = None if expert_ids is None else jnp.moveaxis(expert_ids.astype(jnp.int32), 2, 0)  # [L, B, T, k]
        xs = (self.layer_arrays(adapters), layer_keys, replay)
        x, routing = jax.lax.scan(block, self.embed_tokens(input_ids), xs)  # [B, T, E]; per layer [L, ...]
        if routing is not None:
            routing = routing._replace(experts=jnp.moveaxis(routing.experts, 0, 2))  # [B, T, L, k]
        return self.final_hidden(x), routing

    def logits(self, hidden: jax.Array) -> jax.Array:
        """`[B, T, E]` hidden states -> `[B, T, V]` float32 logits."""
        return jnp.einsum("bte,ev->btv", hidden, self.unembedding(), preferred_element_type=jnp.float32)

    def token_log_probs(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        temperature: float = 1.0,
        entropy: bool = False,
        adapters: bool = True,
        expert_ids: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """log p(input_ids[t] | input_ids[< t]) at `temperature`, aligned with `input_ids`
        (`[B, T]` float32, 0 at t = 0), and with `entropy` also the `[B, T]` entropy of the
        distribution each token was drawn from.

        The one way from a decoder to token log-probs: the SFT / DPO objectives, the RL
        trainer's old / reference forwards and validation perplexity all read them here.
        The logits are computed chunk by chunk over positions (`hidden_log_probs`), never
        as one `[B, T, V]` array.
        `adapters=False`: the base model's (the LoRA reference policy). `expert_ids`
        `[B, T, L, k]`: routing replay (`hidden_states_and_routing`)."""
        hidden = self.hidden_states(input_ids, attention_mask, positions, segment_ids, adapters,
                                    expert_ids=expert_ids)  # [B, T, E]
        return self.hidden_log_probs(hidden, input_ids, temperature=temperature, entropy=entropy)

    def hidden_log_probs(self, hidden: jax.Array, input_ids: jax.Array, *, temperature: float = 1.0,
                         entropy: bool = False, segment_ids: jax.Array | None = None
                         ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """`token_log_probs` from final hidden states `[B, T, E]` (a caller that also needs
        the hidden states or the routing, e.g. the actor's objective). The chunk: as many
        positions (at most 256) as keep a device's float32 logits within
        `rljax.algos.log_probs.logits_chunk_bytes` of the platform traced for
        (`target_backend`), a device's block of rows and vocabulary read from the active
        mesh (`positions_per_chunk`). `segment_ids`: packed rows, 0 at each sequence's
        first token (`log_probs_from_hidden`)."""
        unembed = self.unembedding()  # [E, V]
        rows, length, vocab = activation_block((*input_ids.shape, unembed.shape[-1]), ("batch", "length", "vocab"))
        chunk = positions_per_chunk(length, rows, vocab, logits_chunk_bytes(target_backend()))
        return log_probs_from_hidden(hidden, unembed, input_ids, temperature=temperature, chunk_size=chunk,
                                     compute_entropy=entropy, segment_ids=segment_ids)

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
    ) -> jax.Array:
        return self.logits(self.hidden_states(input_ids, attention_mask, positions, segment_ids))


def init_model(
    config: ModelConfig,
    *,
    seed: int = 0,
    policy: DTypePolicy = DTypePolicy(),
    remat: str = "none",
    attention: str = "xla",
) -> Decoder:
    """A randomly initialised decoder (normal(0, initializer_range) weights, unit norms)."""
    return Decoder(config, policy=policy, remat=remat, attention=attention, rngs=nnx.Rngs(seed))


def abstract_model(
    config: ModelConfig, *, policy: DTypePolicy = DTypePolicy(), remat: str = "none", attention: str = "xla"
) -> Decoder:
    """The decoder with `ShapeDtypeStruct` leaves: shapes and metadata, no memory."""
    return nnx.eval_shape(lambda: init_model(config, policy=policy, remat=remat, attention=attention))
