"""Rollout correction: importance weights and rejection masks between the rollout policy
(the sampler's log_probs) and the training policy (the trainer's log_probs).

With rho_t = pi_train(y_t) / pi_rollout(y_t), computed in log space from
log_ratio = log pi_train - log pi_rollout:

Truncated importance sampling (TIS) weights, `rollout_is`:
    "token"      w_t = min(rho_t, threshold)
    "sequence"   w_t = min(prod_t rho_t, threshold)                 (broadcast over the sequence)
    "geometric"  w_t = min((prod_t rho_t)^(1/|y|), threshold)       (broadcast over the sequence)
Log-ratios are clamped to [-20, 20] before `exp`. The weights are constants (no gradient)
and 0 on masked tokens. `rollout_is_mode="mask"` (masked IS) instead keeps the weights
untruncated and rejects tokens / sequences whose weight leaves [1/threshold, threshold].

Rejection sampling, `rollout_rs` (comma-separated options, every one must pass):
    "token_k1"               reject tokens with k1 = -log_ratio outside [log lower, log upper]
    "token_k2" / "token_k3"  reject tokens with k2 / k3 above the threshold
    "seq_sum_k{1,2,3}", "seq_mean_k{1,2,3}", "seq_max_k{2,3}"
                             the same on the sum / mean / max over the sequence, rejecting
                             the whole sequence
with k1 = -d, k2 = d^2 / 2, k3 = e^d - 1 - d (d = clamped log_ratio). A k1 threshold is
"lower_upper" on the ratio (e.g. "0.5_2.0"), or one number u meaning [1/u, u].
Veto, `rollout_is_veto_threshold`: reject a whole sequence if any token has rho_t below it.

Sources: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training" (TIS; https://fengyao.notion.site/off-policy-rl); Liu et al. 2025, "When Speed
Kills Stability" (https://richardli.xyz/rl-collapse); verl `rollout_corr_helper` (option
names, metric names under `rollout_corr/`) and its earlier `mismatch_helper` (levels
token/sequence/geometric, truncate/mask modes, veto). Everything is jit-able (static
shapes, masks only); option strings and thresholds are static.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rljax.algos.masked import as_float, masked_mean, masked_sum, safe_divide
from rljax.algos.registry import Registry

SAFETY_BOUND = 20.0  # exp(+-20) bounds every ratio computed here

Metrics = dict[str, jax.Array]

# level -> per-sequence (or per-token) log weight, broadcast to [B, T]
IS_LEVEL_REGISTRY = Registry("rollout_is level")
# "token" / "seq_sum" / "seq_mean" / "seq_max" -> per-token statistic broadcast to [B, T]
RS_REDUCTION_REGISTRY = Registry("rollout_rs reduction")
# "k1" / "k2" / "k3" -> per-token divergence from the clamped log-ratio
RS_DIVERGENCE_REGISTRY = Registry("rollout_rs divergence")


def _masked_max(values: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    out = jnp.max(jnp.where(mask > 0, values, -jnp.inf), axis=axis)
    return jnp.where(jnp.isfinite(out), out, 0.0)


def _masked_min(values: jax.Array, mask: jax.Array, axis: int | None = None) -> jax.Array:
    out = jnp.min(jnp.where(mask > 0, values, jnp.inf), axis=axis)
    return jnp.where(jnp.isfinite(out), out, 0.0)


@IS_LEVEL_REGISTRY.register("token")
def _token_log_weight(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    return log_ratio


@IS_LEVEL_REGISTRY.register("sequence")
def _sequence_log_weight(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.broadcast_to(masked_sum(log_ratio, mask, axis=-1)[:, None], log_ratio.shape)


@IS_LEVEL_REGISTRY.register("geometric")
def _geometric_log_weight(log_ratio: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.broadcast_to(masked_mean(log_ratio, mask, axis=-1)[:, None], log_ratio.shape)


def compute_rollout_correction_weights(
    log_ratio: ArrayLike,
    response_mask: ArrayLike,
    rollout_is: str = "token",
    rollout_is_threshold: float = 2.0,
    rollout_is_batch_normalize: bool = False,
    *,
    rollout_is_mode: str = "truncate",
) -> tuple[jax.Array, jax.Array, Metrics]:
    """Importance weights pi_train / pi_rollout at level `rollout_is` (see module docstring).

    Returns (weights, keep_mask, metrics): `weights` [B, T] are constants, 0 on masked
    tokens; truncated at `rollout_is_threshold` in "truncate" mode (keep_mask all ones);
    in "mask" mode untruncated, with keep_mask 0 where the weight is outside
    [1/threshold, threshold]. With `rollout_is_batch_normalize` the weights are divided by
    their masked mean (over tokens, or over sequences for sequence levels) so it is 1.
    Metric names follow verl (`rollout_is_mean`, `..._max`, `..._eff_sample_size`, ...).
    """
    if rollout_is_threshold <= 0:
        raise ValueError(f"rollout_is_threshold must be positive, got {rollout_is_threshold}")
    modes = ("truncate", "mask")
    if rollout_is_mode not in modes:
        raise ValueError(f"Unknown rollout_is_mode {rollout_is_mode!r}. Valid modes: {list(modes)}")
    log_ratio = jax.lax.stop_gradient(as_float(log_ratio))
    mask = as_float(response_mask).astype(log_ratio.dtype)
    upper, lower = rollout_is_threshold, 1.0 / rollout_is_threshold

    log_w = IS_LEVEL_REGISTRY.get_fn(rollout_is)(log_ratio, mask)
    raw = jnp.exp(jnp.clip(log_w, -SAFETY_BOUND, SAFETY_BOUND)) * mask
    metrics = _is_metrics(raw, log_w, mask, rollout_is, upper, lower)

    if rollout_is_mode == "truncate":
        weights = jnp.minimum(raw, upper)
        keep = jnp.ones_like(mask)
    else:
        weights = raw
        keep = ((log_w >= math.log(lower)) & (log_w <= math.log(upper))).astype(mask.dtype)
        metrics["rollout_is_masked_fraction"] = masked_mean(1.0 - keep, mask)
        metrics["rollout_is_seq_masked_fraction"] = _seq_fraction(_seq_any(keep == 0, mask), mask)

    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, mask)
        else:
            seq_valid = (jnp.sum(mask, axis=-1) > 0).astype(mask.dtype)
            mean = safe_divide(jnp.sum(masked_mean(weights, mask, axis=-1) * seq_valid), jnp.sum(seq_valid))
        normalize = mean > 1e-8
        weights = jnp.where(normalize, weights / jnp.where(normalize, mean, 1.0), weights)
        metrics["rollout_is_batch_norm_factor"] = jnp.where(normalize, mean, 1.0)
    return weights, keep, metrics


def _seq_any(flags: jax.Array, mask: jax.Array) -> jax.Array:
    """[B] bool: some unmasked token of the sequence has `flags`."""
    return jnp.any(flags & (mask > 0), axis=-1)


def _seq_fraction(seq_flags: jax.Array, mask: jax.Array) -> jax.Array:
    """Fraction of sequences (with a nonzero mask) that have `seq_flags`."""
    seq_valid = jnp.sum(mask, axis=-1) > 0
    return safe_divide(jnp.sum(seq_flags & seq_valid), jnp.sum(seq_valid))


def _is_metrics(raw: jax.Array, log_w: jax.Array, mask: jax.Array, level: str, upper: float, lower: float) -> Metrics:
    clamped = jnp.clip(raw, lower, upper)
    mean_clamped = masked_mean(clamped, mask)
    var = masked_mean(jnp.square(clamped), mask) - jnp.square(mean_clamped)
    normalized = clamped / (mean_clamped + 1e-8)
    seq_mean = masked_mean(raw, mask, axis=-1)
    seq_valid = (jnp.sum(mask, axis=-1) > 0).astype(mask.dtype)
    return {
        "rollout_is_mean": masked_mean(jnp.minimum(raw, upper), mask),
        "rollout_is_max": jnp.exp(jnp.minimum(_masked_max(log_w, mask), SAFETY_BOUND)),
        "rollout_is_min": jnp.exp(jnp.maximum(_masked_min(log_w, mask), -SAFETY_BOUND)),
        "rollout_is_std": jnp.sqrt(jnp.maximum(var, 0.0)),
        "rollout_is_eff_sample_size": safe_divide(1.0, masked_mean(jnp.square(normalized), mask)),
        "rollout_is_ratio_fraction_high": masked_mean(log_w > math.log(upper), mask),
        "rollout_is_ratio_fraction_low": masked_mean(log_w < math.log(lower), mask),
        "rollout_is_seq_mean": safe_divide(jnp.sum(seq_mean * seq_valid), jnp.sum(seq_valid)),
        "rollout_is_seq_max": _masked_max(seq_mean, seq_valid),
        "rollout_is_seq_min": _masked_min(seq_mean, seq_valid),
    }


@RS_DIVERGENCE_REGISTRY.register("k1")
def _rs_k1(log_ratio: jax.Array) -> jax.Array:
    return -log_ratio


@RS_DIVERGENCE_REGISTRY.register("k2")
def _rs_k2(log_ratio: jax.Array) -> jax.Array:
    return 0.5 * jnp.square(log_ratio)


@RS_DIVERGENCE_REGISTRY.register("k3")
def _rs_k3(log_ratio: jax.Array) -> jax.Array:
    return jnp.exp(log_ratio) - 1.0 - log_ratio


@RS_REDUCTION_REGISTRY.register("token")
def _rs_token(stat: jax.Array, mask: jax.Array) -> jax.Array:
    return stat


@RS_REDUCTION_REGISTRY.register("seq_sum")
def _rs_seq_sum(stat: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.broadcast_to(masked_sum(stat, mask, axis=-1)[:, None], stat.shape)


@RS_REDUCTION_REGISTRY.register("seq_mean")
def _rs_seq_mean(stat: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.broadcast_to(masked_mean(stat, mask, axis=-1)[:, None], stat.shape)


@RS_REDUCTION_REGISTRY.register("seq_max")
def _rs_seq_max(stat: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.broadcast_to(_masked_max(stat, mask, axis=-1)[:, None], stat.shape)


SUPPORTED_ROLLOUT_RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip


def parse_rollout_rs(rollout_rs: str, rollout_rs_threshold: str | float) -> list[tuple[str, float | None, float]]:
    """[(option, lower, upper)] from verl-style option and threshold strings.

    Thresholds: one spec shared by all options, or one per option, comma-separated. For k1
    options the bounds are on log-ratio space after `log` (lower may be None for others).
    """
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    if not options:
        raise ValueError("rollout_rs must name at least one option")
    for option in options:
        if option not in SUPPORTED_ROLLOUT_RS_OPTIONS:
            raise ValueError(f"Unknown rollout_rs option {option!r}. Valid: {list(SUPPORTED_ROLLOUT_RS_OPTIONS)}")
    specs = (
        [str(rollout_rs_threshold)]
        if isinstance(rollout_rs_threshold, int | float)
        else [s.strip() for s in str(rollout_rs_threshold).split(",") if s.strip()]
    )
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(f"rollout_rs_threshold needs 1 or {len(options)} entries, got {len(specs)}")
    parsed = []
    for option, spec in zip(options, specs, strict=True):
        if option.endswith("k1"):
            lower_s, upper_s = spec.split("_", 1) if "_" in spec else (str(1.0 / float(spec)), spec)
            lower, upper = float(lower_s), float(upper_s)
            if lower <= 0 or upper <= 0:
                raise ValueError(f"k1 thresholds must be positive ratios, got {spec!r}")
            parsed.append((option, math.log(lower), math.log(upper)))
        else:
            upper = float(spec)
            if upper <= 0:
                raise ValueError(f"threshold for {option} must be positive, got {spec!r}")
            parsed.append((option, None, upper))
    return parsed


def compute_rollout_rejection_mask(
    log_ratio: ArrayLike,
    response_mask: ArrayLike,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[jax.Array, Metrics]:
    """Hard trust-region rejection: 0 in the returned mask where an option fails.

    Returns (modified_response_mask, metrics). Per option: `rollout_rs_{opt}_mean`,
    `_max`, `_min`, `_masked_fraction`, `_seq_masked_fraction`; overall
    `rollout_rs_masked_fraction` and `rollout_rs_seq_masked_fraction` (verl names).
    `rollout_rs_threshold` is required (None: a `ValueError`, as verl).
    """
    if rollout_rs_threshold is None:
        raise ValueError("rollout_rs_threshold must be given for rejection sampling")
    options = parse_rollout_rs(rollout_rs, rollout_rs_threshold)
    log_ratio = jax.lax.stop_gradient(as_float(log_ratio))
    mask = as_float(response_mask).astype(log_ratio.dtype)
    d = jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    keep = jnp.ones_like(mask)
    metrics: Metrics = {}
    for option, lower, upper in options:
        reduction, divergence = option.rsplit("_", 1)
        stat = RS_REDUCTION_REGISTRY.get_fn(reduction)(RS_DIVERGENCE_REGISTRY.get_fn(divergence)(d), mask)
        ok = stat <= upper if lower is None else (stat >= lower) & (stat <= upper)
        option_keep = ok.astype(mask.dtype)
        keep = keep * option_keep
        prefix = f"rollout_rs_{option}"
        metrics[f"{prefix}_mean"] = masked_mean(stat, mask)
        metrics[f"{prefix}_max"] = _masked_max(stat, mask)
        metrics[f"{prefix}_min"] = _masked_min(stat, mask)
        metrics[f"{prefix}_masked_fraction"] = masked_mean(1.0 - option_keep, mask)
        metrics[f"{prefix}_seq_masked_fraction"] = _seq_fraction(_seq_any(option_keep == 0, mask), mask)
    metrics["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep, mask)
    metrics["rollout_rs_seq_masked_fraction"] = _seq_fraction(_seq_any(keep == 0, mask), mask)
    return mask * keep, metrics


def compute_rollout_veto_mask(
    log_ratio: ArrayLike, response_mask: ArrayLike, rollout_is_veto_threshold: float
) -> tuple[jax.Array, Metrics]:
    """Veto: a [B, 1] keep mask, 0 for sequences with a token whose ratio < threshold.

    Catastrophic tokens (pi_train << pi_rollout) poison the whole sequence (verl's earlier
    `rollout_is_veto_threshold`). Metric: rollout_is_veto_fraction (fraction of sequences).
    """
    log_ratio = jax.lax.stop_gradient(as_float(log_ratio))
    mask = as_float(response_mask)
    vetoed = _seq_any(log_ratio < math.log(rollout_is_veto_threshold), mask)
    return (~vetoed).astype(mask.dtype)[:, None], {"rollout_is_veto_fraction": jnp.mean(vetoed)}


def compute_offpolicy_metrics(
    old_log_prob: ArrayLike, rollout_log_prob: ArrayLike, response_mask: ArrayLike
) -> Metrics:
    """Diagnostics of the rollout / training mismatch (verl `compute_offpolicy_metrics`).

    training_ppl / rollout_ppl (mean over sequences of exp(-mean token log_prob)), their logs,
    kl = mean(log pi_rollout - log pi_train), k3_kl = mean(rho - log rho - 1),
    log_ppl_diff (+ abs, max, min), ppl_ratio, chi2_token = E[rho^2] - 1,
    chi2_seq = E_seq[(prod rho)^2] - 1. Means over sequences use sequences with a nonzero mask.
    """
    train, rollout = jax.lax.stop_gradient(as_float(old_log_prob)), jax.lax.stop_gradient(as_float(rollout_log_prob))
    mask = as_float(response_mask).astype(train.dtype)
    seq_valid = (jnp.sum(mask, axis=-1) > 0).astype(mask.dtype)

    def seq_avg(x: jax.Array) -> jax.Array:
        return safe_divide(jnp.sum(x * seq_valid), jnp.sum(seq_valid))

    mean_lp_train = masked_mean(train, mask, axis=-1)
    mean_lp_rollout = masked_mean(rollout, mask, axis=-1)
    log_ratio = train - rollout
    log_ppl_diff = mean_lp_rollout - mean_lp_train
    rho = jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    log_ratio_sum = jnp.clip(masked_sum(log_ratio, mask, axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": seq_avg(jnp.exp(-mean_lp_train)),
        "training_log_ppl": seq_avg(-mean_lp_train),
        "rollout_ppl": seq_avg(jnp.exp(-mean_lp_rollout)),
        "rollout_log_ppl": seq_avg(-mean_lp_rollout),
        "kl": masked_mean(rollout - train, mask),
        "k3_kl": masked_mean(rho - jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND) - 1.0, mask),
        "log_ppl_diff": seq_avg(log_ppl_diff),
        "log_ppl_abs_diff": seq_avg(jnp.abs(log_ppl_diff)),
        "log_ppl_diff_max": _masked_max(log_ppl_diff, seq_valid),
        "log_ppl_diff_min": _masked_min(log_ppl_diff, seq_valid),
        "ppl_ratio": seq_avg(jnp.exp(log_ppl_diff)),
        "chi2_token": masked_mean(jnp.square(rho), mask) - 1.0,
        "chi2_seq": seq_avg(jnp.exp(2.0 * log_ratio_sum)) - 1.0,
    }


def compute_rollout_probs_diff_metrics(
    log_prob: ArrayLike, rollout_log_prob: ArrayLike, response_mask: ArrayLike
) -> Metrics:
    """|p_train - p_rollout| of sampled tokens (probabilities, not log_probs), as verl's debug
    metrics: training/rollout_probs_diff_{max,mean,std} and the Pearson correlation of the
    two probabilities, training/rollout_actor_probs_pearson_corr (MiniMax-M1, arXiv:2506.13585).
    std is the unbiased std over unmasked tokens.
    """
    p = jnp.exp(jax.lax.stop_gradient(as_float(log_prob)))
    q = jnp.exp(jax.lax.stop_gradient(as_float(rollout_log_prob)))
    mask = as_float(response_mask).astype(p.dtype)
    diff = jnp.abs(p - q)
    n = jnp.sum(mask)
    mean = masked_mean(diff, mask)
    var = safe_divide(masked_sum(jnp.square(diff - mean), mask), n - 1.0)
    cov = masked_mean((p - masked_mean(p, mask)) * (q - masked_mean(q, mask)), mask)
    var_p = masked_mean(jnp.square(p - masked_mean(p, mask)), mask)
    var_q = masked_mean(jnp.square(q - masked_mean(q, mask)), mask)
    return {
        "training/rollout_probs_diff_max": _masked_max(diff, mask),
        "training/rollout_probs_diff_mean": mean,
        "training/rollout_probs_diff_std": jnp.sqrt(jnp.maximum(var, 0.0)),
        "training/rollout_actor_probs_pearson_corr": safe_divide(cov, jnp.sqrt(var_p * var_q)),
    }


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: ArrayLike,
    rollout_log_prob: ArrayLike,
    response_mask: ArrayLike,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
    *,
    rollout_is_mode: str = "truncate",
    rollout_is_veto_threshold: float | None = None,
) -> tuple[jax.Array | None, jax.Array, Metrics]:
    """IS weights, rejection mask and diagnostics in one call (verl's unified entry point).

    Args:
        old_log_prob: [B, T] trainer log_probs (pi_train).
        rollout_log_prob: [B, T] sampler log_probs (pi_rollout).
        response_mask: [B, T].
        rollout_is: None (no weights) or a level: "token", "sequence", "geometric".
        rollout_is_threshold / rollout_is_mode / rollout_is_batch_normalize: see
            `compute_rollout_correction_weights`.
        rollout_rs / rollout_rs_threshold: see `compute_rollout_rejection_mask`.
        rollout_is_veto_threshold: see `compute_rollout_veto_mask`.

    Returns:
        (rollout_is_weights or None, modified_response_mask, metrics); every metric key is
        prefixed "rollout_corr/". Multiply `rollout_is_weights` into the loss
        (`rollout_is_weights=` of the policy losses) and train on `modified_response_mask`.
    """
    log_ratio = as_float(old_log_prob) - as_float(rollout_log_prob)
    mask = as_float(response_mask)
    metrics: Metrics = {}
    weights = None
    modified = mask
    if rollout_is is not None:
        weights, keep, is_metrics = compute_rollout_correction_weights(
            log_ratio, mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize,
            rollout_is_mode=rollout_is_mode,
        )
        modified = modified * keep
        metrics.update(is_metrics)
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError("rollout_rs_threshold must be given when rollout_rs is set")
        rs_mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, mask, rollout_rs, rollout_rs_threshold)
        modified = modified * rs_mask
        metrics.update(rs_metrics)
    if rollout_is_veto_threshold is not None:
        veto, veto_metrics = compute_rollout_veto_mask(log_ratio, mask, rollout_is_veto_threshold)
        modified = modified * veto
        metrics.update(veto_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, mask))
    return weights, modified, {f"rollout_corr/{k}": v for k, v in metrics.items()}


__all__ = [
    "IS_LEVEL_REGISTRY",
    "SAFETY_BOUND",
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "compute_offpolicy_metrics",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_probs_diff_metrics",
    "compute_rollout_rejection_mask",
    "compute_rollout_veto_mask",
    "parse_rollout_rs",
]
