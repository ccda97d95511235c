"""Advantage estimators and masked statistics: hand-computed cases and numpy references."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.algos import (
    ADV_ESTIMATOR_REGISTRY,
    AdvantageInputs,
    compute_advantages,
    compute_dr_grpo_outcome_advantage,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator,
    get_adv_estimator_fn,
    masked_mean,
    masked_var,
    masked_whiten,
)
from rljax.algos.advantages import group_sum


def _close(x, y, tol=1e-5):
    np.testing.assert_allclose(np.asarray(x), y, rtol=tol, atol=tol)


def J(fn, *arrays, **static):
    return jax.jit(functools.partial(fn, **static))(*arrays)


def outcome(scores, length=3):
    """[B, T] token-level rewards with each score on the last token."""
    r = np.zeros((len(scores), length), np.float32)
    r[:, -1] = scores
    return r


# ---------------------------------------------------------------- masked statistics
def test_masked_stats_against_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5))
    m = rng.random((3, 5)) > 0.4
    sel = x[m]

    @jax.jit
    def stats(x, m):
        return (masked_mean(x, m), masked_var(x, m), masked_var(x, m, unbiased=False), masked_whiten(x, m),
                masked_whiten(x, m, shift_mean=False), masked_mean(x, m, axis=-1))  # fmt: skip

    mean, var, var_biased, w, w2, row_means = stats(x, m)
    _close(mean, sel.mean())
    _close(var, sel.var(ddof=1))  # unbiased, as verl
    _close(var_biased, sel.var())
    _close(np.asarray(w)[m], (sel - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8))
    _close(np.asarray(w2)[m], (sel - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8) + sel.mean())
    _close(row_means, [x[i][m[i]].mean() if m[i].any() else 0.0 for i in range(3)])


# ---------------------------------------------------------------- GAE
def gae_reference(rewards, values, mask, gamma, lam):
    """Plain loop from the recursion: masked tokens neither advance nor receive it (0 there)."""
    b, t = rewards.shape
    adv = np.zeros((b, t))
    for i in range(b):
        next_value, next_adv = 0.0, 0.0
        for s in reversed(range(t)):
            if mask[i, s]:
                delta = rewards[i, s] + gamma * next_value - values[i, s]
                next_value, next_adv = values[i, s], delta + gamma * lam * next_adv
                adv[i, s] = next_adv
    return adv, np.where(mask > 0, adv + values, 0.0)


def test_gae_hand_computed():
    # gamma = lam = 1, rewards (0, 0, 1), values (0.5, 0.6, 0.7):
    # delta_2 = 1 - 0.7 = 0.3, A_2 = 0.3; delta_1 = 0.7 - 0.6 = 0.1, A_1 = 0.4; delta_0 = 0.1, A_0 = 0.5
    # returns = A + V = (1, 1, 1); whitened A: mean 0.4, unbiased std 0.1
    r, v, m = np.array([[0.0, 0.0, 1.0]]), np.array([[0.5, 0.6, 0.7]]), np.ones((1, 3))
    adv, ret = J(compute_gae_advantage_return, r, v, m, gamma=1.0, lam=1.0)
    _close(ret, [[1.0, 1.0, 1.0]])
    _close(adv, [[1.0, 0.0, -1.0]], tol=1e-4)


def test_gae_multi_turn_skips_masked_tokens():
    # token 1 is a tool observation (mask 0, value 9 must be ignored):
    # t2: delta 0.3, A 0.3; t1 skipped (carries V_next = 0.7, A_next = 0.3); t0: delta 0.7 - 0.5 = 0.2, A = 0.5
    r, v, m = np.array([[0.0, 0.0, 1.0]]), np.array([[0.5, 9.0, 0.7]]), np.array([[1.0, 0.0, 1.0]])
    adv, ret = J(compute_gae_advantage_return, r, v, m, gamma=1.0, lam=1.0)
    _close(np.asarray(ret)[0, [0, 2]], [1.0, 1.0])
    # whitening over the two policy tokens (0.5, 0.3): mean 0.4, unbiased std sqrt(0.02)
    _close(np.asarray(adv)[0, [0, 2]], [0.1 / math.sqrt(0.02), -0.1 / math.sqrt(0.02)], tol=1e-4)


def test_gae_against_reference_loop():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(4, 9)).astype(np.float32)
    v = rng.normal(size=(4, 9)).astype(np.float32)
    m = (rng.random((4, 9)) > 0.3).astype(np.float32)
    adv, ret = J(compute_gae_advantage_return, r, v, m, gamma=0.9, lam=0.8)
    ref_adv, ref_ret = gae_reference(r, v, m, 0.9, 0.8)
    _close(ret, ref_ret, tol=1e-4)
    sel = ref_adv[m > 0]
    _close(np.asarray(adv)[m > 0], (sel - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8), tol=1e-4)


# ---------------------------------------------------------------- group estimators
IDX = np.array([0, 0, 0, 1, 1])
SCORES = np.array([1.0, 0.0, 0.0, 1.0, 1.0])


def test_grpo_hand_computed():
    # group 0: (1, 0, 0): mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    # group 1: (1, 1): mean 1, std 0 -> 0 / (0 + 1e-6) = 0
    adv, ret = J(compute_grpo_outcome_advantage, outcome(SCORES), np.ones((5, 3)), IDX)
    s = math.sqrt(1 / 3)
    _close(np.asarray(adv)[:, 0], [(2 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6), 0, 0])
    _close(adv, ret)
    # Dr. GRPO: no std division
    adv, _ = J(compute_dr_grpo_outcome_advantage, outcome(SCORES), np.ones((5, 3)), IDX)
    _close(np.asarray(adv)[:, 0], [2 / 3, -1 / 3, -1 / 3, 0, 0])
    adv2, _ = J(compute_grpo_outcome_advantage, outcome(SCORES), np.ones((5, 3)), IDX, norm_adv_by_std_in_grpo=False)
    _close(adv, adv2)


def test_grpo_single_sample_group_and_mask():
    # a single-sample group has mean 0, std 1 (verl): A = s / (1 + 1e-6); advantages vanish off-mask
    mask = np.array([[0, 1, 1], [0, 1, 0], [0, 1, 1]])
    adv, _ = J(compute_grpo_outcome_advantage, outcome([2.0, 0.0, 3.0]), mask, np.array([0, 0, 1]))
    _close(adv, [[0, 1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6)], [0, -1 / (math.sqrt(2) + 1e-6), 0],
                 [0, 3 / (1 + 1e-6), 3 / (1 + 1e-6)]])  # fmt: skip


@st.composite
def groups(draw):
    b = 8
    index = np.array(draw(st.lists(st.integers(0, 3), min_size=b, max_size=b)))
    scores = np.array(draw(st.lists(st.floats(-5, 5, width=32), min_size=b, max_size=b)), np.float32)
    return index, scores


@functools.cache
def _group_fns():
    @jax.jit
    def run(rewards, index):
        mask = jnp.ones_like(rewards)
        return {
            name: get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=mask, index=index)[0][:, -1]
            for name in ("grpo", "dr_grpo", "rloo", "gpg")
        }

    return run


@settings(max_examples=30, deadline=None)
@given(groups())
def test_group_advantages_sum_to_zero(data):
    index, scores = data
    out = _group_fns()(outcome(scores), index)
    multi = np.bincount(index, minlength=8)[index] > 1
    for name, adv in out.items():
        per_group = np.asarray(group_sum(adv, index))
        assert np.allclose(per_group[multi], 0.0, atol=1e-3 * (1 + np.abs(scores).max())), name


def test_rloo_hand_computed():
    # group (1, 0, 0): A_i = s_i - mean of the others: 1 - 0, 0 - 1/2, 0 - 1/2; group (1, 1): 0, 0
    adv, _ = J(compute_rloo_outcome_advantage, outcome(SCORES), np.ones((5, 3)), IDX)
    _close(np.asarray(adv)[:, -1], [1.0, -0.5, -0.5, 0.0, 0.0])
    adv, _ = J(compute_rloo_outcome_advantage, outcome([2.0]), np.ones((1, 3)), np.array([0]))
    _close(np.asarray(adv)[:, -1], [2.0])  # single sample keeps its score (verl)


def test_opo_hand_computed():
    # scores (1, 0) with lengths (2, 4): baseline (2 * 1 + 4 * 0) / 6 = 1/3
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]])
    adv, _ = J(compute_opo_outcome_advantage, outcome([1.0, 0.0], 4), mask, np.array([0, 0]))
    _close(adv, [[2 / 3, 2 / 3, 0, 0], [-1 / 3, -1 / 3, -1 / 3, -1 / 3]])


def test_gpg_hand_computed():
    # scores (1, 0 | 0, 1): 2 nonzero of 4 -> alpha = 2; group means 0.5 -> A = 2 (s - 0.5)
    adv, _ = J(compute_gpg_outcome_advantage, outcome([1.0, 0.0, 0.0, 1.0]), np.ones((4, 3)), np.array([0, 0, 1, 1]))
    _close(np.asarray(adv)[:, 0], [1.0, -1.0, -1.0, 1.0])


def test_grpo_passk_hand_computed():
    # group (0.2, 0.9, 0.5): best is sample 1, gap 0.9 - 0.5 = 0.4, unbiased std:
    # mean 1.6/3; squared deviations sum 0.24667 -> var 0.12333 -> std 0.351188
    scores = np.array([0.2, 0.9, 0.5])
    std = np.std(scores, ddof=1)
    adv, _ = J(compute_grpo_passk_outcome_advantage, outcome(scores), np.ones((3, 3)), np.array([0, 0, 0]))
    _close(np.asarray(adv)[:, -1], [0.0, 0.4 / (std + 1e-6), 0.0])
    adv, _ = J(compute_grpo_passk_outcome_advantage, outcome(scores), np.ones((3, 3)), np.array([0, 0, 0]),
               norm_adv_by_std_in_grpo=False)  # fmt: skip
    _close(np.asarray(adv)[:, -1], [0.0, 0.4, 0.0])
    with pytest.raises(ValueError, match="at least 2"):
        compute_grpo_passk_outcome_advantage(outcome([1.0, 2.0, 3.0]), np.ones((3, 3)), np.array([0, 0, 1]))


def returns_reference(rewards, mask, gamma):
    """Plain loop: discount over sampled tokens only; masked tokens are skipped (return 0)."""
    b, t = rewards.shape
    out = np.zeros((b, t))
    for i in range(b):
        running = 0.0
        for s in reversed(range(t)):
            if mask[i, s]:
                running = rewards[i, s] + gamma * running
                out[i, s] = running
    return out


def test_reinforce_plus_plus():
    # gamma 0.5, reward 1 on the last token: returns (0.25, 0.5, 1) then batch whitening
    r = np.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    m = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = J(compute_reinforce_plus_plus_outcome_advantage, r, m, gamma=0.5)
    ref = returns_reference(r, m, 0.5)
    _close(ret, ref)
    _close(np.asarray(ret)[0], [0.25, 0.5, 1.0])
    sel = ref[m > 0]
    expected = np.where(m > 0, (ref - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8), 0.0)
    _close(adv, expected, tol=1e-4)


def test_reinforce_plus_plus_against_reference_loop():
    rng = np.random.default_rng(1)
    r = rng.normal(size=(4, 9)).astype(np.float32)
    m = (rng.random((4, 9)) > 0.3).astype(np.float32)
    _, ret = J(compute_reinforce_plus_plus_outcome_advantage, r, m, gamma=0.9)
    _close(ret, returns_reference(r, m, 0.9), tol=1e-4)


def test_reinforce_plus_plus_baseline():
    # group means subtracted: (1, 0) -> (0.5, -0.5); single (3) -> 3; then whitening over tokens
    mask = np.array([[1, 1], [1, 0], [1, 1]], np.float32)
    adv, _ = J(
        compute_reinforce_plus_plus_baseline_outcome_advantage, outcome([1.0, 0.0, 3.0], 2), mask, np.array([0, 0, 1])
    )
    centered = np.array([[0.5, 0.5], [-0.5, -0.5], [3.0, 3.0]]) * mask
    sel = centered[mask > 0]
    _close(adv, (centered - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8) * mask, tol=1e-4)


def test_remax():
    # returns = reverse cumsum of masked rewards = (1, 1, 1, 0); A = G - 0.4 m
    r = np.array([[0.0, 0.0, 1.0, 0.0]])
    m = np.array([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = J(compute_remax_outcome_advantage, r, np.array([0.4]), m)
    _close(ret, [[1.0, 1.0, 1.0, 0.0]])
    _close(adv, [[0.6, 0.6, 0.6, 0.0]])


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATOR_REGISTRY))
def test_every_estimator_jits_with_one_superset_of_kwargs(name):
    rng = np.random.default_rng(0)
    kwargs = dict(
        token_level_rewards=outcome(rng.normal(size=6), 4),
        response_mask=np.ones((6, 4), np.float32),
        values=rng.normal(size=(6, 4)).astype(np.float32),
        index=np.array([0, 0, 1, 1, 2, 2]),
        reward_baselines=rng.normal(size=6).astype(np.float32),
    )
    fn = get_adv_estimator_fn(name)
    adv, ret = jax.jit(lambda kw: fn(**kw, gamma=0.99, lam=0.95, epsilon=1e-6, norm_adv_by_std_in_grpo=True))(kwargs)
    assert adv.shape == ret.shape == (6, 4) and adv.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(adv)))


# ---------------------------------------------------------------- specs and typed inputs
def test_estimator_specs_declare_what_they_need():
    registry = ADV_ESTIMATOR_REGISTRY
    flags = {name: (s.needs_critic, s.needs_greedy_baseline, s.uses_groups) for name, s in registry.items()}
    assert flags["gae"] == (True, False, False)
    assert flags["remax"] == (False, True, False)
    assert flags["grpo"] == (False, False, True)
    assert [n for n, (critic, _, _) in flags.items() if critic] == ["gae"]
    assert [n for n, (_, greedy, _) in flags.items() if greedy] == ["remax"]
    assert {n for n, s in ADV_ESTIMATOR_REGISTRY.items() if s.min_group_size > 1} == {"grpo", "dr_grpo", "grpo_passk"}
    assert get_adv_estimator("grpo").fn is compute_grpo_outcome_advantage


def test_a_misspelt_or_missing_keyword_is_an_error():
    r, m = outcome([1.0, 0.0]), np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="gama"):
        compute_gae_advantage_return(r, np.zeros_like(r), m, 0.9, 1.0, gama=0.9)
    with pytest.raises(TypeError, match="norm_adv_by_std"):
        get_adv_estimator_fn("grpo")(token_level_rewards=r, response_mask=m, index=np.array([0, 0]),
                                     norm_adv_by_std=False)  # fmt: skip
    with pytest.raises(TypeError, match="index"):
        compute_grpo_outcome_advantage(r, m)
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages("grpo", AdvantageInputs(r, m))
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", AdvantageInputs(r, m, group_ids=np.array([0, 0])))


def test_compute_advantages_is_the_keyword_function():
    rng = np.random.default_rng(3)
    r, m = outcome(rng.normal(size=4), 4), (rng.random((4, 4)) > 0.3).astype(np.float32)
    v, index = rng.normal(size=(4, 4)).astype(np.float32), np.array([0, 0, 1, 1])
    inputs = AdvantageInputs(r, m, values=v, group_ids=index)

    @jax.jit
    def both(r, m, v, index):
        inputs = AdvantageInputs(r, m, values=v, group_ids=index)
        return (compute_advantages("gae", inputs, gamma=0.9, lam=0.8),
                compute_gae_advantage_return(r, v, m, gamma=0.9, lam=0.8),
                compute_advantages(get_adv_estimator("grpo"), inputs, norm_adv_by_std_in_grpo=False),
                compute_dr_grpo_outcome_advantage(r, m, index))  # fmt: skip

    gae, gae_kw, grpo, dr_grpo = both(r, m, v, index)
    for x, y in ((gae, gae_kw), (grpo, dr_grpo)):
        _close(x[0], y[0])
        _close(x[1], y[1])
    assert inputs.num_groups is None
