"""The typed RL step batch without a model: which optional fields a config asks for, the
abstract layout ahead-of-time compilation uses against a built batch, and the advantage
stage (KL in the reward, the KL controller's update, rollout correction, GRPO) against
hand computations; every stage returns a new batch and leaves its input as it was."""

import dataclasses

import numpy as np
import pytest

from rljax.algos.kl import AdaptiveKLController
from rljax.algos.registry import get_adv_estimator
from rljax.config import load_config
from rljax.rl.advantage_stage import AdvantageStage
from rljax.rl.batch import BatchFields, Sample, StepBatch, abstract_batch, build_batch, take
from rljax.rl.config import RLConfig
from rljax.rl.actor_critic import ActorBatch, CriticBatch

ALWAYS = ["input_ids", "attention_mask", "response_mask", "rollout_log_probs", "token_level_scores", "group_ids",
          "old_log_probs", "token_level_rewards", "advantages", "returns"]


@pytest.mark.parametrize("overrides, extra", [
    ([], []),
    (["algorithm.adv_estimator=gae"], ["values"]),
    (["algorithm.adv_estimator=remax"], ["reward_baselines"]),
    (["actor.use_kl_loss=true", "actor.kl_loss_type=low_var_kl"], ["ref_log_probs"]),
    (["actor.use_kl_loss=true", "actor.kl_loss_type=full"], []),  # the loss runs the reference itself
    (["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=k2"], ["ref_log_probs"]),
    (["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full"], ["full_kl"]),
    (["actor.router_replay=true"], ["expert_ids"]),
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2"],
     ["rollout_is_weights"]),
    (["algorithm.rollout_correction.rollout_rs=token_k1",  # rejection only: no weights
      "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"], []),
    (["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token",
      "algorithm.rollout_correction.rollout_is_threshold=2"], []),  # bypass: in the loss
])
def test_the_config_says_which_optional_fields_a_batch_holds(overrides, extra):
    fields = BatchFields.of(load_config(RLConfig, None, overrides))
    assert sorted(fields.names()) == sorted(ALWAYS + extra)
    order = [f.name for f in dataclasses.fields(StepBatch)]
    assert list(fields.names()) == [n for n in order if n in fields.names()]


def two_samples(routing=False):
    experts = (lambda n: np.arange(n * 2 * 3, dtype=np.int32).reshape(n, 2, 3)) if routing else (lambda n: None)
    return [Sample([5, 6], [7, 8, 9], [1, 1, 1], [-0.1, -0.2, -0.3], group_id=0, score=1.0, expert_ids=experts(5)),
            Sample([5], [7, 3, 3, 8], [1, 0, 0, 1], [-0.5, 0.0, 0.0, -0.7], group_id=1, score=0.5,
                   expert_ids=experts(5))]


def test_abstract_layout_is_the_built_batchs():
    batch = build_batch(two_samples(routing=True), bucket=4, max_length=16)
    assert batch.expert_ids.shape == (2, 8, 2, 3) and (batch.expert_ids[:, 5:] == -1).all()
    assert build_batch(two_samples(), 4, 16).expert_ids is None  # nothing recorded
    spec = abstract_batch(StepBatch, BatchFields(expert_ids=True), rows=2, length=8, routing=(2, 3))
    for name, array in ((f.name, getattr(batch, f.name)) for f in dataclasses.fields(StepBatch)):
        if array is not None:
            assert (getattr(spec, name).shape, getattr(spec, name).dtype) == (array.shape, array.dtype), name
    assert spec.values is None and spec.advantages.shape == (2, 8)  # not asked for / filled later
    actor = abstract_batch(ActorBatch, BatchFields(), rows=2, length=8)
    assert actor.ref_log_probs is None and actor.expert_ids is None and actor.old_log_probs.shape == (2, 8)


def test_a_finished_batch_is_checked_against_its_fields():
    batch = build_batch(two_samples(), 4, 16)
    zeros = np.zeros((2, 8), np.float32)
    done = dataclasses.replace(batch, old_log_probs=zeros, token_level_rewards=zeros, advantages=zeros, returns=zeros)
    BatchFields().check(done)
    with pytest.raises(ValueError, match=r"holds \[\] it should not and lacks \['values'\]"):
        BatchFields(values=True).check(done)
    with pytest.raises(ValueError, match=r"lacks \['advantages', 'returns'\]"):
        BatchFields().check(dataclasses.replace(done, advantages=None, returns=None))
    critic = take(CriticBatch, dataclasses.replace(done, values=zeros))
    assert critic.values is zeros and critic.returns is zeros


def hand_batch():
    """4 samples in 2 groups, 4 tokens each, the last 3 sampled (row 3: the last 2)."""
    mask = np.array([[0, 1, 1, 1]] * 3 + [[0, 0, 1, 1]], np.float32)
    rng = np.random.RandomState(0)
    old = (rng.randn(4, 4) * 0.5 - 2).astype(np.float32) * mask
    ref = (rng.randn(4, 4) * 0.5 - 2).astype(np.float32) * mask
    scores = np.zeros((4, 4), np.float32)
    scores[:, 3] = [1.0, 0.0, 1.0, 1.0]
    return StepBatch(input_ids=np.ones((4, 4), np.int32), attention_mask=np.ones((4, 4), np.int32),
                     response_mask=mask, rollout_log_probs=old.copy(), token_level_scores=scores,
                     group_ids=np.array([0, 0, 1, 1], np.int32), old_log_probs=old, ref_log_probs=ref)


def snapshot(batch):
    return {k: None if v is None else np.array(v) for k, v in vars(batch).items()}


def assert_unchanged(batch, before):
    for k, v in vars(batch).items():
        np.testing.assert_array_equal(v, before[k]) if v is not None else None
        assert (v is None) == (before[k] is None), k


def test_kl_in_reward_controller_update_and_grpo_by_hand():
    stage = AdvantageStage(estimator=get_adv_estimator("grpo"), kl_penalty="kl", kl_ctrl_steps=2, correction=None,
                           gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True)
    batch = hand_batch()
    before = snapshot(batch)
    ctrl = AdaptiveKLController(value=0.5, target=0.1, horizon=10.0)
    out, metrics, new_ctrl = stage(batch, ctrl)
    assert_unchanged(batch, before)  # a new batch; the input is as it was
    m = batch.response_mask
    kl = (batch.old_log_probs - batch.ref_log_probs) * m  # k1 = log pi_old - log pi_ref
    rewards = batch.token_level_scores - 0.5 * kl
    np.testing.assert_allclose(out.token_level_rewards, rewards, rtol=1e-6, atol=1e-7)
    current = np.mean([kl[i].sum() / m[i].sum() for i in range(4)])  # mean over rows of the token mean
    np.testing.assert_allclose(metrics["actor/reward_kl_penalty"], current, rtol=1e-5)
    # Ziegler et al.: value * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)
    np.testing.assert_allclose(new_ctrl.value, 0.5 * (1 + np.clip(current / 0.1 - 1, -0.2, 0.2) * 2 / 10), rtol=1e-6)
    assert ctrl.value == 0.5  # the controller given is untouched
    s = rewards.sum(-1)
    adv = np.empty(4)
    for g in ((0, 1), (2, 3)):  # unbiased std of 2 values: |a - b| / sqrt(2)
        a, b = s[list(g)]
        adv[list(g)] = (s[list(g)] - (a + b) / 2) / (abs(a - b) / np.sqrt(2) + 1e-6)
    np.testing.assert_allclose(out.advantages, adv[:, None] * m, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out.returns, out.advantages)
    assert out.rollout_is_weights is None and out.response_mask is batch.response_mask


def test_decoupled_correction_weights_and_rejections_by_hand():
    cfg = load_config(RLConfig, None, ["algorithm.rollout_correction.rollout_is=token",
                                       "algorithm.rollout_correction.rollout_is_threshold=1.5",
                                       "algorithm.rollout_correction.rollout_rs=token_k1",
                                       "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"])
    stage = AdvantageStage.of(cfg)
    batch = hand_batch()
    log_rho = np.array([[0, 0.3, -0.3, 1.0]] * 4, np.float32)  # rho = pi_old / pi_rollout
    batch = dataclasses.replace(batch, rollout_log_probs=(batch.old_log_probs - log_rho) * batch.response_mask,
                                ref_log_probs=None)
    before = snapshot(batch)
    ctrl = AdaptiveKLController(value=0.5, target=0.1, horizon=10.0)
    out, metrics, same = stage(batch, ctrl)
    assert same is ctrl  # no KL in the reward: no update
    assert_unchanged(batch, before)
    m = batch.response_mask
    rho = np.exp(log_rho)
    kept = m * (1 / rho >= 0.5) * (1 / rho <= 2.0)  # token_k1 bounds exp(k1) = 1 / rho: e^1 is rejected
    np.testing.assert_array_equal(out.response_mask, kept)
    np.testing.assert_allclose(out.rollout_is_weights, np.minimum(rho, 1.5) * m, rtol=1e-5)
    assert not out.advantages[kept == 0].any()  # rejected tokens carry no advantage
    np.testing.assert_allclose(metrics["rollout_corr/rollout_rs_masked_fraction"], 1 - kept.sum() / m.sum(),
                               rtol=1e-5)
    np.testing.assert_array_equal(out.token_level_rewards, batch.token_level_scores)
    BatchFields.of(cfg).check(out)
