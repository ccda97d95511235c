"""loss_agg_mode: hand-computed values, and micro-batch sums == whole-batch aggregation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.algos import LOSS_AGG_MODES, add_terms, agg_denominator, agg_loss, agg_loss_terms

# Row 0: tokens 1, 2 in the loss; row 1: token 4; row 2: fully masked (never counts).
LOSS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 sequences
        ("seq-mean-token-mean", 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2
        ("seq-mean-token-sum-norm", 7.0 / 6.0),  # ((1 + 2) / 3 + 4 / 3) / 2, C = T = 3
    ],
)
def test_hand_computed(mode, expected):
    assert float(agg_loss(LOSS, MASK, mode)) == pytest.approx(expected, rel=1e-6)


def test_terms_and_denominators():
    terms = agg_loss_terms(LOSS, MASK, "token-mean")
    assert float(terms.numerator) == 7.0 and float(terms.denominator) == 3.0
    terms = agg_loss_terms(LOSS, MASK, "seq-mean-token-mean")
    assert float(terms.numerator) == pytest.approx(5.5) and float(terms.denominator) == 2.0
    assert float(agg_denominator(MASK, "token-mean")) == 3.0
    assert float(agg_denominator(MASK, "seq-mean-token-sum")) == 2.0


def test_loss_scale_factor():
    # C = 2: ((1 + 2) / 2 + 4 / 2) / 2 = 1.75
    assert float(agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=2)) == pytest.approx(1.75)


def test_global_denominator():
    # numerator 7 over a global token count of 6 (the other micro-batch has 3 more tokens)
    assert float(agg_loss(LOSS, MASK, "token-mean", global_denominator=6.0)) == pytest.approx(7.0 / 6.0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_mask_is_zero(mode):
    loss = np.full((2, 3), np.nan)  # masked NaNs must not leak
    assert float(agg_loss(loss, np.zeros((2, 3)), mode)) == 0.0


def test_unknown_mode():
    with pytest.raises(ValueError, match="Valid names"):
        agg_loss(LOSS, MASK, "sample-mean")


B, T = 8, 5


@st.composite
def batches(draw):
    x = np.array(draw(st.lists(st.floats(-3, 3, width=32), min_size=B * T, max_size=B * T)), np.float32)
    y = np.array(draw(st.lists(st.floats(-1, 1, width=32), min_size=B * T, max_size=B * T)), np.float32)
    mask = np.array(draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T)), np.float32)
    cuts = sorted(draw(st.sets(st.integers(1, B - 1), max_size=4)))
    mode = draw(st.sampled_from(LOSS_AGG_MODES))
    return x.reshape(B, T), y.reshape(B, T), mask.reshape(B, T), [0, *cuts, B], mode


def _loss_mat(theta, x, y):
    # a per-token loss that depends nonlinearly on a parameter vector theta
    return x * jnp.exp(theta[0] * y) + theta[1] ** 2 * y


def _pad(a, rows, fill):
    # pad a micro-batch to B rows, as a train step with fixed micro-batch shapes would
    return np.concatenate([a, np.full((rows - a.shape[0], a.shape[1]), fill, a.dtype)])


MAX_PARTS = 5


@functools.cache
def _checker(mode):
    """Jitted (whole, summed-terms, global-denominator) values and gradients for one mode."""

    def whole(theta, x, y, mask):
        return agg_loss(_loss_mat(theta, x, y), mask, mode)

    def summed_terms(theta, xs, ys, masks):
        terms = [agg_loss_terms(_loss_mat(theta, xs[k], ys[k]), masks[k], mode) for k in range(MAX_PARTS)]
        return add_terms(*terms).value

    def global_denominator(theta, xs, ys, masks, denominator):
        return sum(
            agg_loss(_loss_mat(theta, xs[k], ys[k]), masks[k], mode, global_denominator=denominator)
            for k in range(MAX_PARTS)
        )

    @jax.jit
    def run(theta, x, y, mask, xs, ys, masks):
        denominator = agg_denominator(mask, mode)
        return (
            jax.value_and_grad(whole)(theta, x, y, mask),
            jax.value_and_grad(summed_terms)(theta, xs, ys, masks),
            jax.value_and_grad(global_denominator)(theta, xs, ys, masks, denominator),
        )

    return run


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(batches())
def test_micro_batches_equal_whole_batch(batch):
    x, y, mask, bounds, mode = batch
    theta = jnp.array([0.3, -0.7])
    # uneven micro-batches, padded to one shape with garbage rows that are fully masked, plus
    # empty micro-batches up to MAX_PARTS (a fixed shape, so one compile per mode)
    parts = [
        (_pad(x[a:b], B, 7.0), _pad(y[a:b], B, 0.5), _pad(mask[a:b], B, 0.0))
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    parts += [(np.full((B, T), 3.0, np.float32), np.ones((B, T), np.float32), np.zeros((B, T), np.float32))] * (
        MAX_PARTS - len(parts)
    )
    xs, ys, masks = (np.stack(p) for p in zip(*parts, strict=True))
    (value, grad), *micro = _checker(mode)(theta, x, y, mask, xs, ys, masks)
    for v, g in micro:
        np.testing.assert_allclose(v, value, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g, grad, rtol=1e-5, atol=1e-5)


def test_mean_of_micro_batch_means_differs():
    # The bug this module avoids: micro-batch 1 has 2 tokens, micro-batch 2 has 1 token.
    loss = np.array([[1.0, 1.0], [4.0, 0.0]])
    mask = np.array([[1, 1], [1, 0]])

    @jax.jit
    def run(loss, mask):
        whole = agg_loss(loss, mask, "token-mean")  # (1 + 1 + 4) / 3 = 2
        mean_of_means = (agg_loss(loss[:1], mask[:1], "token-mean") + agg_loss(loss[1:], mask[1:], "token-mean")) / 2  # (1 + 4) / 2
        summed = add_terms(agg_loss_terms(loss[:1], mask[:1]), agg_loss_terms(loss[1:], mask[1:])).value
        return whole, mean_of_means, summed

    whole, mean_of_means, summed = run(loss, mask)
    assert float(whole) == pytest.approx(2.0) and float(mean_of_means) == pytest.approx(2.5)
    assert float(summed) == pytest.approx(2.0)


def test_jit_and_grad():
    f = jax.jit(lambda loss, m: agg_loss(loss, m, "seq-mean-token-mean"))
    g = jax.grad(lambda loss: f(loss, jnp.asarray(MASK)))(jnp.asarray(LOSS))
    # d/dl of sum_i(sum_t m l / n_i) / S: row 0 tokens 1/(2*2), row 1 token 1/(1*2), rest 0
    np.testing.assert_allclose(g, [[0.25, 0.25, 0], [0.5, 0, 0], [0, 0, 0]], atol=1e-7)
