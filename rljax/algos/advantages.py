"""Advantage estimators, registered by name (verl's `algorithm.adv_estimator`).

An estimator is a core `(AdvantageInputs, AdvantageParams) -> (advantages, returns)`, both
[B, T] float32, registered with what it needs from the batch (`register_adv_est`): a
critic's `values`, a greedy response's `reward_baselines`, the samples' `group_ids`. The
trainer reads those needs off the spec (`get_adv_estimator(name).needs_critic`, ...) and
calls `compute_advantages(name, inputs, gamma=..., lam=..., norm_adv_by_std_in_grpo=...)`.

Each estimator also has verl's function (`compute_grpo_outcome_advantage(...)`,
`get_adv_estimator_fn(name)`), with the signature of verl's function of that name: the same
parameters in the same order, with the same defaults (`verl_params`), including verl's
`config` (its `AlgoConfig`: an object or mapping whose `gamma`, `lam`,
`norm_adv_by_std_in_grpo` are read) and verl's `**kwargs` where verl has them (ignored, as
verl does). rljax's further inputs follow as keyword-only arguments: `values` [B, T],
`reward_baselines` [B], `index` [B] (int group ids in [0, num_groups): the prompt each
sample came from; verl takes string uids), `num_groups`, and the `AdvantageParams` fields
(`gamma`, `lam`, `epsilon`, `norm_adv_by_std_in_grpo`, `f_norm`). A hyper-parameter
passed as an argument wins over `config`, which wins over the `AdvantageParams` default.
`token_level_rewards` [B, T] carries an outcome reward on the last response token and
`response_mask` [B, T] marks the sampled tokens. An estimator without **kwargs (GAE, GRPO,
as in verl) rejects a misspelt name with a `TypeError`.

Group statistics use `jax.ops.segment_sum` over `num_groups` segments: static, jit-able;
`num_groups` defaults to B (always enough, since ids are < B after a re-index). Outcome
estimators use the sequence score s_i = sum_t token_level_rewards[i, t] and broadcast the
per-sequence advantage over the response mask. As in verl, a group with a single sample
gets mean 0 and std 1.

Multi-turn trajectories. A row is [prompt][turn 1][observation][turn 2]...[padding], and
only the tokens the policy sampled have response_mask 1; tool outputs and user turns inside
the trajectory are masked like the prompt and the padding. The outcome reward sits on the
last sampled token. Every estimator here treats a masked span as absent: it is not a time
step (no discount, no reset, no TD error), its own advantage and return are 0, and the
output on the sampled tokens equals that of the same row with the masked tokens removed.
Sequence-level estimators therefore give every sampled token of every turn the same
advantage.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from rljax.algos.masked import as_float, masked_whiten, safe_divide
from rljax.algos.registry import ADV_ESTIMATOR_REGISTRY, get_adv_estimator

Pair = tuple[jax.Array, jax.Array]


@dataclass(frozen=True)
class AdvantageInputs:
    """The batch an estimator reads; which optional fields it needs is in its spec."""

    token_level_rewards: ArrayLike  # [B, T] (an outcome reward on the last sampled token)
    response_mask: ArrayLike  # [B, T] 1 = a token the policy sampled
    values: ArrayLike | None = None  # [B, T] the critic's values (needs_critic)
    group_ids: ArrayLike | None = None  # [B] int in [0, num_groups): each sample's prompt (uses_groups)
    reward_baselines: ArrayLike | None = None  # [B] the greedy response's reward (needs_greedy_baseline)
    num_groups: int | None = None  # static bound on the group ids; None: B


@dataclass(frozen=True)
class AdvantageParams:
    """The estimators' hyper-parameters (static Python values), with verl's defaults."""

    gamma: float = 1.0  # discount (GAE, REINFORCE++)
    lam: float = 1.0  # GAE lambda
    epsilon: float = 1e-6  # added to the group std (GRPO, pass@k)
    norm_adv_by_std_in_grpo: bool = True  # False: no std division (Dr. GRPO)
    f_norm: float = 1.0  # GPG's normaliser


EstimatorCore = Callable[[AdvantageInputs, AdvantageParams], Pair]


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered advantage estimator: its core, what it needs, and verl's keyword function."""

    name: str
    core: EstimatorCore
    fn: Callable[..., Pair]  # verl's keyword function (see the module docstring)
    needs_critic: bool  # reads `values`: the trainer trains a critic
    needs_greedy_baseline: bool  # reads `reward_baselines`: the trainer samples a greedy response per prompt
    uses_groups: bool  # reads `group_ids`
    min_group_size: int  # samples per prompt a group-relative baseline needs to compare (config validation)

    def __call__(self, inputs: AdvantageInputs, params: AdvantageParams = AdvantageParams()) -> Pair:
        """(advantages, returns), both [B, T] float32; a `ValueError` names a missing input."""
        needed = {"values": self.needs_critic, "group_ids": self.uses_groups,
                  "reward_baselines": self.needs_greedy_baseline}  # fmt: skip
        missing = [name for name, needs in needed.items() if needs and getattr(inputs, name) is None]
        if missing:
            raise ValueError(f"advantage estimator {self.name!r} needs {', '.join(missing)}")
        return self.core(inputs, params)


def compute_advantages(
    estimator: str | AdvantageEstimator,
    inputs: AdvantageInputs,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
) -> Pair:
    """(advantages, returns) [B, T] of `estimator` (a name or a spec): what the trainer calls."""
    spec = get_adv_estimator(estimator) if isinstance(estimator, str) else estimator
    return spec(inputs, AdvantageParams(gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo))


_ARRAYS = ("token_level_rewards", "values", "reward_baselines", "response_mask", "index")
_VERL_DEFAULTS = {"epsilon": 1e-6, "norm_adv_by_std_in_grpo": True, "f_norm": 1.0, "alpha": 1.0, "config": None}
_FROM_CONFIG = ("gamma", "lam", "norm_adv_by_std_in_grpo")  # AlgoConfig attributes an estimator reads


def _verl_signature(
    verl_params: tuple[str, ...] | None, verl_kwargs: bool, needs_critic: bool, needs_greedy_baseline: bool,
    uses_groups: bool,
) -> inspect.Signature:  # fmt: skip
    """verl's parameters (`verl_params`, in its order; None: the needed arrays in verl's order
    and `config`), then rljax's other inputs keyword-only, then verl's **kwargs if it has them."""
    if verl_params is None:
        needed = {"values": needs_critic, "reward_baselines": needs_greedy_baseline, "index": uses_groups}
        verl_params = (*(n for n in _ARRAYS if needed.get(n, True)), "config")
    P = inspect.Parameter
    params = [P(n, P.POSITIONAL_OR_KEYWORD, **({"default": _VERL_DEFAULTS[n]} if n in _VERL_DEFAULTS else {}))
              for n in verl_params]  # fmt: skip
    extras = [*(n for n in _ARRAYS if n not in verl_params), "num_groups"]
    params += [P(n, P.KEYWORD_ONLY, default=None) for n in extras]
    params += [P(f.name, P.KEYWORD_ONLY, default=f.default) for f in dataclasses.fields(AdvantageParams)
               if f.name not in verl_params]  # fmt: skip
    if verl_kwargs:
        params.append(P("kwargs", P.VAR_KEYWORD))
    return inspect.Signature(params)


def _config_value(config: object, name: str) -> object:
    """`config.name` or `config[name]` (verl's AlgoConfig or a mapping); None when absent."""
    if isinstance(config, Mapping):
        return config.get(name)
    return getattr(config, name, None)


def register_adv_est(
    name_or_enum: str,
    *,
    needs_critic: bool = False,
    needs_greedy_baseline: bool = False,
    uses_groups: bool = False,
    min_group_size: int = 1,
    verl_params: tuple[str, ...] | None = None,
    verl_kwargs: bool = False,
) -> Callable[[EstimatorCore], Callable[..., Pair]]:
    """Decorator: register `core` as the estimator `name_or_enum` (a name or a str-valued
    enum), with what it needs, and return its verl function (which carries the core's name
    and docstring). `verl_params` and `verl_kwargs` give verl's signature of that function
    (see the module docstring); without them it takes the arrays it needs and `config`."""
    name = getattr(name_or_enum, "value", name_or_enum)

    def decorator(core: EstimatorCore) -> Callable[..., Pair]:
        signature = _verl_signature(verl_params, verl_kwargs, needs_critic, needs_greedy_baseline, uses_groups)

        def estimator_fn(*args: object, **kwargs: object) -> Pair:
            bound = signature.bind(*args, **kwargs)  # a misspelt or missing argument: TypeError
            passed = set(bound.arguments)
            bound.apply_defaults()
            a = bound.arguments
            config = a.get("config")
            hyper = {}
            for f in dataclasses.fields(AdvantageParams):
                from_config = _config_value(config, f.name) if config is not None and f.name in _FROM_CONFIG else None
                hyper[f.name] = a[f.name] if f.name in passed or from_config is None else from_config
            inputs = AdvantageInputs(a["token_level_rewards"], a["response_mask"], a["values"], a["index"],
                                     a["reward_baselines"], a["num_groups"])  # fmt: skip
            return spec(inputs, AdvantageParams(**hyper))

        estimator_fn.__name__ = estimator_fn.__qualname__ = core.__name__
        estimator_fn.__doc__ = core.__doc__
        estimator_fn.__signature__ = signature  # type: ignore[attr-defined]
        spec = AdvantageEstimator(name, core, estimator_fn, needs_critic, needs_greedy_baseline, uses_groups,
                                  min_group_size)  # fmt: skip
        ADV_ESTIMATOR_REGISTRY.add(spec, name)
        return estimator_fn

    return decorator


# --------------------------------------------------------------------------- groups


def _index(index: ArrayLike) -> jax.Array:
    return jnp.asarray(index).astype(jnp.int32)


def _num_groups(index: jax.Array, num_groups: int | None) -> int:
    return int(index.shape[0]) if num_groups is None else int(num_groups)


def group_count(index: ArrayLike, num_groups: int | None = None) -> jax.Array:
    """[B] float: the size of each sample's group."""
    index = _index(index)
    g = _num_groups(index, num_groups)
    counts = jax.ops.segment_sum(jnp.ones(index.shape, jnp.float32), index, num_segments=g)
    return counts[index]


def group_sum(x: ArrayLike, index: ArrayLike, num_groups: int | None = None) -> jax.Array:
    """[B]: the sum of `x` over each sample's group."""
    index = _index(index)
    g = _num_groups(index, num_groups)
    return jax.ops.segment_sum(as_float(x), index, num_segments=g)[index]


def group_mean_std(scores: ArrayLike, index: ArrayLike, num_groups: int | None = None) -> Pair:
    """[B] group mean and unbiased group std of `scores`; (0, 1) for single-sample groups (verl)."""
    scores = as_float(scores)
    n = group_count(index, num_groups)
    mean = group_sum(scores, index, num_groups) / n
    var = group_sum(jnp.square(scores - mean), index, num_groups) / jnp.maximum(n - 1.0, 1.0)
    single = n <= 1
    return jnp.where(single, 0.0, mean), jnp.where(single, 1.0, jnp.sqrt(var))


def _scores(token_level_rewards: ArrayLike) -> jax.Array:
    return jnp.sum(as_float(token_level_rewards).astype(jnp.float32), axis=-1)


def _broadcast(per_sequence: jax.Array, response_mask: ArrayLike) -> jax.Array:
    return per_sequence[:, None] * as_float(response_mask).astype(jnp.float32)


# --------------------------------------------------------------------------- GAE

_GROUP = ("token_level_rewards", "response_mask", "index", "epsilon")  # verl's leading group-estimator params


@register_adv_est("gae", needs_critic=True,
                  verl_params=("token_level_rewards", "values", "response_mask", "gamma", "lam"))
def compute_gae_advantage_return(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """Generalised Advantage Estimation, multi-turn safe, then whitened.

    Backwards over t, with m the response mask (1 = a policy token):

        delta_t = r_t + gamma V_next - V_t
        A_t     = delta_t + gamma lam A_next
        V_next <- V_t if m_t else V_next;   A_next <- A_t if m_t else A_next

    Masked spans (prompt, tool observations, user turns, padding) neither receive their own
    TD error nor break the recursion: the next sampled token's value and advantage are
    carried across them, and their advantage and return are 0. returns = A + V (before
    whitening); advantages = masked_whiten(A) over the sampled tokens.
    Sources: Schulman et al. 2016, arXiv:1506.02438; verl `compute_gae_advantage_return`
    (which leaves the carried A, and A + V with the masked token's own V, on masked
    positions; the losses mask them, so only those unused entries differ).
    """
    rewards = as_float(inputs.token_level_rewards).astype(jnp.float32)  # [B, T]
    values = as_float(inputs.values).astype(jnp.float32)  # [B, T]
    mask = as_float(inputs.response_mask).astype(jnp.float32)  # [B, T]
    gamma, lam = params.gamma, params.lam

    def step(carry: Pair, xs: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[Pair, jax.Array]:
        next_value, next_adv = carry
        r, v, m = xs
        delta = r + gamma * next_value - v
        adv = delta + gamma * lam * next_adv
        next_value = m * v + (1.0 - m) * next_value
        next_adv = m * adv + (1.0 - m) * next_adv
        return (next_value, next_adv), next_adv

    zeros = jnp.zeros(rewards.shape[:1], jnp.float32)  # [B]
    _, adv_t = jax.lax.scan(step, (zeros, zeros), (rewards.T, values.T, mask.T), reverse=True)  # [T, B]
    advantages = adv_t.T  # [B, T]
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask) * mask, returns


# --------------------------------------------------------------------------- group baselines


def _group_centred(inputs: AdvantageInputs, epsilon: float, by_std: bool) -> Pair:
    """A_i = (s_i - mean_g) [/ (std_g + epsilon)] on the sampled tokens, as (advantages, returns)."""
    scores = _scores(inputs.token_level_rewards)  # [B]
    mean, std = group_mean_std(scores, inputs.group_ids, inputs.num_groups)
    adv = (scores - mean) / (std + epsilon) if by_std else scores - mean
    adv = _broadcast(adv, inputs.response_mask)  # [B, T]
    return adv, adv


@register_adv_est("grpo", uses_groups=True, min_group_size=2,
                  verl_params=(*_GROUP, "norm_adv_by_std_in_grpo", "config"))
def compute_grpo_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """GRPO outcome advantage:  A_i = (s_i - mean_g) / (std_g + epsilon), broadcast over tokens.

    std is the unbiased group std. With `norm_adv_by_std_in_grpo=False`: A_i = s_i - mean_g
    (Dr. GRPO). Every sampled token of every turn gets A_i; masked (prompt, observation,
    padding) tokens get 0. Sources: Shao et al. 2024 (DeepSeekMath), arXiv:2402.03300; Liu et
    al. 2025 (Dr. GRPO), arXiv:2503.20783; verl `compute_grpo_outcome_advantage`.
    """
    return _group_centred(inputs, params.epsilon, params.norm_adv_by_std_in_grpo)


@register_adv_est("dr_grpo", uses_groups=True, min_group_size=2)
def compute_dr_grpo_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """Dr. GRPO:  A_i = s_i - mean_g (GRPO without the std division), broadcast over the
    sampled tokens of every turn; masked (prompt, observation, padding) tokens get 0.
    Sources: Liu et al. 2025, arXiv:2503.20783; verl `compute_grpo_outcome_advantage` with
    `norm_adv_by_std_in_grpo=False`.
    """
    return _group_centred(inputs, params.epsilon, by_std=False)


@register_adv_est("grpo_passk", uses_groups=True, min_group_size=2,
                  verl_params=(*_GROUP, "norm_adv_by_std_in_grpo", "config"), verl_kwargs=True)
def compute_grpo_passk_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """Pass@k advantage: only the best sample of a group gets a nonzero advantage,

        A_best = (s_max - s_second_max) [/ (std_g + epsilon)],   A_other = 0

    (ties: the lowest batch index is "best"). Needs >= 2 samples per group; verl raises
    otherwise, we raise when the group ids are concrete and give 0 under `jit`. The per-sequence
    value is broadcast over the sampled tokens of every turn; masked (prompt, observation,
    padding) tokens get 0. Sources: Chen et al. 2025, "Pass@k Training...", arXiv:2503.19595
    (as cited by verl); verl `compute_grpo_passk_outcome_advantage`.
    """
    index = inputs.group_ids
    idx = _index(index)  # [B]
    g = _num_groups(idx, inputs.num_groups)
    if not isinstance(index, jax.core.Tracer):
        counts = np.bincount(np.asarray(index).astype(np.int64), minlength=g)
        if np.any((counts > 0) & (counts < 2)):
            raise ValueError("grpo_passk needs at least 2 samples in every group")
    scores = _scores(inputs.token_level_rewards)  # [B]
    batch = jnp.arange(scores.shape[0])
    r_max = jax.ops.segment_max(scores, idx, num_segments=g)[idx]
    first_best = jax.ops.segment_min(jnp.where(scores == r_max, batch, scores.shape[0]), idx, num_segments=g)
    is_best = batch == first_best[idx]
    r_second = jax.ops.segment_max(jnp.where(is_best, -jnp.inf, scores), idx, num_segments=g)[idx]
    gap = jnp.where(jnp.isfinite(r_second), r_max - r_second, 0.0)
    if params.norm_adv_by_std_in_grpo:
        gap = gap / (group_mean_std(scores, idx, g)[1] + params.epsilon)
    adv = _broadcast(jnp.where(is_best, gap, 0.0), inputs.response_mask)  # [B, T]
    return adv, adv


@register_adv_est("rloo", uses_groups=True, verl_params=(*_GROUP, "config"), verl_kwargs=True)
def compute_rloo_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """RLOO: leave-one-out baseline,  A_i = s_i - (sum_{j in g, j != i} s_j) / (n - 1)
    = n/(n-1) (s_i - mean_g); a single-sample group keeps A_i = s_i (verl). Broadcast over
    the sampled tokens of every turn; masked (prompt, observation, padding) tokens get 0.

    Sources: Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740; verl
    `compute_rloo_outcome_advantage`.
    """
    index, num_groups = inputs.group_ids, inputs.num_groups
    scores = _scores(inputs.token_level_rewards)  # [B]
    n = group_count(index, num_groups)
    others = (group_sum(scores, index, num_groups) - scores) / jnp.maximum(n - 1.0, 1.0)
    adv = jnp.where(n > 1, scores - others, scores)
    adv = _broadcast(adv, inputs.response_mask)  # [B, T]
    return adv, adv


@register_adv_est("opo", uses_groups=True, verl_params=(*_GROUP, "config"), verl_kwargs=True)
def compute_opo_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """OPO: length-weighted group baseline,  A_i = s_i - sum_g(|y_j| s_j) / sum_g |y_j|
    (baseline 0 for a single-sample group, verl).

    |y_j| = the number of sampled tokens (the response-mask sum), not the span length: the
    optimal baseline weighs a sample by ||grad log pi(y_j)||^2, which the paper takes as
    proportional to |y_j|, and observation / padding tokens carry no policy gradient (verl
    uses the response-mask sum too). A_i is broadcast over the sampled tokens of every turn;
    masked tokens get 0. Sources: Hao et al. 2025, "On-Policy RL with Optimal Reward
    Baseline", arXiv:2505.23585; verl `compute_opo_outcome_advantage`.
    """
    index, num_groups = inputs.group_ids, inputs.num_groups
    scores = _scores(inputs.token_level_rewards)  # [B]
    lengths = jnp.sum(as_float(inputs.response_mask).astype(jnp.float32), axis=-1)  # [B]
    baseline = safe_divide(group_sum(lengths * scores, index, num_groups), group_sum(lengths, index, num_groups))
    adv = scores - jnp.where(group_count(index, num_groups) > 1, baseline, 0.0)
    adv = _broadcast(adv, inputs.response_mask)  # [B, T]
    return adv, adv


@register_adv_est("gpg", uses_groups=True,
                  verl_params=(*_GROUP, "f_norm", "alpha", "config"), verl_kwargs=True)
def compute_gpg_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """GPG advantage:  A_i = alpha (s_i - mean_g) / f_norm,  alpha = B / max(#{i: s_i != 0}, 1).

    alpha rescales the batch gradient for samples with a zero score (computed this way
    whatever `alpha` argument is given, as verl does). A_i is broadcast over the sampled
    tokens of every turn; masked (prompt, observation, padding) tokens get 0. Sources: Chu et
    al. 2025, arXiv:2504.02546; verl `compute_gpg_outcome_advantage`.
    """
    scores = _scores(inputs.token_level_rewards)  # [B]
    mean, _ = group_mean_std(scores, inputs.group_ids, inputs.num_groups)
    alpha = scores.shape[0] / jnp.maximum(jnp.sum(scores != 0), 1)
    adv = _broadcast(alpha * (scores - mean) / params.f_norm, inputs.response_mask)  # [B, T]
    return adv, adv


# --------------------------------------------------------------------------- returns-based


def discounted_returns(token_level_rewards: ArrayLike, response_mask: ArrayLike, gamma: float = 1.0) -> jax.Array:
    """Discounted return over the sampled tokens only, multi-turn safe.

    Backwards over t, with m the response mask (1 = a sampled token):

        G_t = m_t (r_t + gamma G_next);   G_next <- G_t if m_t else G_next

    so a masked span (observation, user turn, prompt, padding) is skipped: it neither resets
    nor advances (discounts) the running return, and gets return 0. In a 2-turn episode the
    first turn's tokens see the outcome, discounted by the number of sampled tokens between
    them and the reward. Rewards on masked positions are ignored (rljax puts the score on the
    last sampled token and masks the KL penalty).

    verl's REINFORCE++ instead multiplies the running return by m_t after each step, which
    is right for one turn with trailing padding but zeroes the return at every observation
    span: every turn but the last gets return 0 whatever the outcome. On single-turn rows
    the sampled tokens' returns are the same as verl's.
    """
    rewards = as_float(token_level_rewards).astype(jnp.float32)
    mask = as_float(response_mask).astype(jnp.float32)

    def step(running: jax.Array, xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        r, m = xs
        ret = m * (r + gamma * running)
        running = ret + (1.0 - m) * running
        return running, ret

    _, returns_t = jax.lax.scan(step, jnp.zeros(rewards.shape[:1], jnp.float32), (rewards.T, mask.T), reverse=True)
    return returns_t.T


@register_adv_est("reinforce_plus_plus", verl_params=("token_level_rewards", "response_mask", "config"),
                  verl_kwargs=True)
def compute_reinforce_plus_plus_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """REINFORCE++:  A = masked_whiten(G) * m, with G the discounted return (batch whitening
    over the sampled tokens).

    G is `discounted_returns`: only sampled tokens are discounted and receive returns; masked
    spans (observations, user turns, prompt, padding) are skipped without resetting the
    return and get advantage and return 0. Differs from verl, which resets the return at
    every masked token (so earlier turns of a multi-turn episode get 0); single-turn rows
    agree. Sources: Hu 2025, arXiv:2501.03262; verl
    `compute_reinforce_plus_plus_outcome_advantage`.
    """
    mask = as_float(inputs.response_mask).astype(jnp.float32)  # [B, T]
    returns = discounted_returns(inputs.token_level_rewards, mask, params.gamma)  # [B, T]
    return masked_whiten(returns, mask) * mask, returns


@register_adv_est("reinforce_plus_plus_baseline", uses_groups=True, verl_params=(*_GROUP, "config"),
                  verl_kwargs=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """REINFORCE++-baseline:  A = masked_whiten((s_i - mean_g) m) * m  (group mean, then
    batch whitening over the sampled tokens; no discount, gamma is not used, as verl).

    The centred score is broadcast over the sampled tokens of every turn and masked tokens
    (prompt, observation, padding) get 0; whitening statistics count sampled tokens only.
    Sources: Hu 2025, arXiv:2501.03262; verl
    `compute_reinforce_plus_plus_baseline_outcome_advantage`.
    """
    mask = as_float(inputs.response_mask).astype(jnp.float32)  # [B, T]
    scores = _scores(inputs.token_level_rewards)  # [B]
    mean, _ = group_mean_std(scores, inputs.group_ids, inputs.num_groups)
    adv = masked_whiten(_broadcast(scores - mean, mask), mask) * mask  # [B, T]
    return adv, adv


@register_adv_est("remax", needs_greedy_baseline=True,
                  verl_params=("token_level_rewards", "reward_baselines", "response_mask", "config"), verl_kwargs=True)
def compute_remax_outcome_advantage(inputs: AdvantageInputs, params: AdvantageParams) -> Pair:
    """ReMax:  G_t = m_t sum_{t' >= t} m r,  A_t = (G_t - b) m_t  with b the reward of the
    greedy response (`reward_baselines` [B]); undiscounted.

    Rewards on masked positions are ignored and masked spans (prompt, observations, user
    turns, padding) get return and advantage 0, so with the outcome on the last sampled token
    every sampled token of every turn gets s - b. verl leaves the running sum (and A = G) on
    masked positions; the losses mask them, so only those unused entries differ. Sources:
    Li et al. 2023, arXiv:2310.10505; verl `compute_remax_outcome_advantage`.
    """
    mask = as_float(inputs.response_mask).astype(jnp.float32)  # [B, T]
    rewards = as_float(inputs.token_level_rewards).astype(jnp.float32) * mask  # [B, T]
    returns = jnp.flip(jnp.cumsum(jnp.flip(rewards, -1), axis=-1), -1) * mask  # [B, T]
    adv = returns - as_float(inputs.reward_baselines).astype(jnp.float32)[:, None] * mask
    return adv, returns


__all__ = [
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageParams",
    "compute_advantages",
    "compute_dr_grpo_outcome_advantage",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "discounted_returns",
    "group_count",
    "group_mean_std",
    "group_sum",
    "register_adv_est",
]
