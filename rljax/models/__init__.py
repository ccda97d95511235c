"""The decoder (Llama / Qwen2 / Qwen3) and its Hugging Face I/O."""

from rljax.models.config import DTypePolicy, ModelConfig, RopeConfig, UnsupportedModelError
from rljax.models.hf import (
    CheckpointMismatchError,
    load_hf,
    load_hf_reward_model,
    read_config,
    save_hf,
    weight_map,
)
from rljax.models.transformer import Decoder, abstract_model, init_model

__all__ = [
    "CheckpointMismatchError",
    "DTypePolicy",
    "Decoder",
    "ModelConfig",
    "RopeConfig",
    "UnsupportedModelError",
    "abstract_model",
    "init_model",
    "load_hf",
    "load_hf_reward_model",
    "read_config",
    "save_hf",
    "weight_map",
]
