"""Policy-gradient losses of RL post-training, registered by name (verl's `loss_mode`).

A loss is written as its core formula, per token:

    core(old_log_prob, log_prob, advantages, response_mask, config, key) -> ([B, T] losses, metrics)

and `register_policy_loss` turns it into the public function with verl's signature

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
       config=None, rollout_is_weights=None, *, key=None, global_denominator=None,
       return_terms=False) -> (pg_loss, metrics)

(REINFORCE names its first argument `rollout_log_prob`, and GSPO's default mode is
"seq-mean-token-mean", as in verl), which does what every loss shares: it multiplies the per-token losses by the rollout IS
weights (rollout correction; constants, no gradient), aggregates them (`agg_loss_terms`),
honours `global_denominator` / `return_terms` and records `actor/pg_loss`. All arrays are
[B, T] and aligned with `input_ids` (entry t is about token t, see
`rljax.algos.log_probs.token_log_probs`); `config` is a `PolicyLossParams` (None: its
defaults), a mapping of its fields, or verl's actor config (`PolicyLossParams.of`). With `return_terms=True` the first result is an `AggTerms(numerator,
denominator)` instead of the scalar (see `rljax.algos.aggregation` for the micro-batch
protocol); with `global_denominator=D` it is numerator / D. Metrics are jnp scalars named
as in verl (`actor/pg_loss`, `actor/pg_clipfrac`, `actor/pg_clipfrac_lower`,
`actor/ppo_kl`), means over this (micro-)batch. `loss_agg_mode` and `config` are static.

A loss declares how it is aggregated: by the caller's `loss_agg_mode` (most), or by a
fixed mode of its paper (GSPO, GMPO). Its denominator therefore follows from the mask
alone: `PolicyLoss.denominator` (and `rljax.algos.registry.loss_denominator`) computes the
global one without evaluating the loss.

Log-ratios log pi - log pi_old are clamped to [-20, 20] before `exp` where verl does so
(vanilla, CISPO); GSPO clamps its sequence log-ratio at 10, as verl.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.aggregation import (
    AggTerms,
    agg_denominator,
    agg_loss_terms,
    finish_loss,
    verl_global_denominator,
)
from rljax.algos.masked import as_float, masked_mean, masked_sum
from rljax.algos.registry import POLICY_LOSS_REGISTRY

Metrics = dict[str, jax.Array]
LossOut = tuple[jax.Array | AggTerms, Metrics]
TokenLosses = tuple[jax.Array, Metrics]  # ([B, T] per-token losses, metrics)

LOG_RATIO_CLAMP = 20.0  # verl clamps negative_approx_kl to [-20, 20] before exp
sg = jax.lax.stop_gradient


_ACTOR_FIELDS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_scale_factor")
_POLICY_LOSS_FIELDS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")
_GLOBAL_BATCH_FIELDS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")


def _read(config: Any, name: str) -> Any:
    """`config.name` or `config[name]`; None when it has neither."""
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


@dataclass(frozen=True)
class PolicyLossParams:
    """The knobs of the policy losses, with verl's defaults (`actor` and `actor.policy_loss`)."""

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None  # None: clip_ratio
    clip_ratio_high: float | None = None  # None: clip_ratio
    clip_ratio_c: float = 3.0  # dual-clip lower bound (Ye et al. 2020, arXiv:1912.09729)
    loss_scale_factor: float | None = None  # C of "seq-mean-token-sum-norm"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 1.0
    dp_size: int = 1  # verl's global_batch_info: data-parallel replicas (see verl_global_denominator)
    batch_num_tokens: float | None = None  # verl's global_batch_info: loss tokens of the global batch
    global_batch_size: float | None = None  # verl's global_batch_info: sequences of the global batch

    @classmethod
    def of(cls, config: Any) -> PolicyLossParams:
        """`config` as a `PolicyLossParams`.

        None gives the defaults. A mapping without a `policy_loss` key names this class's
        fields (an unknown name is a `TypeError`, not silently ignored). Anything else is
        read as verl's actor config (its `ActorConfig`, an omegaconf `DictConfig`, rljax's
        `rl.actor_config.ActorConfig`, or any object or mapping with those names):
        `clip_ratio`, `clip_ratio_low`, `clip_ratio_high`, `clip_ratio_c`,
        `loss_scale_factor`, the `policy_loss` sub-config's `clip_cov_ratio`,
        `clip_cov_lb`, `clip_cov_ub`, `kl_cov_ratio`, `ppo_kl_coef`, and `global_batch_info`
        (`dp_size`, `batch_num_tokens`, `global_batch_size`, `loss_scale_factor`). A
        name that is absent or None takes this class's default, as verl's losses do;
        other attributes of the actor config are not the losses' business and are not read.
        """
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if isinstance(config, Mapping) and "policy_loss" not in config:
            return cls(**config)
        values: dict[str, Any] = {name: _read(config, name) for name in _ACTOR_FIELDS}
        sub = _read(config, "policy_loss")
        if sub is not None:
            values.update({name: _read(sub, name) for name in _POLICY_LOSS_FIELDS})
        batch_info = _read(config, "global_batch_info")
        if batch_info is not None:
            values.update({name: v for name in _GLOBAL_BATCH_FIELDS if (v := _read(batch_info, name)) is not None})
        return cls(**{name: v for name, v in values.items() if v is not None})

    def clip_bounds(self) -> tuple[float, float]:
        """(clip_ratio_low, clip_ratio_high), each defaulting to `clip_ratio` (verl)."""
        low, high = self.clip_ratio_low, self.clip_ratio_high
        return (self.clip_ratio if low is None else low), (self.clip_ratio if high is None else high)

    def global_denominator(self, loss_agg_mode: str) -> ArrayLike | None:
        """The global denominator its verl global-batch fields name for `loss_agg_mode`, or None."""
        return verl_global_denominator(loss_agg_mode, self.dp_size, self.batch_num_tokens, self.global_batch_size)


# --------------------------------------------------------------------------- registration

Core = Callable[[jax.Array, jax.Array, jax.Array, ArrayLike, PolicyLossParams, jax.Array | None], TokenLosses]
WeightsFn = Callable[[jax.Array, ArrayLike], jax.Array]  # (IS weights [B, T], mask [B, T]) -> factors [B, T]


def per_token_weights(weights: jax.Array, response_mask: ArrayLike) -> jax.Array:
    """Each token's loss is multiplied by its own IS weight (every loss but GMPO)."""
    return weights


def sequence_geometric_mean_weights(weights: jax.Array, response_mask: ArrayLike) -> jax.Array:
    """[B, T]: the geometric mean of a sequence's IS weights over its tokens, on every token
    (GMPO weighs a sequence's loss, as verl)."""
    mask = as_float(response_mask)
    lengths = jnp.sum(mask, axis=-1)  # [B]
    log_w = jnp.log(weights + 1e-10)  # [B, T]
    seq_weights = jnp.exp(masked_sum(log_w, mask, axis=-1) / (lengths + 1e-8))  # [B]
    return jnp.broadcast_to(seq_weights[:, None], weights.shape)


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: its core formula, how it is aggregated (hence how its
    denominator is counted), and the public verl-compatible function built from them."""

    name: str
    core: Core
    fixed_agg_mode: str | None  # the paper's aggregation, whatever the caller asks (GSPO, GMPO); None: the caller's
    is_weights: WeightsFn  # how rollout IS weights enter the per-token losses
    # a token's loss reads that token's arrays only (no sequence or batch statistics): the
    # loss of a batch is the same whichever rows its tokens sit in (`rljax.rl.packing`)
    per_token: bool
    fn: Callable[..., LossOut]

    def agg_mode(self, loss_agg_mode: str) -> str:
        """The mode this loss aggregates with when the caller asks for `loss_agg_mode`."""
        return self.fixed_agg_mode or loss_agg_mode

    def denominator(self, response_mask: ArrayLike, loss_agg_mode: str) -> jax.Array:
        """The loss's denominator, counted from the mask alone (the mini-batch's mask gives
        the global denominator); equal to the one `return_terms=True` gives."""
        return agg_denominator(response_mask, self.agg_mode(loss_agg_mode))


def _loss_signature(first_arg: str, default_agg_mode: str) -> inspect.Signature:
    """verl's policy-loss signature (`first_arg`: "old_log_prob", or REINFORCE's
    "rollout_log_prob"), then rljax's keyword-only extras."""
    P = inspect.Parameter
    arrays = [first_arg, "log_prob", "advantages", "response_mask"]
    return inspect.Signature(
        [P(n, P.POSITIONAL_OR_KEYWORD) for n in arrays]
        + [P("loss_agg_mode", P.POSITIONAL_OR_KEYWORD, default=default_agg_mode),
           P("config", P.POSITIONAL_OR_KEYWORD, default=None),
           P("rollout_is_weights", P.POSITIONAL_OR_KEYWORD, default=None)]
        + [P(n, P.KEYWORD_ONLY, default=d) for n, d in (("key", None), ("global_denominator", None),
                                                        ("return_terms", False))]
    )  # fmt: skip


def register_policy_loss(
    name: str,
    *,
    default_agg_mode: str = "token-mean",
    fixed_agg_mode: str | None = None,
    is_weights: WeightsFn = per_token_weights,
    first_arg: str = "old_log_prob",
    per_token: bool = True,
) -> Callable[[Core], Callable[..., LossOut]]:
    """Decorator: register `core` as the policy loss `name` and return its public function
    (see the module docstring), which carries the core's name and docstring.

    `default_agg_mode` is the public function's default `loss_agg_mode` and `first_arg` the
    name of its first argument (both as verl's function of that name); `fixed_agg_mode`,
    when set, is used whatever the caller asks. `per_token=False`: a token's loss reads
    statistics of its sequence or of the batch passed in."""

    def decorator(core: Core) -> Callable[..., LossOut]:
        signature = _loss_signature(first_arg, default_agg_mode)

        def loss_fn(*args: Any, **kwargs: Any) -> LossOut:
            bound = signature.bind(*args, **kwargs)  # a misspelt or missing argument: TypeError
            bound.apply_defaults()
            a = bound.arguments
            config = PolicyLossParams.of(a["config"])
            mode = fixed_agg_mode or a["loss_agg_mode"]
            old_log_prob, log_prob, advantages = (as_float(a[n]) for n in (first_arg, "log_prob", "advantages"))
            response_mask, rollout_is_weights = a["response_mask"], a["rollout_is_weights"]
            pg_losses, metrics = core(old_log_prob, log_prob, advantages, response_mask, config, a["key"])  # [B, T]
            if rollout_is_weights is not None:
                pg_losses = pg_losses * is_weights(sg(as_float(rollout_is_weights)), response_mask)
            terms = agg_loss_terms(pg_losses, response_mask, mode, config.loss_scale_factor)
            global_denominator = a["global_denominator"]
            if global_denominator is None:
                global_denominator = config.global_denominator(mode)
            out = finish_loss(terms, global_denominator, a["return_terms"])
            metrics["actor/pg_loss"] = sg(terms.value if a["return_terms"] else out)
            return out, metrics

        loss_fn.__name__ = loss_fn.__qualname__ = core.__name__
        loss_fn.__doc__ = core.__doc__
        loss_fn.__signature__ = signature  # type: ignore[attr-defined]
        POLICY_LOSS_REGISTRY.add(PolicyLoss(name, core, fixed_agg_mode, is_weights, per_token, loss_fn), name)
        return loss_fn

    return decorator


# --------------------------------------------------------------------------- the losses


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: jax.Array, log_prob: jax.Array, advantages: jax.Array, response_mask: ArrayLike,
    config: PolicyLossParams, key: jax.Array | None,
) -> TokenLosses:  # fmt: skip
    """PPO clipped surrogate with asymmetric clipping and dual-clip.

        r     = exp(clamp(log pi - log pi_old, -20, 20))
        L1    = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        L     = min(L1, -A clip_ratio_c)   if A < 0   (dual-clip)
                L1                         otherwise

    Sources: PPO (Schulman et al. 2017, arXiv:1707.06347); asymmetric "clip-higher"
    (DAPO, arXiv:2503.14476); dual-clip (Ye et al. 2020, arXiv:1912.09729); verl
    `compute_policy_loss_vanilla`. Metrics: pg_clipfrac = fraction of tokens where the
    clipped term is the larger; pg_clipfrac_lower = fraction where the dual clip binds;
    ppo_kl = mean(log pi_old - log pi).
    """
    clip_low, clip_high = config.clip_bounds()
    clip_ratio_c = config.clip_ratio_c
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_ratio_c}")

    negative_approx_kl = jnp.clip(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
    ratio = jnp.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_pg_losses1 = jnp.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = jnp.minimum(pg_losses3, clip_pg_losses1)
    pg_losses = jnp.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)  # [B, T]

    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(pg_losses2 > pg_losses1, response_mask)),
        "actor/pg_clipfrac_lower": sg(masked_mean((clip_pg_losses1 > pg_losses3) & (advantages < 0), response_mask)),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, response_mask)),
    }
    return pg_losses, metrics


@register_policy_loss("gspo", default_agg_mode="seq-mean-token-mean", fixed_agg_mode="seq-mean-token-mean",
                      per_token=False)
def compute_policy_loss_gspo(
    old_log_prob: jax.Array, log_prob: jax.Array, advantages: jax.Array, response_mask: ArrayLike,
    config: PolicyLossParams, key: jax.Array | None,
) -> TokenLosses:  # fmt: skip
    """GSPO: clipped surrogate on the length-normalised *sequence* ratio (GSPO-token form).

        log s_i   = (1/|y_i|) sum_t m (log pi - log pi_old)              (sequence ratio)
        log s_i,t = sg(log s_i) + log pi_t - sg(log pi_t)    (clamped at 10)
        L_i,t     = max(-A s_i,t, -A clip(s_i,t, 1 - clip_ratio_low, 1 + clip_ratio_high))

    The value of s_i,t is s_i; its gradient is s_i * grad log pi_t. Aggregated with
    "seq-mean-token-mean" whatever `loss_agg_mode` says, as the paper's objective and verl
    do (the returned terms carry that mode's denominator). Sources: Zheng et al. 2025,
    "Group Sequence Policy Optimization", arXiv:2507.18071; verl `compute_policy_loss_gspo`.
    """
    clip_low, clip_high = config.clip_bounds()
    negative_approx_kl = log_prob - old_log_prob  # [B, T]
    seq_lengths = jnp.maximum(jnp.sum(as_float(response_mask), axis=-1), 1.0)  # [B]
    negative_approx_kl_seq = masked_sum(negative_approx_kl, response_mask, axis=-1) / seq_lengths  # [B]
    log_seq_ratio = log_prob - sg(log_prob) + sg(negative_approx_kl_seq)[:, None]  # [B, T]
    seq_importance_ratio = jnp.exp(jnp.minimum(log_seq_ratio, 10.0))

    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * jnp.clip(seq_importance_ratio, 1.0 - clip_low, 1.0 + clip_high)
    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(pg_losses2 > pg_losses1, response_mask)),
        "actor/pg_clipfrac_lower": jnp.zeros((), jnp.float32),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, response_mask)),
    }
    return jnp.maximum(pg_losses1, pg_losses2), metrics


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: jax.Array, log_prob: jax.Array, advantages: jax.Array, response_mask: ArrayLike,
    config: PolicyLossParams, key: jax.Array | None,
) -> TokenLosses:  # fmt: skip
    """GPG: plain policy gradient, no ratio and no clipping:  L = -A log pi.

    Source: Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning", arXiv:2504.02546; verl `compute_policy_loss_gpg`. (Its advantage,
    with the batch-level correction alpha, is the "gpg" advantage estimator.)
    """
    return -log_prob * advantages, {}


@register_policy_loss("reinforce", default_agg_mode="seq-mean-token-sum", first_arg="rollout_log_prob")
def compute_policy_loss_reinforce(
    old_log_prob: jax.Array, log_prob: jax.Array, advantages: jax.Array, response_mask: ArrayLike,
    config: PolicyLossParams, key: jax.Array | None,
) -> TokenLosses:  # fmt: skip
    """REINFORCE:  L = -w A log pi, with w the (constant) rollout IS weight when given.

    `rollout_log_prob` (the behaviour / rollout policy; verl's name for the first argument)
    only feeds the `actor/ppo_kl` metric.
    Source: Williams 1992; verl `compute_policy_loss_reinforce` (its default aggregation
    "seq-mean-token-sum" is kept as this function's default).
    """
    metrics = {"actor/ppo_kl": sg(masked_mean(old_log_prob - log_prob, response_mask))}
    return -advantages * log_prob, metrics


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: jax.Array, log_prob: jax.Array, advantages: jax.Array, response_mask: ArrayLike,
    config: PolicyLossParams, key: jax.Array | None,
) -> TokenLosses:  # fmt: skip
    """CISPO: clipped, stop-gradient importance weight times the log-probability.

        r = exp(clamp(log pi - log pi_old, -20, 20))
        L = -sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) A log pi

    Every token keeps a gradient (only the weight is clipped). Source: MiniMax-M1 report
    (arXiv:2506.13585); verl `compute_policy_loss_cispo`. pg_clipfrac = fraction of tokens
    whose weight was clipped.
    """
    clip_low, clip_high = config.clip_bounds()
    negative_approx_kl = jnp.clip(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [B, T]
    ratio = jnp.exp(negative_approx_kl)
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(ratio != clipped_ratio, response_mask)),
        "actor/pg_clipfrac_lower": jnp.zeros((), jnp.float32),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, response_mask)),
    }
    return -sg(clipped_ratio) * advantages * log_prob, metrics


def _rank_descending(priority: jax.Array) -> jax.Array:
    """rank[i] = position of priority[i] in a descending sort (0 = largest), any shape."""
    flat = priority.reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    ranks = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
    return ranks.reshape(priority.shape)


def _select_top(candidates: jax.Array, priority: jax.Array, k: jax.Array) -> jax.Array:
    """A bool mask of the (at most) k candidates of highest priority; static shapes."""
    ranked = _rank_descending(jnp.where(candidates, priority, -jnp.inf))
    return candidates & (ranked < k)


def _count_fraction(n: jax.Array, fraction: float) -> jax.Array:
    """max(floor(n * fraction), 1), as verl's `max(int(n * ratio), 1)` (1e-6 absorbs fp32 rounding)."""
    return jnp.maximum(jnp.floor(n * fraction + 1e-6), 1.0)


def _centered_product(advantages: jax.Array, log_prob: jax.Array, mask: ArrayLike) -> jax.Array:
    """[B, T] (A - mean_m A)(log pi - mean_m log pi): the per-token covariance term (no gradient)."""
    log_prob, advantages = sg(log_prob), sg(advantages)
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


@register_policy_loss("clip_cov", per_token=False)
def compute_policy_loss_clip_cov(
    old_log_prob: jax.Array, log_prob: jax.Array, advantages: jax.Array, response_mask: ArrayLike,
    config: PolicyLossParams, key: jax.Array | None,
) -> TokenLosses:  # fmt: skip
    """Clip-Cov: PPO clip, plus detaching the gradient of a few high-covariance tokens.

        cov_t = (A_t - mean A)(log pi_t - mean log pi)           (masked means, no gradient)
        candidates: unmasked, not already clipped by PPO, clip_cov_lb < cov_t < clip_cov_ub
        n_sel = max(floor(clip_cov_ratio * #unmasked tokens), 1) of the candidates get
                corr = 0, all others corr = 1
        L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) * corr

    Selection: with a PRNG `key`, n_sel candidates chosen uniformly at random, as verl (which
    uses a random permutation); with `key=None`, deterministically the n_sel candidates of
    largest cov_t. No log-ratio clamp, as verl. The means and n_sel are statistics of the
    batch passed in, so with micro-batching the selection is per micro-batch (as in verl) and
    the loss is not exactly additive over micro-batches. Source: Cui et al. 2025, "The Entropy
    Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617;
    verl `compute_policy_loss_clip_cov`. pg_clipfrac = fraction of tokens with corr = 0.
    """
    clip_low, clip_high = config.clip_bounds()
    if not config.clip_cov_ratio > 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {config.clip_cov_ratio}")
    valid = jnp.asarray(response_mask) > 0  # [B, T]

    negative_approx_kl = log_prob - old_log_prob  # [B, T]
    ratio = jnp.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & valid

    cov = _centered_product(advantages, log_prob, response_mask)  # [B, T]
    candidates = valid & ~clip_by_origin & (cov > config.clip_cov_lb) & (cov < config.clip_cov_ub)
    n_select = _count_fraction(jnp.sum(valid), config.clip_cov_ratio)
    priority = cov if key is None else jax.random.uniform(key, cov.shape)
    detached = _select_top(candidates, priority, n_select)  # [B, T]
    corr = 1.0 - detached.astype(pg_losses1.dtype)

    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(detached, response_mask)),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, response_mask)),
    }
    return jnp.maximum(pg_losses1, pg_losses2) * corr, metrics


@register_policy_loss("kl_cov", per_token=False)
def compute_policy_loss_kl_cov(
    old_log_prob: jax.Array, log_prob: jax.Array, advantages: jax.Array, response_mask: ArrayLike,
    config: PolicyLossParams, key: jax.Array | None,
) -> TokenLosses:  # fmt: skip
    """KL-Cov: unclipped surrogate, plus a |log-ratio| penalty on the top-covariance tokens.

        cov_t = (A_t - mean A)(log pi_t - mean log pi)           (masked means, no gradient)
        top   = the max(floor(kl_cov_ratio * #unmasked tokens), 1) unmasked tokens of largest cov_t
        L     = -A r + ppo_kl_coef |log pi - log pi_old|   on top tokens
                -A r                                       elsewhere

    Selection is deterministic top-k, as verl (`key` is ignored), over the batch passed in
    (per micro-batch, as verl; not exactly additive over micro-batches). No log-ratio clamp, as
    verl. Source: Cui et al. 2025, arXiv:2505.22617; verl `compute_policy_loss_kl_cov`.
    Metric actor/ppo_kl is mean |log pi - log pi_old|, as verl.
    """
    if not config.kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {config.kl_cov_ratio}")
    valid = jnp.asarray(response_mask) > 0  # [B, T]

    negative_approx_kl = log_prob - old_log_prob  # [B, T]
    abs_kl = jnp.abs(negative_approx_kl)
    pg_losses1 = -advantages * jnp.exp(negative_approx_kl)
    pg_losses_kl = pg_losses1 + config.ppo_kl_coef * abs_kl

    cov = _centered_product(advantages, log_prob, response_mask)  # [B, T]
    top = _select_top(valid, cov, _count_fraction(jnp.sum(valid), config.kl_cov_ratio))
    metrics = {"actor/ppo_kl": sg(masked_mean(abs_kl, response_mask))}
    return jnp.where(top, pg_losses_kl, pg_losses1), metrics


@register_policy_loss("geo_mean", fixed_agg_mode="seq-mean-token-mean", is_weights=sequence_geometric_mean_weights,
                      per_token=False)
def compute_policy_loss_geo_mean(
    old_log_prob: jax.Array, log_prob: jax.Array, advantages: jax.Array, response_mask: ArrayLike,
    config: PolicyLossParams, key: jax.Array | None,
) -> TokenLosses:  # fmt: skip
    """GMPO: clipped *geometric mean* of token ratios, one loss per sequence.

        d_t   = log pi_t - log pi_old,t
        c_t   = sign(A) min(sign(A) d_t, sign(A) clip(d_t, -clip_ratio_low, clip_ratio_high))
        rho_i = exp( sum_t m c_t / (sum_t m + 1e-8) )          (clipped geometric-mean ratio)
        A_i   = sum_t m A_t / (sum_t m + 1e-8)                  (sequence advantage)
        L_i   = -A_i rho_i  [* geometric mean of rollout_is_weights over the sequence]
        loss  = mean over sequences with a nonzero mask

    L_i is put on every token of sequence i and aggregated with "seq-mean-token-mean",
    which gives exactly the mean of L_i over sequences; `loss_agg_mode` is ignored (the
    loss is per sequence), as in verl. The clip bounds act on the log-ratio. verl averages
    over all B rows; rows with an empty mask have L_i = 0 and are left out of the count
    here, as in every "seq-mean" mode. Source: Zhao et al. 2025, "Geometric-Mean Policy
    Optimization", arXiv:2507.20673; verl `compute_policy_loss_geo_mean`.
    """
    clip_low, clip_high = config.clip_bounds()
    mask = as_float(response_mask)

    negative_approx_kl = log_prob - old_log_prob  # [B, T]
    sign = jnp.sign(advantages)
    negative_approx_kl_clamp = jnp.clip(negative_approx_kl, -clip_low, clip_high)
    negative_approx_kl_min = sign * jnp.minimum(sign * negative_approx_kl, sign * negative_approx_kl_clamp)

    lengths = jnp.sum(mask, axis=-1)  # [B]
    seq_ratio = jnp.exp(masked_sum(negative_approx_kl_min, mask, axis=-1) / (lengths + 1e-8))  # [B]
    seq_advantage = masked_sum(advantages, mask, axis=-1) / (lengths + 1e-8)  # [B]
    seq_losses = -seq_advantage * seq_ratio  # [B]

    clipped = negative_approx_kl != negative_approx_kl_clamp  # [B, T]
    metrics = {
        "actor/pg_clipfrac": sg(masked_mean(clipped & (advantages > 0), mask)),
        "actor/pg_clipfrac_lower": sg(masked_mean(clipped & (advantages < 0), mask)),
        "actor/ppo_kl": sg(masked_mean(-negative_approx_kl, mask)),
    }
    return jnp.broadcast_to(seq_losses[:, None], mask.shape), metrics


def compute_policy_loss(
    old_log_prob: ArrayLike,
    log_prob: ArrayLike,
    advantages: ArrayLike,
    response_mask: ArrayLike,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """verl's older PPO-loss function: `compute_policy_loss_vanilla` with its knobs as
    arguments, returning (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower).

    `cliprange_low` / `cliprange_high` default to `cliprange`; a bound left without a value
    is a `ValueError`. Same signature and results as verl `core_algos.compute_policy_loss`.
    """
    if cliprange is None and (cliprange_low is None or cliprange_high is None):
        raise ValueError("cliprange is required unless both cliprange_low and cliprange_high are given")
    config = PolicyLossParams(clip_ratio=0.0 if cliprange is None else cliprange, clip_ratio_low=cliprange_low,
                              clip_ratio_high=cliprange_high, clip_ratio_c=clip_ratio_c)  # fmt: skip
    loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)
    return loss, metrics["actor/pg_clipfrac"], metrics["actor/ppo_kl"], metrics["actor/pg_clipfrac_lower"]


__all__ = [
    "PolicyLoss",
    "PolicyLossParams",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_vanilla",
    "per_token_weights",
    "register_policy_loss",
    "sequence_geometric_mean_weights",
]
