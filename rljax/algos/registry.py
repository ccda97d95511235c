"""Name -> entry registries, so a config can pick an algorithm by name.

Four registries live here (one dict each), filled by decorators in the modules that define
the entries:

- `POLICY_LOSS_REGISTRY`   name -> `PolicyLoss` spec    (`register_policy_loss`, policy_loss.py)
- `ADV_ESTIMATOR_REGISTRY` name -> `AdvantageEstimator` (`register_adv_est`, advantages.py)
- `KL_ESTIMATOR_REGISTRY`  name -> function             (`register_kl_estimator`, kl.py)
- `LOSS_AGG_REGISTRY`      name -> function             (`register_loss_agg_mode`, aggregation.py)

A policy loss and an advantage estimator are registered as a spec: the core formula, what
it needs or how it aggregates, and the public verl-compatible function built from them (the
decorators that build it live beside the specs). The lookups here return the spec
(`get_policy_loss`, `get_adv_estimator`) or its public function (`get_policy_loss_fn`,
`get_adv_estimator_fn`). They raise a `ValueError` that lists the valid names. Names follow
verl (`verl.trainer.ppo.core_algos`) wherever verl has the concept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import jax
    from jax.typing import ArrayLike

    from rljax.algos.advantages import AdvantageEstimator
    from rljax.algos.policy_loss import PolicyLoss

F = TypeVar("F", bound=Callable[..., Any])


class Registry(dict):
    """A `dict` of name -> entry (a function or a spec) with a registering decorator and a
    checked lookup."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def add(self, entry: Any, *names: str) -> None:
        """Register `entry` under every name in `names`; a name taken by another entry is an error."""
        if not names:
            raise ValueError(f"register a {self.kind} under at least one name")
        for name in names:
            if name in self and self[name] is not entry:
                raise ValueError(f"{self.kind} {name!r} is already registered as {self[name]!r}")
            self[name] = entry

    def register(self, *names: str) -> Callable[[F], F]:
        """Decorator: register the function under every name in `names`."""
        if not names:
            raise ValueError(f"register a {self.kind} under at least one name")

        def decorator(fn: F) -> F:
            self.add(fn, *names)
            return fn

        return decorator

    def get_fn(self, name: str) -> Any:
        """The entry registered as `name`; a `ValueError` listing valid names otherwise."""
        name = getattr(name, "value", name)  # accept str-valued enums, as verl does
        if name not in self:
            raise ValueError(f"Unknown {self.kind} {name!r}. Valid names: {sorted(self)}")
        return self[name]


POLICY_LOSS_REGISTRY = Registry("policy loss")
ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator")
KL_ESTIMATOR_REGISTRY = Registry("KL estimator")
LOSS_AGG_REGISTRY = Registry("loss_agg_mode")


def get_policy_loss(name: str) -> PolicyLoss:
    """The spec of the policy loss `name`: core, aggregation, public function."""
    return POLICY_LOSS_REGISTRY.get_fn(name)


def get_policy_loss_fn(name: str) -> Callable[..., Any]:
    """The policy loss registered as `name` (e.g. "vanilla", "gspo", "cispo"), verl's signature."""
    return get_policy_loss(name).fn


def loss_denominator(name: str, response_mask: ArrayLike, loss_agg_mode: str) -> jax.Array:
    """The denominator of the policy loss `name` under `loss_agg_mode`, counted from the mask
    alone (the mini-batch's mask gives the global denominator), without evaluating the loss."""
    return get_policy_loss(name).denominator(response_mask, loss_agg_mode)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The spec of the advantage estimator `name`: what it needs (`needs_critic`,
    `needs_greedy_baseline`, `uses_groups`, `min_group_size`) and how to call it."""
    return ADV_ESTIMATOR_REGISTRY.get_fn(name)


def get_adv_estimator_fn(name_or_enum: str) -> Callable[..., Any]:
    """verl's function of the advantage estimator `name_or_enum` (e.g. "gae", "grpo", "rloo",
    or a str-valued enum such as verl's `AdvantageEstimator.GRPO`)."""
    return get_adv_estimator(name_or_enum).fn


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
