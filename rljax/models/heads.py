"""Scalar heads on the decoder: a reward model (one score per sequence) and a critic
(one value per token). Both read the final-norm hidden states of the same `Decoder`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rljax.models.transformer import Decoder


def last_token_index(attention_mask: jax.Array) -> jax.Array:
    """Index of each row's last real token (right padding): `[B, T]` -> `[B]`."""
    t = attention_mask.shape[1]
    positions = jnp.arange(t)[None, :]
    return jnp.max(jnp.where(attention_mask > 0, positions, 0), axis=1)


class ScalarHeadModel(nnx.Module):
    """Decoder + a linear `score` head `[hidden] -> 1` (HF's `score.weight` of
    `*ForSequenceClassification` with `num_labels=1`, without bias)."""

    def __init__(self, backbone: Decoder, *, rngs: nnx.Rngs):
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        init = backbone.config.initializer_range * jax.random.normal(rngs.params(), (hidden,), jnp.float32)
        self.score = nnx.Param(init.astype(backbone.policy.param), logical_axes=("embed",))

    def token_values(self, input_ids, attention_mask=None, positions=None, segment_ids=None) -> jax.Array:
        """One float32 scalar per token `[B, T]` (the critic's V(s_t))."""
        hidden = self.backbone.hidden_states(input_ids, attention_mask, positions, segment_ids)
        return jnp.einsum("bte,e->bt", hidden, self.score[...].astype(hidden.dtype),
                          preferred_element_type=jnp.float32)

    def __call__(self, input_ids, attention_mask) -> jax.Array:
        """One float32 score per sequence `[B]`, read at its last real token."""
        values = self.token_values(input_ids, attention_mask)
        return jnp.take_along_axis(values, last_token_index(attention_mask)[:, None], axis=1)[:, 0]
