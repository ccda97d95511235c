"""DPO family and Bradley-Terry: hand-computed values, metrics, gradients."""

import functools
import math

import jax
import numpy as np
import pytest
import torch

from rljax.algos import bradley_terry_loss, dpo_loss, sequence_log_probs


def log1p_exp(x):
    return math.log1p(math.exp(x))  # -log sigma(-x)


# policy chosen / rejected -1, -2; reference -1.5, -1.5: h = (-1 + 2) - 0 = 1
PC, PR, RC, RR = np.array([-1.0]), np.array([-2.0]), np.array([-1.5]), np.array([-1.5])


@pytest.mark.parametrize(
    "loss_type, beta, label_smoothing, expected",
    [
        ("sigmoid", 0.5, 0.0, log1p_exp(-0.5)),  # -log sigma(0.5 * 1)
        ("sigmoid", 0.5, 0.1, 0.9 * log1p_exp(-0.5) + 0.1 * log1p_exp(0.5)),  # cDPO
        ("ipo", 0.25, 0.0, 1.0),  # (1 - 1 / (2 * 0.25))^2
        ("hinge", 0.5, 0.0, 0.5),  # max(0, 1 - 0.5 * 1)
    ],
)
def test_dpo_hand_computed(loss_type, beta, label_smoothing, expected):
    f = jax.jit(functools.partial(dpo_loss, beta=beta, label_smoothing=label_smoothing, loss_type=loss_type))
    loss, metrics = f(PC, PR, RC, RR)
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    # implicit rewards: beta (log pi - log pi_ref)
    assert float(metrics["rewards/chosen"]) == pytest.approx(beta * 0.5)
    assert float(metrics["rewards/rejected"]) == pytest.approx(beta * -0.5)
    assert float(metrics["rewards/margins"]) == pytest.approx(beta * 1.0)
    assert float(metrics["rewards/accuracies"]) == 1.0
    assert float(metrics["logps/chosen"]) == -1.0 and float(metrics["logps/rejected"]) == -2.0


def test_dpo_reference_free_and_gradient():
    rc, rr = np.array([-1.2]), np.array([-1.8])

    @jax.jit
    def run(pc):
        # with the reference: h = 1 - 0.6 = 0.4; reference-free: h = 1
        with_ref, _ = dpo_loss(pc, PR, rc, rr, beta=1.0)
        free, metrics = dpo_loss(pc, PR, beta=1.0, reference_free=True)
        # d/d chosen of -log sigma(beta h) = -beta sigma(-beta h)
        grad = jax.grad(lambda c: dpo_loss(c, PR, rc, rr, beta=1.0)[0])(pc)
        return with_ref, free, metrics, grad

    with_ref, free, metrics, grad = run(PC)
    assert float(with_ref) == pytest.approx(log1p_exp(-0.4), rel=1e-6)
    assert float(free) == pytest.approx(log1p_exp(-1.0), rel=1e-6)
    assert float(metrics["rewards/chosen"]) == pytest.approx(-1.0)
    assert float(grad[0]) == pytest.approx(-1.0 / (1.0 + math.exp(0.4)), rel=1e-6)
    with pytest.raises(ValueError, match="reference"):
        dpo_loss(PC, PR)


def test_dpo_against_torch_and_pair_mask():
    rng = np.random.default_rng(0)
    pc, pr, rc, rr = (rng.normal(-5, 1, 6) for _ in range(4))
    mask = np.array([1, 1, 1, 1, 0, 0])
    loss, metrics = jax.jit(functools.partial(dpo_loss, beta=0.1))(pc, pr, rc, rr, pair_mask=mask)
    h = torch.tensor((pc - pr) - (rc - rr))
    expected = -torch.nn.functional.logsigmoid(0.1 * h)[:4].mean()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    acc = np.mean(((pc - rc) > (pr - rr))[:4])
    assert float(metrics["rewards/accuracies"]) == pytest.approx(acc)


def test_sequence_log_probs():
    lp = np.array([[0.0, -1.0, -2.0, -9.0]])
    mask = np.array([[0, 1, 1, 0]])
    total, mean = jax.jit(lambda lp, m: (sequence_log_probs(lp, m), sequence_log_probs(lp, m, average=True)))(lp, mask)
    assert float(total[0]) == -3.0 and float(mean[0]) == -1.5


def test_bradley_terry():
    chosen, rejected = np.array([2.0, 0.0]), np.array([1.0, 1.0])

    @jax.jit
    def run(chosen):
        loss, metrics = bradley_terry_loss(chosen, rejected)
        with_margin, _ = bradley_terry_loss(chosen[:1], rejected[:1], margin=np.array([0.5]))
        grad = jax.grad(lambda c: bradley_terry_loss(c, rejected)[0])(chosen)
        return loss, metrics, with_margin, grad

    loss, metrics, with_margin, grad = run(chosen)
    # -log sigma(1) and -log sigma(-1)
    assert float(loss) == pytest.approx((log1p_exp(-1.0) + log1p_exp(1.0)) / 2, rel=1e-6)
    assert float(metrics["rm/accuracy"]) == 0.5
    assert float(metrics["rm/chosen_reward"]) == 1.0 and float(metrics["rm/rejected_reward"]) == 1.0
    assert float(metrics["rm/margin"]) == 0.0
    # with margin 0.5 on the first pair: -log sigma(0.5)
    assert float(with_margin) == pytest.approx(log1p_exp(-0.5), rel=1e-6)
    # gradient w.r.t. chosen: -sigma(-(r_w - r_l)) / 2 pairs
    np.testing.assert_allclose(grad, [-1 / (1 + math.e) / 2, -1 / (1 + math.exp(-1.0)) / 2], rtol=1e-6)
