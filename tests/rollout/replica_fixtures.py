"""A tiny policy for the replica tests: 8 heads and 8 kv heads (every tp in 1, 2, 4, 8
splits them), each parameter numbered 0, 1, 2, ... (distinct values, so a moved or
permuted block shows; no random init to compile)."""

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models import ModelConfig, abstract_model

CONFIG = ModelConfig(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8, head_dim=8)


def numbered_params(config: ModelConfig = CONFIG) -> nnx.State:
    abstract = nnx.state(abstract_model(config))
    return jax.tree.map(lambda s: jnp.arange(s.size, dtype=s.dtype).reshape(s.shape), abstract)
