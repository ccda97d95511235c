"""The gated MLP activation shared by the dense MLP and the experts."""

from __future__ import annotations

import functools

import jax


@functools.partial(jax.checkpoint, prevent_cse=False)
def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202):
    silu(x W_gate) * (x W_up), given the two projections.

    The backward keeps only `gate` and `up` and recomputes the rest (`jax.checkpoint`):
    elementwise work, where autodiff would otherwise keep sigmoid(gate), silu(gate) and
    their products, each as large as `gate`, for every layer."""
    return jax.nn.silu(gate) * up
