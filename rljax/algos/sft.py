"""Supervised fine-tuning: masked negative log-likelihood of aligned token log-probs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.aggregation import AggTerms, agg_loss_terms, finish_loss
from rljax.algos.log_probs import token_log_probs
from rljax.algos.masked import as_float


def sft_loss(
    log_probs: ArrayLike,
    loss_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    *,
    loss_scale_factor: float | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> tuple[jax.Array | AggTerms, dict[str, jax.Array]]:
    """Masked cross-entropy:  loss = agg(-log p(x_t | x_<t), m)  (token-mean by default).

    `log_probs` [B, T] are aligned with input_ids (`token_log_probs` or
    `log_probs_from_hidden`); `loss_mask` [B, T] marks target tokens (0 at t = 0, on the
    prompt and on padding). Metrics: sft/loss and sft/num_tokens (this batch's masked count).
    """
    nll = -as_float(log_probs)
    terms = agg_loss_terms(nll, loss_mask, loss_agg_mode, loss_scale_factor)
    out = finish_loss(terms, global_denominator, return_terms)
    metrics = {
        "sft/loss": jax.lax.stop_gradient(terms.value if return_terms else out),
        "sft/num_tokens": jnp.sum(as_float(loss_mask)),
    }
    return out, metrics


def sft_loss_from_logits(
    logits: ArrayLike,
    input_ids: ArrayLike,
    loss_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    **kwargs: object,
) -> tuple[jax.Array | AggTerms, dict[str, jax.Array]]:
    """`sft_loss` of `token_log_probs(logits, input_ids)`; `loss_mask` aligned with input_ids."""
    return sft_loss(token_log_probs(logits, input_ids), loss_mask, loss_agg_mode, **kwargs)


__all__ = ["sft_loss", "sft_loss_from_logits"]
