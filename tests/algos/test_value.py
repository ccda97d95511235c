"""Clipped value loss."""

import functools

import jax
import numpy as np
import pytest

from rljax.algos import add_terms, compute_value_loss


def test_value_loss_hand_computed():
    # t0: V_clip = clip(1.0, 0.3, 0.7) = 0.7; (1 - 2)^2 = 1 < (0.7 - 2)^2 = 1.69 -> 1.69 (clipped)
    # t1: V_clip = clip(2.0, 1.8, 2.2) = 2.0; (2 - 1)^2 = 1 both -> 1
    # t2: masked. loss = 0.5 * (1.69 + 1) / 2
    vpreds = np.array([[1.0, 2.0, 5.0]])
    returns = np.array([[2.0, 1.0, 0.0]])
    values = np.array([[0.5, 2.0, 0.0]])
    mask = np.array([[1, 1, 0]])
    f = jax.jit(functools.partial(compute_value_loss, cliprange_value=0.2))
    loss, metrics = f(vpreds, returns, values, mask)
    assert float(loss) == pytest.approx(0.5 * 2.69 / 2)
    assert float(metrics["critic/vf_loss"]) == pytest.approx(0.5 * 2.69 / 2)
    assert float(metrics["critic/vf_clipfrac"]) == pytest.approx(0.5)
    # gradient: t0 clipped branch is constant in vpreds -> 0; t1: 0.5 * 2 (2 - 1) / 2 = 0.5
    grad = jax.jit(jax.grad(lambda v: f(v, returns, values, mask)[0]))(vpreds)
    np.testing.assert_allclose(grad, [[0.0, 0.5, 0.0]], atol=1e-6)


def test_value_loss_terms_add_over_micro_batches():
    rng = np.random.default_rng(0)
    v, r, old = (rng.normal(size=(4, 5)) for _ in range(3))
    m = rng.random((4, 5)) > 0.3
    f = jax.jit(functools.partial(compute_value_loss, cliprange_value=0.5, return_terms=True))
    whole, _ = f(v, r, old, m)
    parts = add_terms(f(v[:1], r[:1], old[:1], m[:1])[0], f(v[1:], r[1:], old[1:], m[1:])[0])
    assert float(parts.value) == pytest.approx(float(whole.value), rel=1e-6)
