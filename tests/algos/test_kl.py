"""KL estimators, straight-through variants, full-vocab KL, KL loss / penalty, controllers."""

import functools
import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rljax.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    compute_rewards,
    get_kl_controller,
    kl_from_logits,
    kl_penalty,
)

# d = log pi - log pi_ref = (0.5, -1.0)
LOGP = np.array([[-1.0, -2.0]])
REF = np.array([[-1.5, -1.0]])
# k3: log r = log pi_ref - log pi = (-0.5, 1.0); r - log r - 1 = (e^-0.5 + 0.5 - 1, e - 2)
EXPECTED = {
    "kl": [0.5, -1.0],
    "k1": [0.5, -1.0],
    "abs": [0.5, 1.0],
    "mse": [0.125, 0.5],
    "k2": [0.125, 0.5],
    "low_var_kl": [math.exp(-0.5) - 0.5, math.e - 2.0],
    "k3": [math.exp(-0.5) - 0.5, math.e - 2.0],
}


def _values_and_grads(name, logp, ref):
    fn = jax.jit(jax.vmap(jax.value_and_grad(lambda a, b: kl_penalty(a, b, name)), in_axes=(0, 0)))
    values, grads = fn(jnp.asarray(logp).reshape(-1), jnp.asarray(ref).reshape(-1))
    return np.asarray(values), np.asarray(grads)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_estimators_hand_computed(name):
    values, _ = _values_and_grads(name, LOGP, REF)
    np.testing.assert_allclose(values, EXPECTED[name], rtol=1e-6)


def test_k3_clamps():
    # log r = clamp(+-30 -> +-20): e^20 - 21 -> clamped to 10; e^-20 + 19 -> clamped to 10
    out = kl_penalty(np.array([0.0, 30.0]), np.array([30.0, 0.0]), "k3")
    np.testing.assert_allclose(out, [10.0, 10.0])
    assert float(kl_penalty(np.array([0.0]), np.array([-25.0]), "k3")[0]) == 10.0  # e^-20 + 20 - 1 = 19 -> 10


@pytest.mark.parametrize(
    "plus, base", [("k1+", "k1"), ("kl+", "kl"), ("k3+", "k3"), ("low_var_kl+", "low_var_kl"), ("abs+", "abs")]
)
def test_straight_through_value_of_base_gradient_of_k2(plus, base):
    rng = np.random.default_rng(0)
    logp, ref = rng.normal(-2, 1, 16), rng.normal(-2, 1, 16)
    v_plus, g_plus = _values_and_grads(plus, logp, ref)
    v_base, _ = _values_and_grads(base, logp, ref)
    _, g_k2 = _values_and_grads("k2", logp, ref)
    np.testing.assert_allclose(v_plus, v_base, rtol=1e-6)
    np.testing.assert_allclose(g_plus, g_k2, rtol=1e-6)
    np.testing.assert_allclose(g_k2, logp - ref, rtol=1e-5)  # d/d logp of d^2/2 is d


def test_kl_from_logits_against_torch():
    rng = np.random.default_rng(1)
    logits, ref_logits = rng.normal(size=(2, 3, 7)), rng.normal(size=(2, 3, 7))
    ours = jax.jit(functools.partial(kl_from_logits, temperature=0.7))(logits, ref_logits)
    p = torch.log_softmax(torch.tensor(logits) / 0.7, -1)
    q = torch.log_softmax(torch.tensor(ref_logits) / 0.7, -1)
    theirs = torch.nn.functional.kl_div(q, p, log_target=True, reduction="none").sum(-1)  # sum p (log p - log q)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-6)
    assert np.allclose(kl_from_logits(logits, logits), 0.0, atol=1e-6)


def test_kl_loss_and_rewards():
    mask = np.array([[1, 0]])
    loss, metrics = jax.jit(functools.partial(compute_kl_loss, kl_loss_type="k1"))(LOGP, REF, mask)
    assert float(loss) == pytest.approx(0.5) and float(metrics["actor/kl_loss"]) == pytest.approx(0.5)
    # k3 loss gradient: d/d log pi of (e^(ref - lp) - (ref - lp) - 1) = 1 - e^(ref - lp); token 0 only
    grad = jax.jit(jax.grad(lambda lp: compute_kl_loss(lp, REF, mask, kl_loss_type="k3")[0]))(LOGP)
    np.testing.assert_allclose(grad, [[1.0 - math.exp(-0.5), 0.0]], rtol=1e-6)
    # r = scores - 0.1 * (log pi_old - log pi_ref)
    np.testing.assert_allclose(compute_rewards(np.array([[0.0, 1.0]]), LOGP, REF, 0.1), [[-0.05, 1.1]], rtol=1e-6)


def test_apply_kl_penalty_hand_computed():
    # k1 = (0.5, 0, -0.5); rewards = scores - 0.1 * k1 * m; current_kl = mean over sequences of masked means
    scores = np.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old = np.array([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    ref = np.array([[-1.5, -1.0, -0.5], [-2.0, -2.0, -2.0]])
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    rewards, metrics = jax.jit(apply_kl_penalty)(scores, old, ref, mask, 0.1)
    np.testing.assert_allclose(rewards, [[-0.05, 0.0, 1.05], [-0.1, 1.9, 0.0]], rtol=1e-6, atol=1e-7)
    # row 0 mean 0; row 1 mean 1 -> 0.5
    assert float(metrics["actor/reward_kl_penalty"]) == pytest.approx(0.5)
    assert float(metrics["actor/reward_kl_penalty_coeff"]) == pytest.approx(0.1)


def test_controllers():
    fixed = FixedKLController(0.2)
    assert fixed.update(5.0, 10).value == 0.2
    ctrl = AdaptiveKLController(value=0.1, target=0.05, horizon=100)
    # error clip(0.1 / 0.05 - 1) = 0.2 -> value * (1 + 0.2 * 10 / 100) = 0.102
    assert ctrl.update(0.1, 10).value == pytest.approx(0.102)
    # error 0.045 / 0.05 - 1 = -0.1 -> value * (1 - 0.1 * 10 / 100) = 0.099
    assert ctrl.update(0.045, 10).value == pytest.approx(0.099)
    assert ctrl.value == 0.1  # immutable
    # also with a jax scalar, inside jit
    value = jax.jit(lambda kl: ctrl.update(kl, 10).value)(jnp.float32(0.1))
    assert float(value) == pytest.approx(0.102)
    # verl's signature: one attribute-style config (its KLControlConfig), or a mapping
    adaptive = get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.1, target_kl=0.05, horizon=100))
    assert adaptive == AdaptiveKLController(value=0.1, target=0.05, horizon=100)
    assert get_kl_controller({"type": "fixed", "kl_coef": 0.3}) == FixedKLController(0.3)
    with pytest.raises(ValueError, match="Valid types"):
        get_kl_controller(SimpleNamespace(type="pid", kl_coef=0.1))
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 0.05, 0)
