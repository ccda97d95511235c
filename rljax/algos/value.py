"""The critic's clipped value loss (PPO)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.aggregation import AggTerms, agg_loss_terms, finish_loss, verl_global_denominator
from rljax.algos.masked import as_float, masked_mean


def compute_value_loss(
    vpreds: ArrayLike,
    returns: ArrayLike,
    values: ArrayLike,
    response_mask: ArrayLike,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: ArrayLike | None = None,
    global_batch_size: ArrayLike | None = None,
    loss_scale_factor: float | None = None,
    *,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> tuple[jax.Array | AggTerms, dict[str, jax.Array]]:
    """Clipped value loss.

        V_clip = clip(V_pred, V_old - c, V_old + c)
        L      = 1/2 agg( max((V_pred - R)^2, (V_clip - R)^2) )

    Sources: PPO as implemented in OpenAI baselines / TRL `PPOTrainer`; verl
    `compute_value_loss` (same argument order: vpreds, returns, values). Metrics:
    critic/vf_loss and critic/vf_clipfrac (fraction of tokens where the clipped error is
    the larger). The 1/2 is inside the numerator of the returned terms. `dp_size`,
    `batch_num_tokens`, `global_batch_size` are verl's global-batch arguments (see
    `rljax.algos.aggregation.verl_global_denominator`); `global_denominator` wins over them.
    """
    vpreds, returns, values = (as_float(x) for x in (vpreds, returns, values))
    vpredclipped = jnp.clip(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = jnp.square(vpreds - returns)
    vf_losses2 = jnp.square(vpredclipped - returns)
    clipped_vf_losses = jnp.maximum(vf_losses1, vf_losses2)
    terms = agg_loss_terms(clipped_vf_losses, response_mask, loss_agg_mode, loss_scale_factor)
    terms = AggTerms(0.5 * terms.numerator, terms.denominator)
    if global_denominator is None:
        global_denominator = verl_global_denominator(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size)
    out = finish_loss(terms, global_denominator, return_terms)
    sg = jax.lax.stop_gradient
    metrics = {
        "critic/vf_loss": sg(terms.value if return_terms else out),
        "critic/vf_clipfrac": sg(masked_mean(vf_losses2 > vf_losses1, response_mask)),
    }
    return out, metrics


__all__ = ["compute_value_loss"]
