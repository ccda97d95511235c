"""Policy losses: hand-computed values, gradients and metrics; properties; jit + grad."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.algos import (
    LOSS_AGG_MODES,
    POLICY_LOSS_REGISTRY,
    PolicyLossParams,
    add_terms,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_reinforce,
    compute_policy_loss_vanilla,
    get_policy_loss,
    get_policy_loss_fn,
    loss_denominator,
)

CFG = PolicyLossParams(clip_ratio=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)  # clip to [0.8, 1.28]


def _close(x, y, tol=1e-5):
    np.testing.assert_allclose(np.asarray(x), y, rtol=tol, atol=tol)


def J(fn, *arrays, **static):
    """fn(*arrays, **static) under jit (one compile is much faster than eager op-by-op)."""
    return jax.jit(functools.partial(fn, **static))(*arrays)


def G(fn, *arrays, argnum=1, **static):
    """d fn(*arrays, **static)[0] / d arrays[argnum], under jit."""
    return jax.jit(jax.grad(lambda *a: fn(*a, **static)[0], argnums=argnum))(*arrays)


# ---------------------------------------------------------------- vanilla PPO
# old log_prob 0, so ratio r = exp(log_prob). Per token (A: advantage):
#  t0 r=1.5 A=+1: max(-1.5, -1.28) = -1.28              (upper clip: clipfrac)
#  t1 r=0.5 A=+1: max(-0.5, -0.8)  = -0.5
#  t2 r=0.5 A=-1: max(0.5, 0.8)    = 0.8; min(3, 0.8)   (lower clip: clipfrac)
#  t3 r=4.0 A=-1: max(4, 1.28)     = 4;   min(3, 4) = 3 (dual clip: clipfrac_lower)
#  t4 r=1.1 A=+2: -2.2
#  t5 masked (r=100, A=5)
RATIOS = np.array([[1.5, 0.5, 0.5, 4.0, 1.1, 100.0]])
ADV = np.array([[1.0, 1.0, -1.0, -1.0, 2.0, 5.0]])
MASK = np.array([[1, 1, 1, 1, 1, 0]])
OLD = np.zeros((1, 6))
LOGP = np.log(RATIOS)
VANILLA = (-1.28 - 0.5 + 0.8 + 3.0 - 2.2) / 5


def test_vanilla_hand_computed():
    loss, metrics = J(compute_policy_loss_vanilla, OLD, LOGP, ADV, MASK, config=CFG)
    _close(loss, VANILLA)
    _close(metrics["actor/pg_loss"], VANILLA)
    _close(metrics["actor/pg_clipfrac"], 2 / 5)
    _close(metrics["actor/pg_clipfrac_lower"], 1 / 5)
    _close(metrics["actor/ppo_kl"], -math.log(1.5 * 0.5 * 0.5 * 4.0 * 1.1) / 5)


def test_vanilla_gradient():
    # d loss / d log_prob: clipped tokens 0, unclipped -A r, masked 0; token-mean /5
    grad = G(compute_policy_loss_vanilla, OLD, LOGP, ADV, MASK, config=CFG)
    _close(grad, [[0.0, -0.5 / 5, 0.0, 0.0, -2.2 / 5, 0.0]])


def test_vanilla_log_ratio_clamp_weights_and_config():
    # log ratio 50 is clamped to 20: ratio e^20 with A=-1 -> the dual clip binds at 3
    one = np.ones((1, 1))
    loss, metrics = J(compute_policy_loss_vanilla, 0 * one, 50 * one, -one, one, config=CFG)
    _close(loss, 3.0)
    _close(metrics["actor/ppo_kl"], -20.0)
    # rollout IS weights multiply the per-token losses
    w = np.array([[2.0, 0.5, 1.0, 1.0, 0.0, 9.0]])
    loss, _ = J(compute_policy_loss_vanilla, OLD, LOGP, ADV, MASK, rollout_is_weights=w, config=CFG)
    _close(loss, (-1.28 * 2 - 0.5 * 0.5 + 0.8 + 3.0 + 0.0) / 5)
    # a mapping works as config; clip_ratio_c <= 1 is rejected
    loss, _ = J(compute_policy_loss_vanilla, OLD, LOGP, ADV, MASK, config={"clip_ratio": 0.2, "clip_ratio_high": 0.28})
    _close(loss, VANILLA)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss_vanilla(OLD, LOGP, ADV, MASK, config=PolicyLossParams(clip_ratio_c=1.0))


# ---------------------------------------------------------------- GSPO
# row 0: log-ratios (0.2, 0.0) -> sequence ratio s = e^0.1, A = +1, in [0.8, 1.28]: L = -e^0.1 per token
# row 1: log-ratio -0.5 (token 1 masked) -> s = e^-0.5 = 0.6065, A = -1:
#        max(0.6065, clip(0.6065) = 0.8) = 0.8 (clipped)
# seq-mean-token-mean: (-e^0.1 + 0.8) / 2
G_OLD = np.zeros((2, 2))
G_LOGP = np.array([[0.2, 0.0], [-0.5, 9.0]])
G_ADV = np.array([[1.0, 1.0], [-1.0, -1.0]])
G_MASK = np.array([[1, 1], [1, 0]])


def test_gspo_hand_computed_and_gradient():
    loss, metrics = J(compute_policy_loss_gspo, G_OLD, G_LOGP, G_ADV, G_MASK, loss_agg_mode="token-mean", config=CFG)
    _close(loss, (-math.exp(0.1) + 0.8) / 2)  # seq-mean-token-mean, whatever the mode says
    _close(metrics["actor/pg_clipfrac"], 1 / 3)
    _close(metrics["actor/ppo_kl"], -(0.2 + 0.0 - 0.5) / 3)
    # gradient of -A s_i,t w.r.t. log pi_t is -A s_i; row 0: -e^0.1 * (1/2 tokens) * (1/2 seqs)
    grad = G(compute_policy_loss_gspo, G_OLD, G_LOGP, G_ADV, G_MASK, config=CFG)
    _close(grad, [[-math.exp(0.1) / 4, -math.exp(0.1) / 4], [0.0, 0.0]])


# ---------------------------------------------------------------- GPG and REINFORCE
R_LOGP = np.array([[-1.0, -2.0, -3.0]])
R_ADV = np.array([[1.0, -1.0, 4.0]])
R_MASK = np.array([[1, 1, 0]])


def test_gpg_and_reinforce():
    # -A log pi = [1, -2, (12 masked)] -> token-mean -0.5; seq-mean-token-sum -1
    loss, _ = J(compute_policy_loss_gpg, R_LOGP, R_LOGP, R_ADV, R_MASK, config=CFG)
    _close(loss, -0.5)
    loss, metrics = J(compute_policy_loss_reinforce, R_LOGP - 0.1, R_LOGP, R_ADV, R_MASK, config=CFG)
    _close(loss, -1.0)
    _close(metrics["actor/ppo_kl"], -0.1)  # mean(old - new)
    w = np.array([[0.5, 2.0, 1.0]])
    loss, _ = J(
        compute_policy_loss_reinforce,
        R_LOGP,
        R_LOGP,
        R_ADV,
        R_MASK,
        rollout_is_weights=w,
        loss_agg_mode="token-mean",
        config=CFG,
    )
    _close(loss, (0.5 * 1 - 2.0 * 2) / 2)
    grad = G(compute_policy_loss_reinforce, R_LOGP, R_LOGP, R_ADV, R_MASK, loss_agg_mode="token-mean", config=CFG)
    _close(grad, [[-0.5, 0.5, 0.0]])  # -A / 2 tokens


# ---------------------------------------------------------------- CISPO
def test_cispo_hand_computed_and_gradient():
    # ratios 1.5, 0.5, 1.0 -> stop-grad weights 1.28, 0.8, 1.0; L = -w A log pi
    logp = np.log(np.array([[1.5, 0.5, 1.0]]))
    old, adv, mask = np.zeros((1, 3)), np.array([[1.0, 1.0, 2.0]]), np.ones((1, 3))
    loss, metrics = J(compute_policy_loss_cispo, old, logp, adv, mask, config=CFG)
    _close(loss, (-1.28 * math.log(1.5) - 0.8 * math.log(0.5) - 0.0) / 3)
    _close(metrics["actor/pg_clipfrac"], 2 / 3)
    grad = G(compute_policy_loss_cispo, old, logp, adv, mask, config=CFG)
    _close(grad, [[-1.28 / 3, -0.8 / 3, -2.0 / 3]])  # every token keeps a gradient, -w A / 3


# ---------------------------------------------------------------- Clip-Cov and KL-Cov
# A = (3, -1, -1, -1): mean 0. log pi = (-0.5, -1.5, -1.5, -1.5): mean -1.25.
# cov = (3 * 0.75, -1 * -0.25, ...) = (2.25, 0.25, 0.25, 0.25); only token 0 is in (lb=1, ub=5).
C_ADV = np.array([[3.0, -1.0, -1.0, -1.0]])
C_LOGP = np.array([[-0.5, -1.5, -1.5, -1.5]])
C_MASK = np.ones((1, 4))


@pytest.mark.parametrize("key", [None, jax.random.PRNGKey(0)])
def test_clip_cov_detaches_high_covariance_token(key):
    # ratio 1: per-token loss -A = (-3, 1, 1, 1); token 0 is detached (corr 0): mean (0 + 1 + 1 + 1) / 4
    loss, metrics = J(compute_policy_loss_clip_cov, C_LOGP, C_LOGP, C_ADV, C_MASK, config=CFG, key=key)
    _close(loss, 0.75)
    _close(metrics["actor/pg_clipfrac"], 0.25)
    grad = G(compute_policy_loss_clip_cov, C_LOGP, C_LOGP, C_ADV, C_MASK, config=CFG, key=key)
    _close(grad, [[0.0, 0.25, 0.25, 0.25]])  # -A r / 4 elsewhere


def test_clip_cov_selects_at_most_n():
    # A = (3, 2, -2.5, -2.5) (mean 0); log pi = (-0.5, -0.25, -1.75, -1.75) (mean -1.0625)
    # cov = (3 * 0.5625, 2 * 0.8125, -2.5 * -0.6875, -2.5 * -0.6875) = (1.6875, 1.625, 1.71875, 1.71875):
    # four candidates in (1, 5); n = max(floor(ratio * 4), 1) of them are detached
    adv = np.array([[3.0, 2.0, -2.5, -2.5]])
    logp = np.array([[-0.5, -0.25, -1.75, -1.75]])
    for ratio, key, fraction in ((0.25, None, 0.25), (0.5, jax.random.PRNGKey(1), 0.5)):
        cfg = PolicyLossParams(clip_cov_ratio=ratio, clip_cov_lb=1.0, clip_cov_ub=5.0)
        _, metrics = J(compute_policy_loss_clip_cov, logp, logp, adv, np.ones((1, 4)), config=cfg, key=key)
        _close(metrics["actor/pg_clipfrac"], fraction)


def test_kl_cov_penalises_top_covariance_token():
    # kl_cov_ratio 0.25 of 4 tokens -> k = 1: token 0 (cov 2.25). old = log pi - (0.1, 0, 0, 0)
    # token 0: -3 e^0.1 + 1 * |0.1|;  others: -A * 1 = 1
    cfg = PolicyLossParams(kl_cov_ratio=0.25, ppo_kl_coef=1.0)
    old = C_LOGP - np.array([[0.1, 0.0, 0.0, 0.0]])
    loss, metrics = J(compute_policy_loss_kl_cov, old, C_LOGP, C_ADV, C_MASK, config=cfg)
    _close(loss, (-3 * math.exp(0.1) + 0.1 + 3.0) / 4)
    _close(metrics["actor/ppo_kl"], 0.1 / 4)


# ---------------------------------------------------------------- GMPO
def test_geo_mean_hand_computed():
    # clip on log-ratio to [-0.2, 0.28]
    # row 0 (A=+1): d = (0.1, 0.5) -> (0.1, 0.28); rho = exp(0.19); L = -exp(0.19)
    # row 1 (A=-1): d = (-0.5, 0.1) -> -min(-d, -clip(d)) = (-0.2, 0.1); rho = exp(-0.05); L = exp(-0.05)
    # row 2: empty mask, not counted
    old = np.zeros((3, 2))
    logp = np.array([[0.1, 0.5], [-0.5, 0.1], [3.0, 3.0]])
    adv = np.array([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]])
    mask = np.array([[1, 1], [1, 1], [0, 0]])
    loss, metrics = J(compute_policy_loss_geo_mean, old, logp, adv, mask, config=CFG)
    _close(loss, (-math.exp(0.19) + math.exp(-0.05)) / 2)
    _close(metrics["actor/pg_clipfrac"], 1 / 4)
    _close(metrics["actor/pg_clipfrac_lower"], 1 / 4)
    # rollout IS weights enter as their per-sequence geometric mean: row 0 sqrt(4 * 1) = 2
    w = np.array([[4.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    loss_w, _ = J(compute_policy_loss_geo_mean, old, logp, adv, mask, rollout_is_weights=w, config=CFG)
    _close(loss_w, (-2 * math.exp(0.19) + math.exp(-0.05)) / 2, tol=1e-4)


# ---------------------------------------------------------------- properties
@st.composite
def ratio_one_batches(draw):
    b, t = 3, 4
    adv = np.array(draw(st.lists(st.floats(-5, 5, width=32), min_size=b * t, max_size=b * t)), np.float32)
    logp = np.array(draw(st.lists(st.floats(-8, 0, width=32), min_size=b * t, max_size=b * t)), np.float32)
    mask = np.array(draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t)), np.float32)
    return adv.reshape(b, t), logp.reshape(b, t), mask.reshape(b, t)


@functools.cache
def _ratio_one_fn():
    @jax.jit
    def run(adv, logp, mask):
        out = {}
        for name in ("vanilla", "gspo", "cispo", "geo_mean"):
            loss, metrics = get_policy_loss_fn(name)(logp, logp, adv, mask, "token-mean", CFG)
            out[name] = (loss, metrics)
        return out

    return run


@settings(max_examples=25, deadline=None)
@given(ratio_one_batches())
def test_ratio_one_gives_no_clipping(batch):
    adv, logp, mask = batch
    out = _ratio_one_fn()(adv, logp, mask)
    for name, (_, metrics) in out.items():
        assert float(metrics["actor/pg_clipfrac"]) == 0.0, name
        assert float(metrics.get("actor/pg_clipfrac_lower", 0.0)) == 0.0, name
        assert abs(float(metrics["actor/ppo_kl"])) < 1e-6, name
    # with ratio 1, vanilla PPO is the token-mean of -A
    expected = -(adv * mask).sum() / max(mask.sum(), 1)
    assert float(out["vanilla"][0]) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("name", sorted(POLICY_LOSS_REGISTRY))
def test_jit_grad_and_terms_every_loss(name):
    rng = np.random.default_rng(0)
    old = jnp.asarray(rng.normal(-1.0, 0.3, (4, 6)), jnp.float32)
    logp = old + jnp.asarray(rng.normal(0, 0.2, (4, 6)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=(4, 6)), jnp.float32)
    mask = jnp.asarray(rng.random((4, 6)) > 0.3, jnp.float32).at[:, 0].set(1.0)
    fn = get_policy_loss_fn(name)

    @jax.jit
    def check(lp, mask):
        (loss, metrics), grad = jax.value_and_grad(
            lambda lp: fn(old, lp, adv, mask, "seq-mean-token-mean", CFG), has_aux=True
        )(lp)
        # padding rows (mask 0) get no gradient
        masked_grad = jax.grad(lambda lp: fn(old, lp, adv, mask.at[1].set(0.0), "token-mean", CFG)[0])(lp)
        whole = fn(old, lp, adv, mask, "token-mean", CFG, return_terms=True)[0]
        parts = [
            fn(old[a:b], lp[a:b], adv[a:b], mask[a:b], "token-mean", CFG, return_terms=True)[0]
            for a, b in ((0, 1), (1, 4))
        ]
        return loss, metrics, grad, masked_grad, whole, add_terms(*parts)

    loss, metrics, grad, masked_grad, whole, summed = check(logp, mask)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
    assert float(metrics["actor/pg_loss"]) == pytest.approx(float(loss), rel=1e-6)
    assert float(jnp.abs(grad).sum()) > 0
    assert float(jnp.abs(masked_grad[1]).sum()) == 0.0
    if name not in ("clip_cov", "kl_cov"):
        # micro-batches: summed terms equal the whole batch. (Clip-Cov / KL-Cov select tokens
        # with batch statistics, so they are not additive over micro-batches, as in verl.)
        assert float(summed.value) == pytest.approx(float(whole.value), rel=1e-5, abs=1e-6)
        assert float(summed.denominator) == pytest.approx(float(whole.denominator))


# ---------------------------------------------------------------- declared denominators
@pytest.mark.parametrize("name", sorted(POLICY_LOSS_REGISTRY))
def test_declared_denominator_is_the_one_the_terms_carry(name):
    # counted from the mask alone (no loss evaluated): the trainer's global denominator
    rng = np.random.default_rng(1)
    old = rng.normal(-1.0, 0.3, (5, 6)).astype(np.float32)
    logp = old + rng.normal(0, 0.2, (5, 6)).astype(np.float32)
    adv = rng.normal(size=(5, 6)).astype(np.float32)
    mask = (rng.random((5, 6)) > 0.4).astype(np.float32)
    mask[2] = 0.0  # an empty row: not a sequence of any "seq-mean" mode
    fn = get_policy_loss_fn(name)
    # every mode in one program (one compile per loss)
    terms = jax.jit(lambda *a: {mode: fn(*a, mode, CFG, return_terms=True)[0] for mode in LOSS_AGG_MODES})(
        old, logp, adv, mask)
    for mode in LOSS_AGG_MODES:
        assert float(loss_denominator(name, mask, mode)) == float(terms[mode].denominator), mode


def test_gspo_and_gmpo_declare_their_fixed_mode():
    for name, spec in POLICY_LOSS_REGISTRY.items():
        fixed = "seq-mean-token-mean" if name in ("gspo", "geo_mean") else None
        assert spec.fixed_agg_mode == fixed, name
    assert get_policy_loss("gspo").agg_mode("token-mean") == "seq-mean-token-mean"
    assert get_policy_loss("vanilla").agg_mode("seq-mean-token-sum") == "seq-mean-token-sum"


def test_config_is_typed():
    # None gives the defaults; a misspelt field of a mapping is an error, not a silent default
    assert PolicyLossParams.of(None) == PolicyLossParams()
    assert PolicyLossParams.of({"clip_ratio_high": 0.28}).clip_bounds() == (0.2, 0.28)
    with pytest.raises(TypeError, match="clip_ratoi"):
        compute_policy_loss_vanilla(OLD, LOGP, ADV, MASK, config={"clip_ratoi": 0.1})
