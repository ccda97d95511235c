"""The gated MLP activation shared by the dense MLP and the experts."""

from __future__ import annotations

import jax


def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202):
    silu(x W_gate) * (x W_up), given the two projections."""
    return jax.nn.silu(gate) * up
