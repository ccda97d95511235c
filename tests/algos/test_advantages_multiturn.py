"""Every advantage estimator on multi-turn trajectories, against hand-computed values.

A row is laid out as rljax's batch builds it: [prompt][turn 1 sampled][observation][turn 2
sampled]...[padding]. Only sampled tokens carry response_mask 1; the outcome reward sits on the
last sampled token. Layout strings below: "p" prompt, "s" sampled, "o" observation (tool output
or user turn), "." trailing padding; everything but "s" is masked (mask 0).

Expected values are worked out by hand in the comments (positions are row indices); numpy is
only used to apply the whitening formula, (x - mean) / sqrt(unbiased var + 1e-8), to the
hand-listed per-token values.
"""

import math

import jax
import numpy as np
import pytest

from rljax.algos import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn

EPS = 1e-6  # GRPO's epsilon

# The five trajectories used throughout (T = 10). Sampled positions and counts:
A = "pssooss..."  # 2 turns: {1, 2} {5, 6}            4 sampled
B = "psossoss.."  # 3 turns: {1} {3, 4} {6, 7}        5 sampled
C = "psooooss.."  # 2 turns: {1} {6, 7}, long obs.    3 sampled
D = "psooososss"  # 3 turns: {1} {5} {7, 8, 9}        5 sampled, no padding
E = "ppsossoos."  # 3 turns: {2} {4, 5} {8}           4 sampled, 2 prompt tokens


def mask_of(layout):
    return np.array([c == "s" for c in layout], np.float32)


def last_sampled(layout):
    return layout.rindex("s")


def batch(layouts, scores):
    """(token_level_rewards, response_mask): each score on its row's last sampled token."""
    mask = np.stack([mask_of(s) for s in layouts])
    rewards = np.zeros_like(mask)
    for i, (s, score) in enumerate(zip(layouts, scores)):
        rewards[i, last_sampled(s)] = score
    return rewards, mask


def on_sampled(layout, values):
    """[T] row: `values` (one per sampled token, in order) on the sampled positions, 0 elsewhere."""
    row = np.zeros(len(layout), np.float64)
    pos = [t for t, c in enumerate(layout) if c == "s"]
    assert len(pos) == len(values), (layout, values)
    row[pos] = values
    return row


def broadcast(layouts, per_sequence):
    return np.stack([on_sampled(s, [a] * s.count("s")) for s, a in zip(layouts, per_sequence)])


def whiten(rows, mask):
    """Batch whitening over the masked entries, masked entries 0 (the formula, applied in numpy)."""
    sel = rows[mask > 0]
    return np.where(mask > 0, (rows - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8), 0.0)


def _close(x, y, tol=1e-5):
    np.testing.assert_allclose(np.asarray(x, np.float64), y, rtol=tol, atol=tol)


def run(name, **kwargs):
    """The estimator under jit: arrays traced, Python scalars (gamma, lam, flags) static."""
    fn = get_adv_estimator_fn(name)
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    static = {k: v for k, v in kwargs.items() if k not in arrays}
    return jax.jit(lambda kw: fn(**kw, **static))(arrays)


# ---------------------------------------------------------------- the group batch
# groups: 0 = (A, B, C) with scores (1, 0, 0); 1 = (D, E) with scores (2, 1)
LAYOUTS = [A, B, C, D, E]
SCORES = [1.0, 0.0, 0.0, 2.0, 1.0]
INDEX = np.array([0, 0, 0, 1, 1])
REWARDS, MASK = batch(LAYOUTS, SCORES)
S0 = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0): sqrt(((2/3)^2 + 2 (1/3)^2) / 2)
S1 = math.sqrt(1 / 2)  # unbiased std of (2, 1): sqrt((0.5^2 + 0.5^2) / 1)


def group_kwargs(**extra):
    return dict(token_level_rewards=REWARDS, response_mask=MASK, index=INDEX, **extra)


def test_layouts():
    assert [s.count("s") for s in LAYOUTS] == [4, 5, 3, 5, 4]
    assert [last_sampled(s) for s in LAYOUTS] == [6, 7, 7, 9, 8]
    assert MASK.sum() == 21 and REWARDS.sum() == 4.0


def test_grpo_multiturn():
    # group 0: mean 1/3 -> (2/3, -1/3, -1/3) / (S0 + eps); group 1: mean 3/2 -> (1/2, -1/2) / (S1 + eps)
    adv, ret = run("grpo", **group_kwargs())
    expected = broadcast(LAYOUTS, [2 / 3 / (S0 + EPS), -1 / 3 / (S0 + EPS), -1 / 3 / (S0 + EPS),
                                   0.5 / (S1 + EPS), -0.5 / (S1 + EPS)])  # fmt: skip
    _close(adv, expected)
    _close(ret, expected)


@pytest.mark.parametrize("name, kwargs", [("dr_grpo", {}), ("grpo", {"norm_adv_by_std_in_grpo": False})])
def test_dr_grpo_multiturn(name, kwargs):
    # no std division: s - mean_g = (2/3, -1/3, -1/3 | 1/2, -1/2)
    adv, ret = run(name, **group_kwargs(**kwargs))
    expected = broadcast(LAYOUTS, [2 / 3, -1 / 3, -1 / 3, 0.5, -0.5])
    _close(adv, expected)
    _close(ret, expected)


def test_rloo_multiturn():
    # leave-one-out: A: 1 - (0 + 0)/2 = 1; B, C: 0 - (1 + 0)/2 = -1/2; D: 2 - 1 = 1; E: 1 - 2 = -1
    adv, ret = run("rloo", **group_kwargs())
    expected = broadcast(LAYOUTS, [1.0, -0.5, -0.5, 1.0, -1.0])
    _close(adv, expected)
    _close(ret, expected)


def test_opo_multiturn_length_counts_sampled_tokens_only():
    # OPO's |y| is the number of tokens the policy sampled (the optimal baseline weighs each
    # sample by ||grad log pi(y)||^2, and observation tokens contribute no gradient), i.e. the
    # response-mask sum: A, B, C = 4, 5, 3 and D, E = 5, 4.
    # group 0: b = (4*1 + 5*0 + 3*0) / 12 = 1/3 -> (2/3, -1/3, -1/3)
    # group 1: b = (5*2 + 4*1) / 9 = 14/9 -> (2 - 14/9, 1 - 14/9) = (4/9, -5/9)
    # (counting the span from first to last sampled token, observations included: A, B, C =
    # 6, 7, 7 would give b = 6/20 = 3/10 instead; counting padding too, 9 each, 1/3.)
    adv, ret = run("opo", **group_kwargs())
    expected = broadcast(LAYOUTS, [2 / 3, -1 / 3, -1 / 3, 4 / 9, -5 / 9])
    _close(adv, expected)
    _close(ret, expected)


def test_gpg_multiturn():
    # 3 of B = 5 scores are nonzero -> alpha = 5/3; A = alpha (s - mean_g):
    # 5/3 * (2/3, -1/3, -1/3, 1/2, -1/2) = (10/9, -5/9, -5/9, 5/6, -5/6)
    adv, ret = run("gpg", **group_kwargs())
    expected = broadcast(LAYOUTS, [10 / 9, -5 / 9, -5 / 9, 5 / 6, -5 / 6])
    _close(adv, expected)
    _close(ret, expected)


def test_grpo_passk_multiturn():
    # best of group 0 is A (1), second best 0 -> gap 1; best of group 1 is D (2), second 1 -> gap 1
    adv, _ = run("grpo_passk", **group_kwargs())
    _close(adv, broadcast(LAYOUTS, [1 / (S0 + EPS), 0.0, 0.0, 1 / (S1 + EPS), 0.0]))
    adv, _ = run("grpo_passk", **group_kwargs(norm_adv_by_std_in_grpo=False))
    _close(adv, broadcast(LAYOUTS, [1.0, 0.0, 0.0, 1.0, 0.0]))


def test_reinforce_plus_plus_baseline_multiturn():
    # centred scores (2/3, -1/3, -1/3, 1/2, -1/2) on 4, 5, 3, 5, 4 sampled tokens (21 in all);
    # token mean = (4*2/3 - 5/3 - 3/3 + 5/2 - 4/2) / 21 = (1/2) / 21 = 1/42, then whitening
    centred = broadcast(LAYOUTS, [2 / 3, -1 / 3, -1 / 3, 0.5, -0.5])
    assert math.isclose(centred[MASK > 0].mean(), 1 / 42)
    adv, ret = run("reinforce_plus_plus_baseline", **group_kwargs(gamma=0.5))  # no discount here
    _close(adv, whiten(centred, MASK), tol=1e-4)
    _close(ret, adv)


def test_remax_multiturn():
    # greedy baselines (0.5, 0.5, 0.5, 1.5, 1.5): G = the score on every sampled token of every
    # turn (the reward is on the last one, nothing is discounted); A = G - b; masked tokens 0
    baselines = np.array([0.5, 0.5, 0.5, 1.5, 1.5], np.float32)
    adv, ret = run("remax", **group_kwargs(reward_baselines=baselines))
    _close(ret, broadcast(LAYOUTS, SCORES))
    _close(adv, broadcast(LAYOUTS, [0.5, -0.5, -0.5, 0.5, -0.5]))


def test_remax_per_turn_rewards():
    # rewards 0.5 at the end of turn 1 (position 2) and 1 at the end of turn 2 (position 6) of A:
    # G = 1.5 on turn 1 {1, 2}, 1 on turn 2 {5, 6}; baseline 1 -> A = (0.5, 0.5, 0, 0)
    rewards = np.zeros((1, 10), np.float32)
    rewards[0, 2], rewards[0, 6] = 0.5, 1.0
    adv, ret = run("remax", token_level_rewards=rewards, response_mask=mask_of(A)[None],
                   reward_baselines=np.array([1.0], np.float32))  # fmt: skip
    _close(ret, [on_sampled(A, [1.5, 1.5, 1.0, 1.0])])
    _close(adv, [on_sampled(A, [0.5, 0.5, 0.0, 0.0])])


# ---------------------------------------------------------------- REINFORCE++
def test_reinforce_plus_plus_multiturn_gamma_one():
    # gamma = 1: the outcome reaches every sampled token of every turn, G = score; masked 0.
    # (an observation span does not reset the return: turn 1 of A gets the score too.)
    layouts, scores = [A, D, E], [1.0, 2.0, 1.0]
    rewards, mask = batch(layouts, scores)
    adv, ret = run("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=1.0)
    returns = broadcast(layouts, scores)
    _close(ret, returns)
    # whitening over 4 + 5 + 4 = 13 tokens: values 1 (x8) and 2 (x5), mean 18/13
    assert math.isclose(returns[mask > 0].mean(), 18 / 13)
    _close(adv, whiten(returns, mask), tol=1e-4)


def test_reinforce_plus_plus_multiturn_gamma_half():
    # gamma = 0.5, discounting over sampled tokens only (observation spans are skipped, not steps):
    # A (2 turns, score 1):  G6 = 1, G5 = 1/2, G2 = 1/4, G1 = 1/8
    # D (3 turns, score 2):  G9 = 2, G8 = 1, G7 = 1/2, G5 = 1/4, G1 = 1/8
    # E (3 turns, score 1):  G8 = 1, G5 = 1/2, G4 = 1/4, G2 = 1/8
    # B (3 turns, score 0):  all 0
    layouts = [A, D, E, B]
    rewards, mask = batch(layouts, [1.0, 2.0, 1.0, 0.0])
    adv, ret = run("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    returns = np.stack([
        on_sampled(A, [1 / 8, 1 / 4, 1 / 2, 1]),
        on_sampled(D, [1 / 8, 1 / 4, 1 / 2, 1, 2]),
        on_sampled(E, [1 / 8, 1 / 4, 1 / 2, 1]),
        on_sampled(B, [0, 0, 0, 0, 0]),
    ])  # fmt: skip
    _close(ret, returns)
    _close(adv, whiten(returns, mask), tol=1e-4)


def test_reinforce_plus_plus_single_turn_matches_reset_after_eos():
    # one turn, then padding: the reset-after-EOS loop (verl's) and the skip-masked-spans
    # return agree on the sampled tokens. Prompt "pp", 4 sampled, padding; gamma = 0.5:
    # G = (1/8, 1/4, 1/2, 1) on positions 2..5.
    layout = "ppssss...."
    rewards, mask = batch([layout], [1.0])
    reset = np.zeros(10)
    running = 0.0
    for t in reversed(range(10)):  # reset after every masked token
        running = rewards[0, t] + 0.5 * running
        reset[t] = running
        running *= mask[0, t]
    _, ret = run("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    _close(np.asarray(ret)[0][mask[0] > 0], reset[mask[0] > 0])
    _close(ret, [on_sampled(layout, [1 / 8, 1 / 4, 1 / 2, 1])])


def test_reinforce_plus_plus_per_turn_rewards():
    # rewards 1 at the end of turn 1 (position 2) and 1 at the end of turn 2 (position 6) of A,
    # gamma = 0.5: G6 = 1, G5 = 1/2, G2 = 1 + 0.5 * 1/2 = 5/4, G1 = 5/8
    rewards = np.zeros((1, 10), np.float32)
    rewards[0, 2], rewards[0, 6] = 1.0, 1.0
    _, ret = run("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask_of(A)[None], gamma=0.5)
    _close(ret, [on_sampled(A, [5 / 8, 5 / 4, 1 / 2, 1])])


# ---------------------------------------------------------------- GAE
def test_gae_multiturn_hand_computed():
    # gamma = lam = 0.5 (gamma lam = 1/4); values on masked tokens are 9 (must be ignored).
    # A (score 1), V on {1, 2, 5, 6} = (0.5, 0.25, 0.5, 0.75), walking back over sampled tokens:
    #   t6: delta = 1 + 0 - 0.75 = 0.25                A6 = 0.25
    #   t5: delta = 0.5 * 0.75 - 0.5 = -0.125          A5 = -0.125 + 0.25 * 0.25 = -0.0625
    #   t2: delta = 0.5 * 0.5 - 0.25 = 0               A2 = 0.25 * -0.0625 = -0.015625
    #   t1: delta = 0.5 * 0.25 - 0.5 = -0.375          A1 = -0.375 + 0.25 * -0.015625 = -0.37890625
    #   returns A + V: (0.12109375, 0.234375, 0.4375, 1.0)
    # B (score 0), V = 0.5 on {1, 3, 4, 6, 7}:
    #   t7: delta = -0.5                               A7 = -0.5
    #   t6: delta = 0.25 - 0.5 = -0.25                 A6 = -0.25 - 0.125 = -0.375
    #   t4: delta = -0.25                              A4 = -0.25 - 0.09375 = -0.34375
    #   t3: delta = -0.25                              A3 = -0.25 - 0.0859375 = -0.3359375
    #   t1: delta = -0.25                              A1 = -0.25 - 0.083984375 = -0.333984375
    #   returns: (0.166015625, 0.1640625, 0.15625, 0.125, 0.0)
    layouts = [A, B]
    rewards, mask = batch(layouts, [1.0, 0.0])
    values = np.full((2, 10), 9.0, np.float32)
    values[0, [1, 2, 5, 6]] = [0.5, 0.25, 0.5, 0.75]
    values[1, [1, 3, 4, 6, 7]] = 0.5
    adv, ret = run("gae", token_level_rewards=rewards, response_mask=mask, values=values, gamma=0.5, lam=0.5)
    raw = np.stack([
        on_sampled(A, [-0.37890625, -0.015625, -0.0625, 0.25]),
        on_sampled(B, [-0.333984375, -0.3359375, -0.34375, -0.375, -0.5]),
    ])  # fmt: skip
    returns = np.stack([
        on_sampled(A, [0.12109375, 0.234375, 0.4375, 1.0]),
        on_sampled(B, [0.166015625, 0.1640625, 0.15625, 0.125, 0.0]),
    ])  # fmt: skip
    _close(ret, returns)
    _close(adv, whiten(raw, mask), tol=1e-4)


# ---------------------------------------------------------------- every estimator
def all_kwargs(layouts, scores, gamma):
    rewards, mask = batch(layouts, scores)
    rng = np.random.default_rng(0)
    return dict(
        token_level_rewards=rewards,
        response_mask=mask,
        values=rng.normal(size=mask.shape).astype(np.float32),
        index=np.array([0, 0, 0, 1, 1])[: len(layouts)],
        reward_baselines=np.linspace(-1, 1, len(layouts)).astype(np.float32),
        gamma=gamma,
        lam=0.9,
        norm_adv_by_std_in_grpo=True,
    )


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATOR_REGISTRY))
def test_masked_tokens_get_zero(name):
    # prompt, observation and padding tokens: advantage 0 and return 0, for every estimator
    kwargs = all_kwargs(LAYOUTS, SCORES, gamma=0.9)
    adv, ret = run(name, **kwargs)
    off = MASK == 0
    _close(np.asarray(adv)[off], 0.0)
    _close(np.asarray(ret)[off], 0.0)


@pytest.mark.parametrize("name", sorted(set(ADV_ESTIMATOR_REGISTRY) - {"gae"}))
def test_outcome_estimators_give_every_turn_one_advantage(name):
    # with gamma = 1 every estimator but GAE gives all sampled tokens of a trajectory, in every
    # turn, the same advantage (REINFORCE++ discounts only when gamma < 1)
    kwargs = all_kwargs(LAYOUTS, SCORES, gamma=1.0)
    adv, _ = run(name, **kwargs)
    for i, layout in enumerate(LAYOUTS):
        row = np.asarray(adv)[i][mask_of(layout) > 0]
        _close(row, np.full_like(row, row[0]))


@pytest.mark.parametrize("name", sorted(ADV_ESTIMATOR_REGISTRY))
def test_observation_spans_are_transparent(name):
    # dropping the masked tokens (prompt, observations, padding) and left-packing each row's
    # sampled tokens must not change any estimator's output on the sampled tokens
    kwargs = all_kwargs(LAYOUTS, SCORES, gamma=0.9)
    adv, ret = run(name, **kwargs)
    packed = dict(kwargs)
    n = int(MASK.sum(-1).max())
    for key in ("token_level_rewards", "response_mask", "values"):
        x = np.zeros((len(LAYOUTS), n), np.float32)
        for i in range(len(LAYOUTS)):
            sel = kwargs[key][i][MASK[i] > 0]
            x[i, : len(sel)] = sel
        packed[key] = x
    adv_p, ret_p = run(name, **packed)
    for i in range(len(LAYOUTS)):
        k = int(MASK[i].sum())
        _close(np.asarray(adv)[i][MASK[i] > 0], np.asarray(adv_p)[i, :k], tol=1e-4)
        _close(np.asarray(ret)[i][MASK[i] > 0], np.asarray(ret_p)[i, :k], tol=1e-4)
