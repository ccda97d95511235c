"""KL divergence between the policy and a reference: per-token estimators, full-vocab KL,
the KL loss / reward penalty, and the fixed and adaptive KL controllers.

"full" (`actor.kl_loss_type` / `algorithm.kl_penalty`) is the exact KL over the
vocabulary, `kl_from_hidden`: not an estimator of the sampled token, so it is not in the
estimator registry and `kl_penalty(..., "full")` is an error (it needs logits, not
log-probs). verl lists "full" among its `kl_penalty` options but its `kl_penalty_forward`
raises NotImplementedError for it; the definition here is ours.

Per-token estimators of KL(pi || pi_ref) from the sampled token's log-probabilities
(J. Schulman, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html;
verl `core_algos.kl_penalty`), with d = log pi - log pi_ref:

    "kl"  / "k1"          d
    "abs"                 |d|
    "mse" / "k2"          d^2 / 2
    "low_var_kl" / "k3"   e^{-d'} + d' - 1, d' = clamp(d, -20, 20), result clamped to [-10, 10]
    "<name>+"             straight-through: the value of <name>, the gradient of k2

k1 and k3 are unbiased estimates of the KL *value*, but their gradients are not unbiased
estimates of the KL gradient; k2's gradient is. The "+" variants (verl's "k1+", "k3+")
use sg(<name>) + k2 - sg(k2).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.aggregation import AggTerms, agg_loss_terms, finish_loss
from rljax.algos.log_probs import DEFAULT_CHUNK_SIZE, align_next_token, map_position_chunks
from rljax.algos.masked import as_float, masked_mean
from rljax.algos.registry import get_kl_estimator, register_kl_estimator

KL_CLAMP = 20.0  # d is clamped to [-20, 20] before exp in k3 (verl)
K3_CLAMP = 10.0  # the k3 estimate is clamped to [-10, 10] (verl)


def _log_ratio(logprob: ArrayLike, ref_logprob: ArrayLike) -> jax.Array:
    return as_float(logprob) - as_float(ref_logprob)


@register_kl_estimator("kl", "k1")
def kl_k1(logprob: ArrayLike, ref_logprob: ArrayLike) -> jax.Array:
    """k1 = log pi - log pi_ref (unbiased, high variance, can be negative)."""
    return _log_ratio(logprob, ref_logprob)


@register_kl_estimator("abs")
def kl_abs(logprob: ArrayLike, ref_logprob: ArrayLike) -> jax.Array:
    """|log pi - log pi_ref|."""
    return jnp.abs(_log_ratio(logprob, ref_logprob))


@register_kl_estimator("mse", "k2")
def kl_k2(logprob: ArrayLike, ref_logprob: ArrayLike) -> jax.Array:
    """k2 = (log pi - log pi_ref)^2 / 2 (biased, low variance; its gradient is unbiased)."""
    return 0.5 * jnp.square(_log_ratio(logprob, ref_logprob))


@register_kl_estimator("low_var_kl", "k3")
def kl_k3(logprob: ArrayLike, ref_logprob: ArrayLike) -> jax.Array:
    """k3 = r - log r - 1 with r = pi_ref / pi (unbiased, low variance, >= 0).

    log r = clamp(log pi_ref - log pi, -20, 20); the result is clamped to [-10, 10] (verl).
    """
    log_r = jnp.clip(-_log_ratio(logprob, ref_logprob), -KL_CLAMP, KL_CLAMP)
    return jnp.clip(jnp.exp(log_r) - log_r - 1.0, -K3_CLAMP, K3_CLAMP)


def straight_through(forward: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """An estimator whose value is `forward`'s and whose gradient is k2's."""

    def estimator(logprob: ArrayLike, ref_logprob: ArrayLike) -> jax.Array:
        backward = kl_k2(logprob, ref_logprob)
        sg = jax.lax.stop_gradient
        return sg(forward(logprob, ref_logprob)) + backward - sg(backward)

    estimator.__name__ = f"{forward.__name__}_straight_through"
    estimator.__doc__ = f"Value of {forward.__name__}, gradient of k2 (straight-through)."
    return estimator


kl_k1_plus = register_kl_estimator("kl+", "k1+")(straight_through(kl_k1))
kl_abs_plus = register_kl_estimator("abs+")(straight_through(kl_abs))
kl_k3_plus = register_kl_estimator("low_var_kl+", "k3+")(straight_through(kl_k3))


FULL_KL = "full"


def kl_penalty(logprob: ArrayLike, ref_logprob: ArrayLike, kl_penalty: str) -> jax.Array:
    """Per-token KL estimate [B, T] by estimator name (see the module docstring; verl)."""
    if kl_penalty == FULL_KL:
        raise ValueError('the "full" KL needs the logits of both models, not log-probs: use kl_from_hidden '
                         "(or kl_from_logits)")
    return get_kl_estimator(kl_penalty)(logprob, ref_logprob)


def kl_from_logits(logits: ArrayLike, ref_logits: ArrayLike, temperature: float = 1.0) -> jax.Array:
    """Exact KL(pi || pi_ref) over the whole vocabulary, per position: [..., V] -> [...].

        KL = sum_v p_v (log p_v - log q_v),  p = softmax(logits / T), q = softmax(ref_logits / T)

    verl's "full" kl_penalty. Entry t is the KL of the next-token distributions at
    position t; `rljax.algos.log_probs.align_next_token` aligns it with input_ids.
    """
    log_p = jax.nn.log_softmax(as_float(logits).astype(jnp.float32) / temperature, axis=-1)
    log_q = jax.nn.log_softmax(as_float(ref_logits).astype(jnp.float32) / temperature, axis=-1)
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def _chunk_full_kl(weights, hidden, ref_hidden, temperature):
    unembed, ref_unembed = weights
    logits = jnp.dot(hidden, unembed.astype(hidden.dtype), preferred_element_type=jnp.float32)
    ref_logits = jnp.dot(ref_hidden, ref_unembed.astype(ref_hidden.dtype), preferred_element_type=jnp.float32)
    return (kl_from_logits(logits, ref_logits, temperature),)


def kl_from_hidden(
    hidden: ArrayLike,
    unembed: ArrayLike,
    ref_hidden: ArrayLike,
    ref_unembed: ArrayLike,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = DEFAULT_CHUNK_SIZE,
) -> jax.Array:
    """Exact KL(pi(.|ctx_t) || pi_ref(.|ctx_t)) over the vocabulary, aligned with input_ids:

        p = softmax(hidden[:, t-1] @ unembed / T),   q = softmax(ref_hidden[:, t-1] @ ref_unembed / T)
        out[:, t] = sum_v p_v (log p_v - log q_v),   out[:, 0] = 0

    i.e. the KL of the next-token distributions that token t was drawn from (the same
    alignment as `log_probs_from_hidden`), at the sampling temperature T. Computed in
    chunks of `chunk_size` positions (`map_position_chunks`), so no more than two
    [B, chunk, V] float32 logits blocks exist at a time, never [B, T, V]; the backward pass
    recomputes a chunk's logits. Gradients flow into `hidden` and `unembed` (the policy)
    and into the reference arguments too unless the caller stops them (the actor loss does).

    Unlike the per-token estimators (k1, k3, ... of the sampled token, Monte-Carlo estimates
    whose expectation under pi is this KL; Schulman, "Approximating KL Divergence"), this is
    the KL itself at every position: no sampling noise, at the cost of the reference's
    logits at every position. Source: the definition of the KL divergence. verl's "full"
    kl_penalty is not implemented there (see the module docstring); this is rljax's.
    """
    hidden, ref_hidden = jnp.asarray(hidden), jnp.asarray(ref_hidden)
    fn = functools.partial(_chunk_full_kl, temperature=temperature)
    (kl,) = map_position_chunks(fn, (jnp.asarray(unembed), jnp.asarray(ref_unembed)), (hidden, ref_hidden), chunk_size)
    return align_next_token(kl)


def compute_kl_loss(
    log_prob: ArrayLike,
    ref_log_prob: ArrayLike,
    response_mask: ArrayLike,
    loss_agg_mode: str = "token-mean",
    kl_loss_type: str = "low_var_kl",
    *,
    loss_scale_factor: float | None = None,
    global_denominator: ArrayLike | None = None,
    return_terms: bool = False,
) -> tuple[jax.Array | AggTerms, dict[str, jax.Array]]:
    """KL loss added to the actor loss (GRPO's `use_kl_loss`):  agg(kl_penalty(log pi, log pi_ref)).

    Source: GRPO (Shao et al. 2024, arXiv:2402.03300) uses k3; verl `dp_actor`/`ppo_loss`.
    Metric: actor/kl_loss.
    """
    kld = kl_penalty(log_prob, ref_log_prob, kl_loss_type)
    terms = agg_loss_terms(kld, response_mask, loss_agg_mode, loss_scale_factor)
    out = finish_loss(terms, global_denominator, return_terms)
    return out, {"actor/kl_loss": jax.lax.stop_gradient(terms.value if return_terms else out)}


def compute_rewards(
    token_level_scores: ArrayLike, old_log_prob: ArrayLike, ref_log_prob: ArrayLike, kl_ratio: float
) -> jax.Array:
    """r_t = score_t - kl_ratio (log pi_old - log pi_ref)  (verl `core_algos.compute_rewards`)."""
    return as_float(token_level_scores) - kl_ratio * _log_ratio(old_log_prob, ref_log_prob)


def apply_kl_penalty(
    token_level_scores: ArrayLike,
    old_log_probs: ArrayLike,
    ref_log_probs: ArrayLike,
    response_mask: ArrayLike,
    kl_coef: float | jax.Array,
    kl_penalty_type: str = "kl",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """In-reward KL penalty (PPO-RLHF, Ziegler et al. 2019, arXiv:1909.08593; verl `apply_kl_penalty`).

        token_level_rewards = token_level_scores - kl_coef * m * kl_penalty(log pi_old, log pi_ref)
        current_kl          = mean over sequences of the masked per-sequence mean KL

    Returns (token_level_rewards, metrics); `current_kl` (metric actor/reward_kl_penalty) is
    what an `AdaptiveKLController.update` takes.
    """
    return apply_kl_to_rewards(token_level_scores, kl_penalty(old_log_probs, ref_log_probs, kl_penalty_type),
                               response_mask, kl_coef)


def apply_kl_to_rewards(
    token_level_scores: ArrayLike, kld: ArrayLike, response_mask: ArrayLike, kl_coef: float | jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`apply_kl_penalty` with the per-token KL [B, T] given (an estimator's, or the exact
    "full" KL of `kl_from_hidden`):  rewards = scores - kl_coef * m * kld."""
    mask = as_float(response_mask)
    kld = as_float(kld) * mask
    rewards = as_float(token_level_scores) - kl_coef * kld
    current_kl = jnp.mean(masked_mean(kld, mask, axis=-1))
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": jnp.asarray(kl_coef)}


@dataclasses.dataclass(frozen=True)
class FixedKLController:
    """A constant KL coefficient; `update` returns the same controller."""

    value: float

    def update(self, current_kl: Any, n_steps: int) -> FixedKLController:
        return self


@dataclasses.dataclass(frozen=True)
class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, section 2.2; verl).

        e     = clip(current_kl / target_kl - 1, -0.2, 0.2)
        value = value * (1 + e * n_steps / horizon)

    Immutable: `update` returns a new controller. Works on Python floats and on jax scalars
    (so it can also live inside a jitted step).
    """

    value: float
    target: float
    horizon: float

    def __post_init__(self) -> None:
        if not self.horizon > 0:
            raise ValueError(f"horizon must be > 0, got {self.horizon}")

    def update(self, current_kl: Any, n_steps: int) -> AdaptiveKLController:
        error = current_kl / self.target - 1.0
        if isinstance(error, jax.Array):
            error = jnp.clip(error, -0.2, 0.2)
        else:
            error = min(max(float(error), -0.2), 0.2)
        return dataclasses.replace(self, value=self.value * (1.0 + error * n_steps / self.horizon))


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """The controller named by verl's `algorithm.kl_ctrl` (same signature as verl's).

    `kl_ctrl` has verl's `KLControlConfig` attributes (or keys): `type` ("fixed" or
    "adaptive"), `kl_coef`, and for "adaptive" `target_kl` and `horizon`.
    """

    def field(name: str) -> Any:
        return kl_ctrl[name] if isinstance(kl_ctrl, Mapping) else getattr(kl_ctrl, name)

    controllers = {
        "fixed": lambda: FixedKLController(value=field("kl_coef")),
        "adaptive": lambda: AdaptiveKLController(value=field("kl_coef"), target=field("target_kl"),
                                                 horizon=field("horizon")),
    }
    kind = field("type")
    if kind not in controllers:
        raise ValueError(f"Unknown KL controller type {kind!r}. Valid types: {sorted(controllers)}")
    return controllers[kind]()


__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "apply_kl_to_rewards",
    "compute_kl_loss",
    "compute_rewards",
    "get_kl_controller",
    "kl_abs",
    "kl_from_hidden",
    "kl_from_logits",
    "kl_k1",
    "kl_k1_plus",
    "kl_k2",
    "kl_k3",
    "kl_k3_plus",
    "kl_penalty",
    "straight_through",
]
