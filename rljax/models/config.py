"""Model configuration: one dataclass for the Llama / Qwen2 / Qwen3 decoder family and
its mixture-of-experts variants (Qwen3-MoE, Mixtral).

`ModelConfig.from_hf_dict` reads a Hugging Face `config.json` (both the transformers 4
form, `rope_theta` + `rope_scaling`, and the transformers 5 form, `rope_parameters`);
`to_hf_dict` writes it back in the form the installed transformers reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp


class UnsupportedModelError(ValueError):
    """A checkpoint whose architecture or options rljax does not implement."""


class ModelConfigError(ValueError):
    """A model config value no model can have (a size <= 0, heads that do not divide);
    the message names the key: `model.hf_config.hidden_size: must be ...`. `key` and
    `message` are its two parts."""

    def __init__(self, prefix: str, key: str, message: str):
        super().__init__(f"{prefix}{key}: {message}")
        self.key, self.message = key, message


class UnknownModelTypeError(ModelConfigError, UnsupportedModelError):
    """A `model_type` rljax does not implement."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (HF `rope_parameters` / `rope_scaling`)."""

    rope_type: str = "default"  # default | linear | llama3
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None


SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class MoeKeys:
    """How a mixture-of-experts family names its options in `config.json`."""

    expert_size_key: str  # each expert's MLP width (Qwen3-MoE: moe_intermediate_size; Mixtral: intermediate_size)
    norm_topk_prob_key: str | None  # None: the top-k weights are always renormalised (Mixtral)


@dataclass(frozen=True)
class Family:
    """What distinguishes one HF model family from another in this decoder."""

    model_type: str
    architecture: str
    # Which HF config keys decide the optional pieces, and their defaults.
    qkv_bias_key: str | None  # None: fixed value below
    qkv_bias_default: bool
    out_bias_follows_qkv: bool  # Llama/Qwen3: o_proj bias = attention_bias; Qwen2: never
    has_mlp_bias_key: bool
    qk_norm: bool
    sliding_window_keys: bool  # Qwen configs carry use_sliding_window
    moe: MoeKeys | None = None  # a mixture-of-experts family: every layer's MLP is routed experts
    sliding_window_is_on_when_set: bool = False  # Mixtral: a non-null sliding_window turns it on


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", "LlamaForCausalLM", "attention_bias", False, True, True, False, False),
    "qwen2": Family("qwen2", "Qwen2ForCausalLM", None, True, False, False, False, True),
    "qwen3": Family("qwen3", "Qwen3ForCausalLM", "attention_bias", False, True, False, True, True),
    "qwen3_moe": Family("qwen3_moe", "Qwen3MoeForCausalLM", "attention_bias", False, True, False, True, True,
                        moe=MoeKeys("moe_intermediate_size", "norm_topk_prob")),
    "mixtral": Family("mixtral", "MixtralForCausalLM", None, False, False, False, False, False,
                      moe=MoeKeys("intermediate_size", None), sliding_window_is_on_when_set=True),
}


def family(model_type: str) -> Family:
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; rljax implements {sorted(FAMILIES)}"
        )
    return FAMILIES[model_type]


# The largest count or size a model config may hold: every index fits in int32.
MAX_SIZE = 2**31 - 1
# config.json keys that are positive whole numbers when present (counts and sizes)
_POSITIVE_INT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "max_position_embeddings", "num_experts",
                      "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                      "original_max_position_embeddings")
_TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
_BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "norm_topk_prob", "use_sliding_window")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_hf_dict(d: dict[str, Any], prefix: str = "") -> None:
    """Raise `ModelConfigError` naming `<prefix><key>` for the first value of a Hugging
    Face style config dict (`model.hf_config`, a `config.json`) that no model can have:
    an unknown model_type, a count or size that is not a whole number in [1, 2^31-1],
    heads that do not divide (kv heads into heads; heads into hidden_size when head_dim
    is not given), a non-positive or non-finite rms_norm_eps / rope theta / rope factor,
    a negative initializer_range or token id, a non-boolean flag, more experts per token
    than experts. Keys that are absent are not checked (their defaults hold)."""
    import math

    def fail(key: str, message: str):
        raise ModelConfigError(prefix, key, message)

    if "model_type" in d and d["model_type"] not in FAMILIES:
        raise UnknownModelTypeError(prefix, "model_type", f"{d['model_type']!r} is not supported; rljax implements "
                                    f"{sorted(FAMILIES)}")
    for key in _POSITIVE_INT_KEYS:
        value = d.get(key)
        if value is None:
            continue
        if not _is_int(value):
            fail(key, f"must be a whole number, got {value!r}")
        if not 1 <= value <= MAX_SIZE:
            fail(key, f"must be in [1, {MAX_SIZE}], got {value}")
    for key in _TOKEN_ID_KEYS:
        value = d.get(key)
        for token in (value if isinstance(value, (list, tuple)) else [value]):
            if token is not None and (not _is_int(token) or token < 0):
                fail(key, f"must be a token id >= 0 (or null), got {value!r}")
    for key in _BOOL_KEYS:
        if key in d and d[key] is not None and not isinstance(d[key], bool):
            fail(key, f"must be true or false, got {d[key]!r}")
    heads, kv = d.get("num_attention_heads"), d.get("num_key_value_heads")
    if heads and kv and heads % kv:
        fail("num_key_value_heads", f"{kv} does not divide num_attention_heads={heads}")
    hidden = d.get("hidden_size")
    if heads and hidden and not d.get("head_dim") and hidden % heads:
        fail("num_attention_heads", f"{heads} does not divide hidden_size={hidden} (and head_dim is not set)")
    experts = d.get("num_experts", d.get("num_local_experts"))
    per_token = d.get("num_experts_per_tok")
    if experts and per_token and per_token > experts:
        fail("num_experts_per_tok", f"{per_token} is more than the {experts} experts")
    rope = {**(d.get("rope_scaling") or {}), **(d.get("rope_parameters") or {})}
    for key, value in (("rms_norm_eps", d.get("rms_norm_eps")), ("rope_theta", d.get("rope_theta")),
                       ("rope_parameters.rope_theta", rope.get("rope_theta")),
                       ("rope_parameters.factor", rope.get("factor"))):
        if value is not None and (not _is_number(value) or not math.isfinite(value) or value <= 0):
            fail(key, f"must be a finite number > 0, got {value!r}")
    init = d.get("initializer_range")
    if init is not None and (not _is_number(init) or not math.isfinite(init) or init < 0):
        fail("initializer_range", f"must be a finite number >= 0, got {init!r}")


@dataclass(frozen=True)
class DTypePolicy:
    """The one place dtypes are decided: parameters are stored in `param_dtype`,
    matmuls run in `compute_dtype`; norms, softmax and logits are always float32."""

    param_dtype: str = "float32"
    compute_dtype: str = "float32"

    @property
    def param(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def compute(self) -> jnp.dtype:
        return jnp.dtype(self.compute_dtype)


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    # Mixture of experts (0 experts: a dense MLP). Each layer routes every token to its
    # `num_experts_per_tok` highest-probability experts (`rljax.models.moe`).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's MLP width
    norm_topk_prob: bool = False  # renormalise the top-k router probabilities to sum to 1

    def __post_init__(self):
        fam = family(self.model_type)
        if (fam.moe is not None) != (self.num_experts > 0):
            raise ValueError(f"{self.model_type}: num_experts={self.num_experts} does not fit the family "
                             f"({'mixture of experts' if fam.moe else 'dense'})")
        if self.is_moe and not (1 <= self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size > 0):
            raise ValueError(f"{self.model_type}: num_experts_per_tok={self.num_experts_per_tok} must be in "
                             f"[1, num_experts={self.num_experts}] and moe_intermediate_size="
                             f"{self.moe_intermediate_size} > 0")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.rope.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope type {self.rope.rope_type!r} is not supported; rljax implements "
                f"{list(SUPPORTED_ROPE_TYPES)}"
            )

    @property
    def family(self) -> Family:
        return family(self.model_type)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        if isinstance(self.eos_token_id, int):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ---- sizes -------------------------------------------------------------------------

    def num_params(self, include_embedding: bool = True, active: bool = False) -> int:
        """Parameter count; `active`: those one token uses (a MoE layer: the router and
        `num_experts_per_tok` experts)."""
        e, h, kv, d, m = (
            self.hidden_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
            self.intermediate_size,
        )
        attn = e * h * d + 2 * e * kv * d + h * d * e
        if self.qkv_bias:
            attn += h * d + 2 * kv * d
        if self.out_bias:
            attn += e
        mlp = 3 * e * m + (2 * m + e if self.mlp_bias else 0)
        if self.is_moe:
            experts = self.num_experts_per_tok if active else self.num_experts
            mlp = e * self.num_experts + experts * 3 * e * self.moe_intermediate_size
        norms = 2 * e + (2 * d if self.qk_norm else 0)
        layers = self.num_hidden_layers * (attn + mlp + norms)
        embed = self.vocab_size * e * (1 if self.tie_word_embeddings else 2)
        return layers + e + (embed if include_embedding else 0)

    def flops_per_token(self, seq_len: int, training: bool = True) -> float:
        """Matmul FLOPs per token: 2N (forward) for the non-embedding weights plus the
        unembedding, plus attention scores and values 2 * 2 * T * h * d per layer
        (causal: half of that). Training counts forward + backward = 3x forward
        (the PaLM / Chinchilla "6N" convention with attention added)."""
        n_matmul = self.num_params(include_embedding=False, active=True) + self.vocab_size * self.hidden_size
        forward = 2 * n_matmul + self.attention_flops_per_token(seq_len, training=False)
        return 3 * forward if training else forward

    def attention_flops_per_token(self, seq_len: int, training: bool = True) -> float:
        """The attention part of `flops_per_token`: scores and values, 2 * 2 * T * h * d
        per layer, halved for causal masking; x3 for training."""
        forward = self.num_hidden_layers * 2 * 2 * seq_len * self.num_attention_heads * self.head_dim / 2
        return 3 * forward if training else forward

    # ---- Hugging Face config.json ------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], prefix: str = "") -> "ModelConfig":
        """`prefix`: what an error puts before the key (`model.hf_config.`, `<path>: `)."""
        check_hf_dict(d, prefix)
        model_type = d.get("model_type")
        fam = family(model_type)
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only 'silu')")
        if fam.sliding_window_keys and d.get("use_sliding_window", False):
            raise UnsupportedModelError(
                f"{model_type}: use_sliding_window=true is not supported; rljax implements full attention"
            )
        if fam.sliding_window_is_on_when_set and d.get("sliding_window") is not None:
            raise UnsupportedModelError(
                f"{model_type}: sliding_window={d['sliding_window']} is not supported; rljax implements full attention"
            )
        heads = d["num_attention_heads"]
        qkv_bias = d.get(fam.qkv_bias_key, fam.qkv_bias_default) if fam.qkv_bias_key else fam.qkv_bias_default
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope=_rope_from_hf(d),
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            qkv_bias=bool(qkv_bias),
            out_bias=bool(qkv_bias) if fam.out_bias_follows_qkv else False,
            mlp_bias=bool(d.get("mlp_bias", False)) if fam.has_mlp_bias_key else False,
            qk_norm=fam.qk_norm,
            initializer_range=d.get("initializer_range", 0.02),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=tuple(d["eos_token_id"]) if isinstance(d.get("eos_token_id"), list) else d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
            **(_moe_from_hf(d, fam) if fam.moe else {}),
        )

    def to_hf_dict(self, dtype: str | None = None) -> dict[str, Any]:
        fam = self.family
        d: dict[str, Any] = {
            "architectures": [fam.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "rope_parameters": _rope_to_hf(self.rope),
            "attention_dropout": 0.0,
            "use_cache": True,
        }
        if fam.qkv_bias_key:
            d[fam.qkv_bias_key] = self.qkv_bias
        if fam.has_mlp_bias_key:
            d["mlp_bias"] = self.mlp_bias
        if fam.sliding_window_keys:
            d["use_sliding_window"] = False
            d["sliding_window"] = None
        if fam.sliding_window_is_on_when_set:
            d["sliding_window"] = None
        if fam.moe:
            d["num_local_experts"] = self.num_experts  # both HF configs store this name
            d["num_experts_per_tok"] = self.num_experts_per_tok
            d[fam.moe.expert_size_key] = self.moe_intermediate_size
            if fam.moe.norm_topk_prob_key:
                d[fam.moe.norm_topk_prob_key] = self.norm_topk_prob
            d["output_router_logits"] = False
        if dtype is not None:
            d["dtype"] = dtype
        return d


def _moe_from_hf(d: dict[str, Any], fam: Family) -> dict[str, Any]:
    """The MoE fields of `ModelConfig` from a Qwen3-MoE or Mixtral `config.json`."""
    model_type = fam.model_type
    step, dense_layers = d.get("decoder_sparse_step", 1), d.get("mlp_only_layers") or []
    if step != 1 or dense_layers:
        raise UnsupportedModelError(
            f"{model_type}: decoder_sparse_step={step}, mlp_only_layers={dense_layers}: dense MLP layers among "
            "MoE layers are not supported (rljax needs every layer to be MoE)")
    if d.get("router_jitter_noise", 0.0):
        raise UnsupportedModelError(f"{model_type}: router_jitter_noise={d['router_jitter_noise']} is not supported")
    experts = d.get("num_experts", d.get("num_local_experts"))
    norm = d.get(fam.moe.norm_topk_prob_key, False) if fam.moe.norm_topk_prob_key else True
    return dict(num_experts=int(experts), num_experts_per_tok=int(d["num_experts_per_tok"]),
                moe_intermediate_size=int(d[fam.moe.expert_size_key]), norm_topk_prob=bool(norm))


def _rope_from_hf(d: dict[str, Any]) -> RopeConfig:
    # transformers 5: everything in `rope_parameters`; transformers 4: `rope_theta` at the
    # top level and an optional `rope_scaling` dict (with `type` or `rope_type`).
    params = dict(d.get("rope_parameters") or {})
    scaling = d.get("rope_scaling") or {}
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope type {rope_type!r} is not supported; rljax implements {list(SUPPORTED_ROPE_TYPES)}"
        )
    return RopeConfig(
        rope_type=rope_type,
        theta=float(theta),
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=merged.get("original_max_position_embeddings"),
    )


def _rope_to_hf(rope: RopeConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": rope.rope_type, "rope_theta": rope.theta}
    if rope.rope_type == "linear":
        out["factor"] = rope.factor
    elif rope.rope_type == "llama3":
        out.update(
            factor=rope.factor,
            low_freq_factor=rope.low_freq_factor,
            high_freq_factor=rope.high_freq_factor,
            original_max_position_embeddings=rope.original_max_position_embeddings,
        )
    return out
