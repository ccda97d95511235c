"""Name -> function registries, so a config can pick an algorithm by name.

Four registries live here (one dict each), filled by decorators in the modules that define
the functions:

- `POLICY_LOSS_REGISTRY`   (`register_policy_loss`, `get_policy_loss_fn`)   policy_loss.py
- `ADV_ESTIMATOR_REGISTRY` (`register_adv_est`, `get_adv_estimator_fn`)     advantages.py
- `KL_ESTIMATOR_REGISTRY`  (`register_kl_estimator`, `get_kl_estimator`)    kl.py
- `LOSS_AGG_REGISTRY`      (`register_loss_agg_mode`, `get_loss_agg_fn`)    aggregation.py

The `get_*` functions raise a `ValueError` that lists the valid names. Names follow verl
(`verl.trainer.ppo.core_algos`) wherever verl has the concept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Registry(dict):
    """A `dict` of name -> function with a registering decorator and a checked lookup."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, *names: str) -> Callable[[F], F]:
        """Decorator: register the function under every name in `names`."""
        if not names:
            raise ValueError(f"register a {self.kind} under at least one name")

        def decorator(fn: F) -> F:
            for name in names:
                if name in self and self[name] is not fn:
                    raise ValueError(f"{self.kind} {name!r} is already registered as {self[name]!r}")
                self[name] = fn
            return fn

        return decorator

    def get_fn(self, name: str) -> Callable[..., Any]:
        """The function registered as `name`; a `ValueError` listing valid names otherwise."""
        name = getattr(name, "value", name)  # accept str-valued enums, as verl does
        if name not in self:
            raise ValueError(f"Unknown {self.kind} {name!r}. Valid names: {sorted(self)}")
        return self[name]


POLICY_LOSS_REGISTRY = Registry("policy loss")
ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator")
KL_ESTIMATOR_REGISTRY = Registry("KL estimator")
LOSS_AGG_REGISTRY = Registry("loss_agg_mode")


def register_policy_loss(*names: str) -> Callable[[F], F]:
    """Register a policy loss `(old_log_prob, log_prob, advantages, response_mask, ...)`."""
    return POLICY_LOSS_REGISTRY.register(*names)


def get_policy_loss_fn(name: str) -> Callable[..., Any]:
    """The policy loss registered as `name` (e.g. "vanilla", "gspo", "cispo")."""
    return POLICY_LOSS_REGISTRY.get_fn(name)


def register_adv_est(*names: str) -> Callable[[F], F]:
    """Register an advantage estimator returning `(advantages, returns)`."""
    return ADV_ESTIMATOR_REGISTRY.register(*names)


def get_adv_estimator_fn(name: str) -> Callable[..., Any]:
    """The advantage estimator registered as `name` (e.g. "gae", "grpo", "rloo")."""
    return ADV_ESTIMATOR_REGISTRY.get_fn(name)


def register_kl_estimator(*names: str) -> Callable[[F], F]:
    """Register a per-token KL estimator `(logprob, ref_logprob) -> [B, T]`."""
    return KL_ESTIMATOR_REGISTRY.register(*names)


def get_kl_estimator(name: str) -> Callable[..., Any]:
    """The per-token KL estimator registered as `name` (e.g. "k1", "low_var_kl", "k3+")."""
    return KL_ESTIMATOR_REGISTRY.get_fn(name)


def register_loss_agg_mode(*names: str) -> Callable[[F], F]:
    """Register a loss aggregation mode `(loss_mat, loss_mask, ...) -> AggTerms`."""
    return LOSS_AGG_REGISTRY.register(*names)


def get_loss_agg_fn(name: str) -> Callable[..., Any]:
    """The aggregation-terms function of `loss_agg_mode` `name` (e.g. "token-mean")."""
    return LOSS_AGG_REGISTRY.get_fn(name)
