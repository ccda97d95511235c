"""Rollout correction: truncated IS weights, rejection / veto masks, mismatch metrics."""

import functools
import math

import jax
import numpy as np
import pytest

from rljax.algos import (
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_probs_diff_metrics,
    compute_rollout_rejection_mask,
)

# rho = pi_train / pi_rollout; row 0: (3, 0.6, 1), row 1: (1.2, 0.25, padding)
RHO = np.array([[3.0, 0.6, 1.0], [1.2, 0.25, 1.0]])
LOG_RATIO = np.log(RHO)
MASK = np.array([[1, 1, 1], [1, 1, 0]])


def J(fn, *arrays, **static):
    return jax.jit(functools.partial(fn, **static))(*arrays)


def _close(x, y, tol=1e-5):
    np.testing.assert_allclose(np.asarray(x), y, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "level, expected",
    [
        ("token", [[2.0, 0.6, 1.0], [1.2, 0.25, 0.0]]),  # min(rho, 2)
        ("sequence", [[1.8, 1.8, 1.8], [0.3, 0.3, 0.0]]),  # prod: 3 * 0.6 * 1, 1.2 * 0.25
        ("geometric", [[1.8 ** (1 / 3)] * 3, [math.sqrt(0.3), math.sqrt(0.3), 0.0]]),
    ],
)
def test_truncated_is_weights(level, expected):
    weights, keep, metrics = J(compute_rollout_correction_weights, LOG_RATIO, MASK, rollout_is=level)
    _close(weights, expected)
    _close(keep, np.ones((2, 3)))
    if level == "token":
        _close(metrics["rollout_is_mean"], (2 + 0.6 + 1 + 1.2 + 0.25) / 5)
        _close(metrics["rollout_is_max"], 3.0)  # before truncation
        _close(metrics["rollout_is_ratio_fraction_high"], 1 / 5)  # 3 > 2
        _close(metrics["rollout_is_ratio_fraction_low"], 1 / 5)  # 0.25 < 1/2


def test_is_weights_have_no_gradient():
    grad = jax.jit(jax.grad(lambda lr: compute_rollout_correction_weights(lr, MASK)[0].sum()))(LOG_RATIO)
    assert float(np.abs(grad).sum()) == 0.0


def test_masked_is_mode():
    # keep tokens with rho in [0.5, 2]: row 0 rejects 3, row 1 rejects 0.25; weights untruncated
    weights, keep, metrics = J(compute_rollout_correction_weights, LOG_RATIO, MASK, rollout_is_mode="mask")
    _close(weights, [[3.0, 0.6, 1.0], [1.2, 0.25, 0.0]])
    _close(np.asarray(keep) * MASK, [[0, 1, 1], [1, 0, 0]])
    _close(metrics["rollout_is_masked_fraction"], 2 / 5)
    _close(metrics["rollout_is_seq_masked_fraction"], 1.0)
    # sequence level: 1.8 kept, 0.3 rejected
    _, keep, _ = J(compute_rollout_correction_weights, LOG_RATIO, MASK, rollout_is="sequence", rollout_is_mode="mask")
    _close(np.asarray(keep) * MASK, [[1, 1, 1], [0, 0, 0]])


def test_batch_normalize():
    weights, _, metrics = J(compute_rollout_correction_weights, LOG_RATIO, MASK, rollout_is_batch_normalize=True)
    _close(metrics["rollout_is_batch_norm_factor"], 5.05 / 5)
    _close(np.asarray(weights)[MASK > 0].mean(), 1.0)


@pytest.mark.parametrize(
    "option, threshold, expected",
    [
        ("token_k1", "0.5_2.0", [[0, 1, 1], [1, 0, 0]]),  # keep 0.5 <= rho <= 2
        ("token_k1", 2.0, [[0, 1, 1], [1, 0, 0]]),  # one number u: [1/u, u]
        # k3 = rho - 1 - log rho; means: row 0 (0.901388 + 0.110826 + 0) / 3 = 0.337405,
        # row 1 (0.017678 + 0.636294) / 2 = 0.326986; threshold 0.33 rejects row 0
        ("seq_mean_k3", 0.33, [[0, 0, 0], [1, 1, 0]]),
        # k2 = (log rho)^2 / 2; max: row 0 0.603474, row 1 0.960906; threshold 0.7 rejects row 1
        ("seq_max_k2", 0.7, [[1, 1, 1], [0, 0, 0]]),
        # k1 sum = -sum log rho: row 0 -log 1.8 = -0.5878, row 1 -log 0.3 = 1.2040; bounds log 0.5, log 2
        ("seq_sum_k1", "0.5_2.0", [[1, 1, 1], [0, 0, 0]]),
        ("token_k1,seq_max_k2", "0.5_2.0,0.7", [[0, 1, 1], [0, 0, 0]]),  # both must pass
    ],
)
def test_rejection_masks(option, threshold, expected):
    mask, metrics = J(
        compute_rollout_rejection_mask, LOG_RATIO, MASK, rollout_rs=option, rollout_rs_threshold=threshold
    )
    _close(mask, expected)
    kept = np.asarray(expected).sum()
    _close(metrics["rollout_rs_masked_fraction"], 1 - kept / 5)


def test_rejection_option_validation():
    with pytest.raises(ValueError, match="Unknown rollout_rs"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k4", 1.0)
    with pytest.raises(ValueError, match="entries"):
        compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k2,token_k3", "1,2,3")


def test_unified_entry_point_with_veto():
    rollout = np.full((2, 3), -1.0)
    train = rollout + LOG_RATIO
    weights, mask, metrics = J(
        compute_rollout_correction_and_rejection_mask, train, rollout, MASK,
        rollout_is="token", rollout_rs="seq_max_k2", rollout_rs_threshold=2.0, rollout_is_veto_threshold=0.3,
    )  # fmt: skip
    _close(weights, [[2.0, 0.6, 1.0], [1.2, 0.25, 0.0]])
    _close(mask, [[1, 1, 1], [0, 0, 0]])  # row 1 vetoed: 0.25 < 0.3
    assert all(k.startswith("rollout_corr/") for k in metrics)
    _close(metrics["rollout_corr/rollout_is_veto_fraction"], 0.5)
    # kl = mean(log pi_rollout - log pi_train) = -log(3 * 0.6 * 1 * 1.2 * 0.25) / 5
    _close(metrics["rollout_corr/kl"], -math.log(0.54) / 5)


def test_offpolicy_metrics_hand_computed():
    rollout = np.full((2, 3), -1.0)
    m = J(compute_offpolicy_metrics, rollout + LOG_RATIO, rollout, MASK)
    _close(m["chi2_token"], (9 + 0.36 + 1 + 1.44 + 0.0625) / 5 - 1)  # E[rho^2] - 1
    _close(m["chi2_seq"], (1.8**2 + 0.3**2) / 2 - 1)  # E[(prod rho)^2] - 1
    _close(m["rollout_ppl"], math.e)  # every rollout log_prob is -1
    # k3 = rho - log rho - 1 per token
    k3 = [r - math.log(r) - 1 for r in (3.0, 0.6, 1.0, 1.2, 0.25)]
    _close(m["k3_kl"], sum(k3) / 5)


def test_probs_diff_metrics():
    # p = (0.5, 0.2), q = (0.4, 0.2): |diff| = (0.1, 0); max 0.1, mean 0.05, unbiased std 0.0707
    m = J(
        compute_rollout_probs_diff_metrics, np.log([[0.5, 0.2, 0.9]]), np.log([[0.4, 0.2, 0.1]]), np.array([[1, 1, 0]])
    )
    _close(m["training/rollout_probs_diff_max"], 0.1)
    _close(m["training/rollout_probs_diff_mean"], 0.05)
    _close(m["training/rollout_probs_diff_std"], math.sqrt(0.005))
    _close(m["training/rollout_actor_probs_pearson_corr"], 1.0)
