"""verl's calling conventions: every function of `rljax.algos` named as one of verl's
`core_algos` (or `rollout_corr_helper`) accepts what verl's accepts (same parameters,
order, kinds, defaults, and verl's attribute-style config objects).

The signature test reads verl's own `verl/trainer/ppo/core_algos.py` and
`rollout_corr_helper.py` with `ast`, without importing verl (its imports are heavy), from
the wheel named by `RLJAX_VERL_WHEEL` or from an installed verl. CI downloads the wheel
(`pip download --no-deps verl==0.9.1`, in .ci/run) rather than installing it: the wheel
carries a top-level `tests` package that would shadow this repository's `tests`. Where
neither is there, the test is skipped with that line as the reason.
The call tests below it need no verl: their expected values are computed by hand.
"""

import ast
import importlib.util
import inspect
import os
import zipfile
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

import rljax.algos as A
from rljax.algos import POLICY_LOSS_REGISTRY, PolicyLossParams

VERL_PIN = "verl==0.9.1"
P = inspect.Parameter


def _verl_file(name: str) -> str | None:
    """The source of verl/trainer/ppo/`name`: from the wheel at `$RLJAX_VERL_WHEEL`, else
    from an installed verl, found without importing it (find_spec of a top-level package
    does not run its __init__)."""
    wheel = os.environ.get("RLJAX_VERL_WHEEL")
    if wheel and os.path.isfile(wheel):
        with zipfile.ZipFile(wheel) as z:
            member = f"verl/trainer/ppo/{name}"
            return z.read(member).decode() if member in z.namelist() else None
    spec = importlib.util.find_spec("verl")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "trainer" / "ppo" / name
        if path.is_file():
            return path.read_text()
    return None


def _verl_functions(source: str) -> dict[str, list[tuple[str, object, object]]]:
    """name -> [(parameter, kind, default or P.empty)] of each module-level function."""
    out = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        a = node.args
        positional = [*a.posonlyargs, *a.args]
        defaults = [P.empty] * (len(positional) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
        params = [(p.arg, P.POSITIONAL_ONLY if p in a.posonlyargs else P.POSITIONAL_OR_KEYWORD, d)
                  for p, d in zip(positional, defaults, strict=True)]  # fmt: skip
        if a.vararg:
            params.append((a.vararg.arg, P.VAR_POSITIONAL, P.empty))
        params += [(p.arg, P.KEYWORD_ONLY, P.empty if d is None else ast.literal_eval(d))
                   for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]  # fmt: skip
        if a.kwarg:
            params.append((a.kwarg.arg, P.VAR_KEYWORD, P.empty))
        out[node.name] = params
    return out


CORE_ALGOS, ROLLOUT_CORR = _verl_file("core_algos.py"), _verl_file("rollout_corr_helper.py")
VERL = {**(_verl_functions(ROLLOUT_CORR) if ROLLOUT_CORR else {}), **(_verl_functions(CORE_ALGOS) if CORE_ALGOS else {})}
SHARED = sorted(set(A.__all__) & set(VERL))


def _kinds(params, *kinds):
    return [p for p in params if p[1] in kinds]


@pytest.mark.skipif(CORE_ALGOS is None, reason=f"verl source absent (`pip download --no-deps {VERL_PIN}`, then RLJAX_VERL_WHEEL=<the wheel>)")
def test_every_verl_named_function_is_compared():
    # the comparison below is not vacuous: the functions verl users call are all in it
    assert {"agg_loss", "compute_gae_advantage_return", "compute_grpo_outcome_advantage", "compute_policy_loss",
            "compute_policy_loss_vanilla", "compute_policy_loss_reinforce", "compute_value_loss", "kl_penalty",
            "get_kl_controller", "compute_rewards", "compute_rollout_correction_and_rejection_mask",
            "compute_rollout_correction_weights", "compute_rollout_rejection_mask"} <= set(SHARED)  # fmt: skip


@pytest.mark.skipif(CORE_ALGOS is None, reason=f"verl source absent (`pip download --no-deps {VERL_PIN}`, then RLJAX_VERL_WHEEL=<the wheel>)")
@pytest.mark.parametrize("name", SHARED or ["-"])
def test_signature_accepts_what_verl_accepts(name):
    """verl's positional parameters are rljax's, in order, with the same kinds and defaults;
    verl's keyword-only ones are rljax's too; **kwargs exactly where verl has them; anything
    rljax adds is keyword-only with a default (so no call of verl's binds differently)."""
    verl = VERL[name]
    ours = [(p.name, p.kind, p.default) for p in inspect.signature(getattr(A, name)).parameters.values()]
    positional = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.VAR_POSITIONAL)
    assert _kinds(ours, *positional) == _kinds(verl, *positional), name
    ours_kw = {n: d for n, kind, d in _kinds(ours, P.KEYWORD_ONLY)}
    for n, _, d in _kinds(verl, P.KEYWORD_ONLY):
        assert n in ours_kw and ours_kw[n] == d, (name, n)
    extra = [n for n, d in ours_kw.items() if d is P.empty and n not in {v[0] for v in verl}]
    assert not extra, f"{name}: required keyword-only parameters verl does not have: {extra}"
    assert bool(_kinds(ours, P.VAR_KEYWORD)) == bool(_kinds(verl, P.VAR_KEYWORD)), name


# ---------------------------------------------------------------- verl-style calls, hand-computed


def _close(x, y, tol=1e-5):
    np.testing.assert_allclose(np.asarray(x), y, rtol=tol, atol=tol)


def test_gae_takes_gamma_and_lam_positionally():
    # T=2, r = [0, 1], V = [0.5, 0.2], gamma 0.9, lam 0.8:
    #   delta_1 = 1 - 0.2 = 0.8                       A_1 = 0.8
    #   delta_0 = 0 + 0.9 * 0.2 - 0.5 = -0.32         A_0 = -0.32 + 0.9 * 0.8 * 0.8 = 0.256
    # returns = A + V = [0.756, 1.0]; whitened A (unbiased var of two values): -+1/sqrt(2)
    r, v, m = np.array([[0.0, 1.0]]), np.array([[0.5, 0.2]]), np.ones((1, 2))
    adv, ret = A.compute_gae_advantage_return(r, v, m, 0.9, 0.8)
    _close(ret, [[0.756, 1.0]])
    _close(adv, [[-2**-0.5, 2**-0.5]], tol=1e-4)


def test_advantage_estimators_read_verl_algo_config():
    # verl's AlgoConfig is an attribute object; REINFORCE++ reads its gamma:
    #   r = [0, 0, 1], gamma 0.5 -> returns [0.25, 0.5, 1]
    r, m = np.array([[0.0, 0.0, 1.0]]), np.ones((1, 3))
    algo = SimpleNamespace(gamma=0.5, lam=1.0, norm_adv_by_std_in_grpo=True, adv_estimator="reinforce_plus_plus")
    _, ret = A.compute_reinforce_plus_plus_outcome_advantage(r, m, algo)
    _close(ret, [[0.25, 0.5, 1.0]])
    # **kwargs as verl's trainer passes them (extra keys are ignored, as in verl)
    _, ret = A.compute_reinforce_plus_plus_outcome_advantage(r, m, config=algo, rollout_is_weights=None)
    _close(ret, [[0.25, 0.5, 1.0]])
    # GRPO positionally, verl's order: scores [1, 0] in one group -> mean 0.5, std 1/sqrt(2)
    r2, m2 = np.array([[1.0], [0.0]]), np.ones((2, 1))
    adv, _ = A.compute_grpo_outcome_advantage(r2, m2, np.array([0, 0]), 1e-6, False, algo)
    _close(adv, [[0.5], [-0.5]])  # norm_adv_by_std_in_grpo=False, passed: no std division
    adv, _ = A.get_adv_estimator_fn("grpo_passk")(r2, m2, np.array([0, 0]), config={"norm_adv_by_std_in_grpo": False})
    _close(adv, [[1.0], [0.0]])  # the best sample gets s_max - s_second = 1; config says no std


# vanilla PPO example (old log-prob 0, so r = exp(log_prob)); clip to [0.8, 1.28], dual clip 3:
#  r=1.5 A=+1 -> -1.28; r=0.5 A=+1 -> -0.5; r=0.5 A=-1 -> 0.8; r=4 A=-1 -> 3; r=1.1 A=+2 -> -2.2
#  (6th token masked). Sum -0.18 over 5 tokens: token-mean -0.036.
#  clipfrac 2/5 (tokens 0, 2), clipfrac_lower 1/5 (token 3), ppo_kl = -ln(1.5 .5 .5 4 1.1) / 5
RATIOS = np.array([[1.5, 0.5, 0.5, 4.0, 1.1, 100.0]])
ADV = np.array([[1.0, 1.0, -1.0, -1.0, 2.0, 5.0]])
MASK = np.array([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
OLD, LOGP = np.zeros((1, 6)), np.log(RATIOS)


def _actor(**overrides):
    """A stand-in for verl's ActorConfig: attributes only (no mapping interface), with
    attributes the losses do not read."""
    policy_loss = SimpleNamespace(loss_mode="vanilla", clip_cov_ratio=0.5, clip_cov_lb=-10.0, clip_cov_ub=10.0,
                                  kl_cov_ratio=0.5, ppo_kl_coef=0.7, dro_beta=None)  # fmt: skip
    fields = dict(strategy="fsdp", ppo_mini_batch_size=8, clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=0.28,
                  clip_ratio_c=3.0, loss_agg_mode="token-mean", loss_scale_factor=None, tau_pos=1.0, tau_neg=1.05,
                  policy_loss=policy_loss, global_batch_info={})  # fmt: skip
    return SimpleNamespace(**{**fields, **overrides})


def test_vanilla_with_verl_actor_config():
    loss, metrics = A.compute_policy_loss_vanilla(OLD, LOGP, ADV, MASK, "token-mean", _actor(), None)
    _close(loss, -0.036)
    _close(metrics["actor/pg_clipfrac"], 0.4)
    _close(metrics["actor/pg_clipfrac_lower"], 0.2)
    # verl's global_batch_info: loss = sum / batch_num_tokens * dp_size = -0.18 / 20 * 2
    info = {"dp_size": 2, "batch_num_tokens": 20, "global_batch_size": 4, "loss_scale_factor": None}
    loss, _ = A.compute_policy_loss_vanilla(OLD, LOGP, ADV, MASK, "token-mean", _actor(global_batch_info=info))
    _close(loss, -0.018)


def test_verl_compute_policy_loss_returns_its_four_values():
    loss, clipfrac, ppo_kl, clipfrac_lower = A.compute_policy_loss(OLD, LOGP, ADV, MASK, 0.2, None, 0.28, 3.0)
    _close(loss, -0.036)
    _close(clipfrac, 0.4)
    _close(ppo_kl, -np.log(1.5 * 0.5 * 0.5 * 4.0 * 1.1) / 5)
    _close(clipfrac_lower, 0.2)
    with pytest.raises(ValueError, match="cliprange"):
        A.compute_policy_loss(OLD, LOGP, ADV, MASK)


def test_kl_cov_reads_the_policy_loss_sub_config():
    # 5 tokens, kl_cov_ratio 0.5 -> floor(2.5) = 2 tokens get + ppo_kl_coef |log r|; with every
    # log r = 0 except the penalised ones the surrogate is -A r. Here: r = 1 everywhere but
    # the two top-covariance tokens' |log r| is 0 too, so the loss is -mean(A) = -(1+1-1-1+2)/5.
    ones = np.zeros((1, 6))
    loss, _ = A.compute_policy_loss_kl_cov(OLD, ones, ADV, MASK, "token-mean", _actor())
    _close(loss, -0.4)
    # with log r = [0.1]*: penalty 0.7 * 0.1 on 2 tokens; surrogate -A e^0.1 summed: -2 e^0.1
    lp = np.full((1, 6), 0.1)
    loss, _ = A.compute_policy_loss_kl_cov(OLD, lp, ADV, MASK, "token-mean", _actor())
    _close(loss, (-2 * np.exp(0.1) + 2 * 0.7 * 0.1) / 5)


@pytest.mark.parametrize("name", sorted(POLICY_LOSS_REGISTRY))
def test_every_policy_loss_reads_verl_actor_config(name):
    # the attribute object's values, not the defaults, reach the loss: it equals the loss
    # with the same knobs as a PolicyLossParams
    actor = _actor(clip_ratio=0.1, clip_ratio_high=0.15, clip_ratio_c=2.0)
    same = PolicyLossParams(clip_ratio=0.1, clip_ratio_high=0.15, clip_ratio_c=2.0, clip_cov_ratio=0.5,
                            clip_cov_lb=-10.0, clip_cov_ub=10.0, kl_cov_ratio=0.5, ppo_kl_coef=0.7)  # fmt: skip
    assert PolicyLossParams.of(actor) == same
    rng = np.random.default_rng(0)
    logp = OLD + rng.normal(scale=0.5, size=OLD.shape)
    fn = POLICY_LOSS_REGISTRY[name].fn
    got, _ = fn(OLD, logp, ADV, MASK, "token-mean", actor, None)
    want, _ = fn(OLD, logp, ADV, MASK, "token-mean", same, None)
    _close(got, float(want))


def test_policy_loss_config_reads_mappings_with_policy_loss_and_rljax_actor_config():
    from rljax.rl.actor_config import ActorConfig

    nested = {"clip_ratio": 0.3, "policy_loss": {"ppo_kl_coef": 0.5}, "ppo_epochs": 1}
    assert PolicyLossParams.of(nested) == PolicyLossParams(clip_ratio=0.3, ppo_kl_coef=0.5)
    rljax_actor = ActorConfig(clip_ratio_high=0.28)
    assert PolicyLossParams.of(rljax_actor) == rljax_actor.loss_config


def test_agg_loss_takes_verl_global_batch_arguments():
    loss = np.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # token-mean: (1 + 2 + 4) / batch_num_tokens * dp_size = 7 / 14 * 2
    _close(A.agg_loss(loss, mask, "token-mean", 2, 14), 1.0)
    # seq-mean-token-sum: (3 + 4) / global_batch_size * dp_size = 7 / 7 * 2
    _close(A.agg_loss(loss, mask, "seq-mean-token-sum", 2, None, 7), 2.0)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        A.agg_loss(loss, mask, "token-mean", 2)
    # the value loss takes the same arguments: 1/2 (1 + 4 + 16) / 14 * 2 with vpreds = loss,
    # returns 0, values = vpreds (no clipping)
    vloss, _ = A.compute_value_loss(loss, np.zeros_like(loss), loss, mask, 0.5, "token-mean", 2, 14)
    _close(vloss, 0.5 * 21 / 14 * 2)


def test_jit_of_a_verl_style_call():
    # config None: verl's defaults, clip to [0.8, 1.2]: the first token gives -1.2, the sum -0.1
    fn = jax.jit(lambda o, lp, a, m: A.compute_policy_loss_vanilla(o, lp, a, m, "token-mean", None, None)[0])
    _close(fn(OLD, LOGP, ADV, MASK), -0.1 / 5)
