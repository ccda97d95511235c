"""Registries: every required name is there, and a bad name lists the valid ones."""

import pytest

import rljax.algos as A
from rljax.algos.registry import Registry


def test_policy_loss_names():
    assert set(A.POLICY_LOSS_REGISTRY) == {
        "vanilla", "gspo", "gpg", "cispo", "clip_cov", "kl_cov", "geo_mean", "reinforce"
    }  # fmt: skip
    assert A.get_policy_loss_fn("vanilla") is A.compute_policy_loss_vanilla
    assert A.get_policy_loss_fn("geo_mean") is A.compute_policy_loss_geo_mean


def test_advantage_estimator_names():
    assert set(A.ADV_ESTIMATOR_REGISTRY) == {
        "gae", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
        "remax", "opo", "gpg", "grpo_passk",
    }  # fmt: skip
    assert A.get_adv_estimator_fn("gae") is A.compute_gae_advantage_return


def test_kl_estimator_names():
    expected = {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "kl+", "k1+", "abs+", "low_var_kl+", "k3+"}
    assert set(A.KL_ESTIMATOR_REGISTRY) == expected


def test_loss_agg_modes():
    assert set(A.LOSS_AGG_REGISTRY) == set(A.LOSS_AGG_MODES) == {
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    }  # fmt: skip


@pytest.mark.parametrize(
    "getter, valid",
    [
        (A.get_policy_loss_fn, "vanilla"),
        (A.get_adv_estimator_fn, "grpo"),
        (A.get_kl_estimator, "low_var_kl"),
        (A.get_loss_agg_fn, "token-mean"),
    ],
)
def test_unknown_name_lists_valid_names(getter, valid):
    with pytest.raises(ValueError, match="Valid names") as info:
        getter("no-such-thing")
    assert valid in str(info.value)


def test_register_decorator_and_duplicates():
    reg = Registry("thing")

    @reg.register("a", "b")
    def f():
        return 1

    assert reg.get_fn("a") is f and reg.get_fn("b") is f
    reg.register("a")(f)  # same function again: fine
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
