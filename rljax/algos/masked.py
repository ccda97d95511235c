"""Masked statistics over [B, T] arrays: sum, mean, variance, whitening.

Semantics follow verl's `verl.utils.torch_functional` (`masked_sum`, `masked_mean`,
`masked_var`, `masked_whiten`); every function is a pure `jnp` function of static shape,
so it works under `jax.jit` and never boolean-indexes. Masks may be bool, int or float
(a float mask acts as a per-element weight).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

Axis = int | tuple[int, ...] | None


def as_float(x: ArrayLike) -> jax.Array:
    """`x` as a jax array of a floating dtype (float32 unless it is already floating)."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


def mask_like(mask: ArrayLike, values: jax.Array) -> jax.Array:
    """`mask` converted to the floating dtype of `values`."""
    return jnp.asarray(mask).astype(values.dtype)


def masked_sum(values: ArrayLike, mask: ArrayLike, axis: Axis = None) -> jax.Array:
    """sum(values * mask) over `axis`; masked-out entries never contribute (even NaN/inf)."""
    values = as_float(values)
    mask = mask_like(mask, values)
    return jnp.sum(jnp.where(mask != 0, values * mask, 0.0), axis=axis)


def masked_mean(values: ArrayLike, mask: ArrayLike, axis: Axis = None) -> jax.Array:
    """sum(values * mask) / (sum(mask) + 1e-8), as verl's `masked_mean` (0 for an empty mask)."""
    values = as_float(values)
    mask = mask_like(mask, values)
    return masked_sum(values, mask, axis) / (jnp.sum(mask, axis=axis) + 1e-8)


def masked_var(values: ArrayLike, mask: ArrayLike, unbiased: bool = True) -> jax.Array:
    """Variance of the masked entries (over all axes).

    var = mean_m((x - mean_m(x))^2), times n / (n - 1) when `unbiased` (Bessel's correction,
    n = sum(mask)), as verl's `masked_var`. verl raises for n <= 1; under `jit` we cannot,
    so the correction is skipped when n <= 1 (the variance is then 0).
    """
    values = as_float(values)
    mask = mask_like(mask, values)
    mean = masked_mean(values, mask)
    var = masked_mean(jnp.square(values - mean), mask)
    if unbiased:
        n = jnp.sum(mask)
        var = jnp.where(n > 1, var * n / jnp.where(n > 1, n - 1, 1.0), var)
    return var


def masked_whiten(values: ArrayLike, mask: ArrayLike, shift_mean: bool = True) -> jax.Array:
    """(x - mean_m(x)) / sqrt(var_m(x) + 1e-8), with the unbiased masked variance (verl).

    With `shift_mean=False` the mean is added back, so only the scale changes. Statistics
    use the masked entries only; every entry (masked or not) is transformed.
    """
    values = as_float(values)
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * jax.lax.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def safe_divide(numerator: ArrayLike, denominator: ArrayLike) -> jax.Array:
    """numerator / denominator, and 0 where the denominator is 0 (an empty batch)."""
    numerator = as_float(numerator)
    denominator = jnp.asarray(denominator, dtype=numerator.dtype)
    return jnp.where(denominator != 0, numerator / jnp.where(denominator != 0, denominator, 1), 0.0)
