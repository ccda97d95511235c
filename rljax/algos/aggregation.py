"""Fused masked aggregation: turn a [B, T] loss matrix into one scalar, micro-batch safe.

Every mode is written as a pair of *sums* `(numerator, denominator)` (an `AggTerms`),
and the loss is `numerator / denominator`. Sums add: when a train step splits a global
mini-batch along the batch axis into micro-batches (and across devices), it sums the
numerators, sums the denominators, and divides once. The result, and its gradient, are
exactly those of the whole mini-batch. Averaging per-micro-batch losses instead (a mean
of means) weighs a token of a short micro-batch more than one of a long micro-batch;
that is the bug this module exists to avoid.

Modes (names as verl's `loss_agg_mode`; `m` the mask, `l` the loss matrix, `i` a sequence,
`t` a token, `S` = number of sequences with at least one unmasked token, `C` =
`loss_scale_factor`):

    token-mean               sum_{i,t} m l / sum_{i,t} m
    seq-mean-token-sum       sum_i ( sum_t m l )                   / S
    seq-mean-token-mean      sum_i ( sum_t m l / sum_t m )         / S
    seq-mean-token-sum-norm  sum_i ( sum_t m l / C )               / S   (Dr. GRPO)

Source: verl `core_algos.agg_loss` (token-mean, seq-mean-token-sum, seq-mean-token-mean
as there). For seq-mean-token-sum-norm we follow the Dr. GRPO paper (Liu et al. 2025,
"Understanding R1-Zero-Like Training", arXiv:2503.20783): each sequence's token sum is
divided by a constant `C` (default: the padded length T, verl's default for its
`loss_scale_factor`) and sequences are averaged. `C` must be the same constant in every
micro-batch: pass `loss_scale_factor` explicitly (e.g. the max response length) when
micro-batches may have different padded lengths.

verl's global-batch arguments (`agg_loss(..., dp_size, batch_num_tokens,
global_batch_size)`, and the `global_batch_info` of its actor config) name the global
denominator the other way: verl divides by the global count (tokens for token-mean,
sequences otherwise) and multiplies by `dp_size`, because data-parallel replicas average
their gradients. `verl_global_denominator` turns them into the `global_denominator` used
here (count / dp_size), so both spellings give the same number.

How a train step uses this (the protocol, in one place):

    terms = sum over micro-batches of agg_loss_terms(l_mb, m_mb, mode)   # (or of a loss's
    loss  = terms.numerator / terms.denominator                          #  return_terms=True)

Denominators depend only on masks, never on parameters, so gradients can be accumulated
on numerators and divided once as well. Alternatively, compute the global denominator
first (`agg_denominator(global_mask, mode)`) and pass it as `global_denominator=` to
`agg_loss` (or to any loss): each micro-batch loss is then `numerator_mb / D`, and the
micro-batch losses (and gradients) simply add up. Under `jit` on a sharded global batch,
sums over the batch axis are global already; inside `shard_map`, `psum` the terms.
Micro-batches must split the batch axis (whole sequences), not the time axis.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.masked import as_float, mask_like, masked_sum, safe_divide
from rljax.algos.registry import LOSS_AGG_REGISTRY, get_loss_agg_fn, register_loss_agg_mode

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


class AggTerms(NamedTuple):
    """An aggregated loss as `numerator / denominator`; both are sums that add across
    micro-batches and devices (see the module docstring)."""

    numerator: jax.Array
    denominator: jax.Array

    @property
    def value(self) -> jax.Array:
        """numerator / denominator (0 when the denominator is 0)."""
        return safe_divide(self.numerator, self.denominator)


def add_terms(*terms: AggTerms) -> AggTerms:
    """Sum several `AggTerms` (e.g. of micro-batches) numerator-wise and denominator-wise."""
    return AggTerms(sum(t.numerator for t in terms), sum(t.denominator for t in terms))


def _prepare(loss_mat: ArrayLike, loss_mask: ArrayLike) -> tuple[jax.Array, jax.Array]:
    loss_mat = as_float(loss_mat)
    loss_mat = loss_mat.astype(jnp.promote_types(loss_mat.dtype, jnp.float32))
    return loss_mat, mask_like(loss_mask, loss_mat)


def _num_sequences(mask: jax.Array) -> jax.Array:
    """S: the number of sequences with at least one unmasked token."""
    return jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(mask.dtype))


@register_loss_agg_mode("token-mean")
def token_mean_terms(loss_mat: ArrayLike, loss_mask: ArrayLike, loss_scale_factor: float | None = None) -> AggTerms:
    """sum_{i,t} m l  /  sum_{i,t} m   (every loss token of the global batch weighs the same)."""
    loss_mat, mask = _prepare(loss_mat, loss_mask)
    return AggTerms(masked_sum(loss_mat, mask), jnp.sum(mask))


@register_loss_agg_mode("seq-mean-token-sum")
def seq_mean_token_sum_terms(
    loss_mat: ArrayLike, loss_mask: ArrayLike, loss_scale_factor: float | None = None
) -> AggTerms:
    """sum_i sum_t m l  /  S   (sum over a sequence's tokens, mean over sequences)."""
    loss_mat, mask = _prepare(loss_mat, loss_mask)
    return AggTerms(masked_sum(loss_mat, mask), _num_sequences(mask))


@register_loss_agg_mode("seq-mean-token-mean")
def seq_mean_token_mean_terms(
    loss_mat: ArrayLike, loss_mask: ArrayLike, loss_scale_factor: float | None = None
) -> AggTerms:
    """sum_i (sum_t m l / sum_t m)  /  S   (mean over a sequence's tokens, mean over sequences)."""
    loss_mat, mask = _prepare(loss_mat, loss_mask)
    seq_means = safe_divide(masked_sum(loss_mat, mask, axis=-1), jnp.sum(mask, axis=-1))
    return AggTerms(jnp.sum(seq_means), _num_sequences(mask))


@register_loss_agg_mode("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm_terms(
    loss_mat: ArrayLike, loss_mask: ArrayLike, loss_scale_factor: float | None = None
) -> AggTerms:
    """sum_i (sum_t m l / C)  /  S, with C = `loss_scale_factor` (default: padded length T)."""
    loss_mat, mask = _prepare(loss_mat, loss_mask)
    scale = loss_mask_length(mask) if loss_scale_factor is None else loss_scale_factor
    return AggTerms(masked_sum(loss_mat, mask) / scale, _num_sequences(mask))


def loss_mask_length(loss_mask: ArrayLike) -> int:
    """The padded length T of a [..., T] mask: the default `loss_scale_factor`."""
    return int(jnp.shape(loss_mask)[-1])


def agg_loss_terms(
    loss_mat: ArrayLike,
    loss_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> AggTerms:
    """The `(numerator, denominator)` of `loss_agg_mode` for this (micro-)batch.

    Args:
        loss_mat: [B, T] per-token losses.
        loss_mask: [B, T] mask (1 = the token is in the loss).
        loss_agg_mode: one of `LOSS_AGG_MODES` (see the module docstring for the formulas).
        loss_scale_factor: the constant C of "seq-mean-token-sum-norm" (default T).
    """
    return get_loss_agg_fn(loss_agg_mode)(loss_mat, loss_mask, loss_scale_factor=loss_scale_factor)


def agg_denominator(loss_mask: ArrayLike, loss_agg_mode: str = "token-mean") -> jax.Array:
    """The denominator of `loss_agg_mode` for a mask (token count or sequence count).

    Compute it once on the *global* mini-batch mask and pass it as `global_denominator=`.
    """
    mask = as_float(loss_mask)
    return agg_loss_terms(jnp.zeros_like(mask), mask, loss_agg_mode).denominator


def verl_global_denominator(
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: ArrayLike | None = None,
    global_batch_size: ArrayLike | None = None,
) -> ArrayLike | None:
    """The `global_denominator` equal to verl's global-batch arguments, or None (local).

    verl's `agg_loss` gives numerator / N * dp_size, with N = `batch_num_tokens` for
    token-mean and `global_batch_size` (sequences) for the seq-mean modes, each defaulting
    to the local count when `dp_size` is 1 and required when it is larger (a `ValueError`,
    as verl). That is numerator / (N / dp_size).
    """
    name = "batch_num_tokens" if loss_agg_mode == "token-mean" else "global_batch_size"
    count = batch_num_tokens if loss_agg_mode == "token-mean" else global_batch_size
    if count is None:
        if dp_size > 1:
            raise ValueError(f"{name} (of the global batch) is required when dp_size > 1 ({loss_agg_mode})")
        return None
    return count / dp_size if dp_size != 1 else count


def agg_loss(
    loss_mat: ArrayLike,
    loss_mask: ArrayLike,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: ArrayLike | None = None,
    global_batch_size: ArrayLike | None = None,
    loss_scale_factor: float | None = None,
    *,
    global_denominator: ArrayLike | None = None,
) -> jax.Array:
    """Aggregate a [B, T] loss matrix into a scalar (verl `core_algos.agg_loss`, same signature).

    loss = numerator / denominator of `agg_loss_terms`. If `global_denominator` is given
    (the denominator of the whole global mini-batch, see `agg_denominator`), the loss is
    numerator / global_denominator instead, so that the losses of micro-batches add up to
    the loss of the mini-batch. verl's `dp_size`, `batch_num_tokens` and
    `global_batch_size` say the same (see `verl_global_denominator`); `global_denominator`
    wins when both are given. An empty batch (denominator 0) gives 0.
    """
    terms = agg_loss_terms(loss_mat, loss_mask, loss_agg_mode, loss_scale_factor)
    if global_denominator is None:
        global_denominator = verl_global_denominator(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size)
    if global_denominator is None:
        return terms.value
    return safe_divide(terms.numerator, global_denominator)


def finish_loss(terms: AggTerms, global_denominator: ArrayLike | None, return_terms: bool) -> AggTerms | jax.Array:
    """What a loss function returns: its terms, or the scalar loss (see `agg_loss`)."""
    if return_terms:
        return terms
    if global_denominator is None:
        return terms.value
    return safe_divide(terms.numerator, global_denominator)


__all__ = [
    "LOSS_AGG_MODES",
    "LOSS_AGG_REGISTRY",
    "AggTerms",
    "add_terms",
    "agg_denominator",
    "agg_loss",
    "agg_loss_terms",
    "finish_loss",
    "loss_mask_length",
    "seq_mean_token_mean_terms",
    "seq_mean_token_sum_norm_terms",
    "seq_mean_token_sum_terms",
    "token_mean_terms",
    "verl_global_denominator",
]
