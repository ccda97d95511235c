"""LoRA adapters in the Hugging Face PEFT folder format: `adapter_config.json` and
`adapter_model.safetensors`, the files `peft.PeftModel.from_pretrained` reads.

Tensor names follow the base model's HF names (`rljax.models.hf._HF_LAYER_NAMES`, the
one weight-map table), e.g. for layer i's q_proj

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in_features]
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out_features, r]

A torch Linear computes x W^T, so PEFT's A is `[r, in]` and B `[out, r]` with the delta
(lora_alpha / r) B A; rljax's A `[*in, r]` and B `[r, *out]` are their transposes with
the in / out dimensions flattened in the same (row-major) order as the base weight's
HF layout. PEFT options this decoder does not implement (DoRA, rsLoRA, per-module rank or
alpha patterns, biases, modules_to_save) are refused when reading.

Writing works on many processes as `rljax.models.hf.save_hf` does: every process gathers
the adapters, process 0 writes, all return once the folder is complete.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np

from rljax.distributed import is_coordinator, sync
from rljax.hostsync import fetch
from rljax.models.hf import _HF_LAYER_NAMES, readable_by_all
from rljax.models.lora import TARGETS, LoRAConfig, adapter_names

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."

# PEFT config keys whose non-default value changes the function; (key, the value we implement)
_REQUIRED = (("use_dora", False), ("use_rslora", False), ("bias", "none"), ("fan_in_fan_out", False),
             ("rank_pattern", {}), ("alpha_pattern", {}), ("modules_to_save", None), ("layers_to_transform", None))


def peft_key(target: str, layer: int, which: str) -> str:
    """`which` is "A" or "B"."""
    module = _HF_LAYER_NAMES[target].removesuffix(".weight")
    return f"{PREFIX}model.layers.{layer}.{module}.lora_{which}.weight"


def present_targets(decoder) -> list[str]:
    return [t for t in TARGETS if hasattr(decoder.layers, adapter_names(t)[0])]


def save_peft_adapters(decoder, out: str, config: LoRAConfig, base_model: str = "", dtype: str | None = None) -> None:
    """Write `decoder`'s adapters to the PEFT folder `out` (created if needed). Every
    process of a run calls it; process 0 writes (module docstring)."""
    targets = present_targets(decoder)
    tensors = {}
    for target in targets:  # a collective per sharded adapter: every process takes part
        name_a, name_b = adapter_names(target)
        a = fetch(getattr(decoder.layers, name_a)[...])  # [L, *in, r]
        b = fetch(getattr(decoder.layers, name_b)[...])  # [L, r, *out]
        for i in range(a.shape[0]):
            tensors[peft_key(target, i, "A")] = a[i].reshape(-1, a.shape[-1]).T  # [r, in]
            tensors[peft_key(target, i, "B")] = b[i].reshape(b.shape[1], -1).T  # [out, r]
    if is_coordinator():
        _write_adapters(out, tensors, targets, config, base_model, dtype)
    sync("rljax.models.lora_peft.save_peft_adapters")


def _write_adapters(out: str, tensors: dict, targets: list[str], config: LoRAConfig, base_model: str,
                    dtype: str | None) -> None:
    """`save_peft_adapters`' files, on process 0."""
    from safetensors.numpy import save_file

    os.makedirs(out, exist_ok=True)
    np_dtype = jnp.dtype(dtype) if dtype else None
    tensors = {k: np.ascontiguousarray(v.astype(np_dtype) if np_dtype else v) for k, v in tensors.items()}
    save_file(tensors, os.path.join(out, WEIGHTS_FILE), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model or None,
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }
    with open(os.path.join(out, CONFIG_FILE), "w") as f:
        json.dump(adapter_config, f, indent=2)
    readable_by_all(out)


def read_peft_config(path: str) -> dict:
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"model.lora.path: {path} has no {CONFIG_FILE} (not a PEFT adapter folder)")
    with open(file) as f:
        raw = json.load(f)
    if raw.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{file}: peft_type {raw.get('peft_type')!r}; only LORA adapters can be loaded")
    for key, wanted in _REQUIRED:
        value = raw.get(key, wanted)
        if value != wanted and not (wanted in ({}, None) and not value):
            raise ValueError(f"{file}: {key}={value!r} is not supported (rljax implements {key}={wanted!r})")
    return raw


def load_peft_adapters(decoder, path: str) -> None:
    """Set `decoder`'s adapters (already added with the run's `model.lora`) from the PEFT
    folder `path`; its r, lora_alpha and target modules must be the run's."""
    from safetensors.numpy import load_file

    raw = read_peft_config(path)
    targets = present_targets(decoder)
    theirs = raw.get("target_modules") or []
    if isinstance(theirs, str) or sorted(theirs) != sorted(targets):
        raise ValueError(f"model.lora.target_modules={targets}, but {path} has adapters on {theirs}")
    rank = getattr(decoder.layers, adapter_names(targets[0])[0]).shape[-1]
    if raw.get("r") != rank or float(raw.get("lora_alpha", 8)) / rank != decoder.lora_scale:
        raise ValueError(f"model.lora: rank={rank}, alpha={decoder.lora_scale * rank:g}, but {path} has "
                         f"r={raw.get('r')}, lora_alpha={raw.get('lora_alpha')}")
    tensors = load_file(os.path.join(path, WEIGHTS_FILE))
    used = set()
    for target in targets:
        for which, name in zip("AB", adapter_names(target)):
            var = getattr(decoder.layers, name)
            per_layer = []
            for i in range(var.shape[0]):
                key = peft_key(target, i, which)
                if key not in tensors:
                    raise ValueError(f"{path}/{WEIGHTS_FILE}: no tensor {key}")
                used.add(key)
                t = tensors[key].T  # A: [in, r]; B: [r, out]
                per_layer.append(t.reshape(var.shape[1:]))
            var[...] = jnp.asarray(np.stack(per_layer), var.dtype)
    extra = sorted(set(tensors) - used)
    if extra:
        raise ValueError(f"{path}/{WEIGHTS_FILE}: tensors this model has no place for, e.g. {extra[0]}")
