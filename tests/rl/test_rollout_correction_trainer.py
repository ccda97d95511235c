"""Rollout correction and the full-vocabulary KL through the RL trainer, on the tiny run of
test_rl_train: the sampler's log-probs are shifted by a known per-token offset d before the
batch is built, so rho = pi_train / pi_rollout = e^-d (up to the sampler/trainer mismatch,
< 1e-4) and every weight and rejection can be checked by hand.

One trainer per mode family: decoupled (token IS + token_k2 rejection + veto, with
kl_loss_type=full and kl_penalty=full) and bypass (REINFORCE with IS, token_k1 rejection)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.rl.trainer import RLTrainer

from .test_rl_train import make_config

pytestmark = pytest.mark.slow

OFFSETS = np.array([0.0, 0.4, -0.4, 1.0, -1.0], np.float32)
VETO_OFFSET = 1.5  # rho = e^-1.5 = 0.22 < the veto threshold 0.3


def offset(i: int, j: int) -> float:
    """Sample i, response token j: the shift of the sampler's log-prob."""
    return VETO_OFFSET if (i % 4 == 0 and j == 0) else float(OFFSETS[(3 * i + j) % 5])


def shift_rollout_log_probs(trainer) -> dict:
    """Shift the sampler's log-probs before make_batch; record the batch, the unshifted
    log-probs and d (both [B, T], aligned with the batch)."""
    captured = {}
    make_batch = trainer.make_batch

    def spy(rollout, timer):
        shifts = []
        for i, s in enumerate(rollout.samples):
            d = [offset(i, j) for j in range(len(s.response_ids))]
            s.response_log_probs = [lp + dj for lp, dj in zip(s.response_log_probs, d)]
            shifts.append(d)
        batch, metrics = make_batch(rollout, timer)
        d = np.zeros_like(batch.rollout_log_probs)
        for i, s in enumerate(rollout.samples):
            p = len(s.prompt_ids)
            d[i, p : p + len(shifts[i])] = shifts[i]
        captured.update(batch=batch, d=d, original=batch.rollout_log_probs - d)
        return batch, metrics

    trainer.make_batch = spy
    return captured


def test_decoupled_correction_and_full_kl_through_the_trainer(tmp_path):
    cfg = make_config(tmp_path, "trainer.total_steps=2", "actor.optim.lr=1e-2",
                      "actor.use_kl_loss=true", "actor.kl_loss_type=full", "actor.kl_loss_coef=0.1",
                      "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full",
                      "algorithm.kl_ctrl.kl_coef=0.5",
                      "algorithm.rollout_correction.rollout_is=token",
                      "algorithm.rollout_correction.rollout_is_threshold=1.5",
                      "algorithm.rollout_correction.rollout_rs=token_k2",
                      "algorithm.rollout_correction.rollout_rs_threshold=0.3",
                      "algorithm.rollout_correction.rollout_token_veto_threshold=0.3")
    trainer = RLTrainer(cfg)
    captured = shift_rollout_log_probs(trainer)
    correction = trainer.advantage_stage.correction

    def record(old, rollout, mask):  # the response mask before rejection, and the params in use
        captured.update(mask=np.asarray(mask), params=jax.device_get(trainer.actor.state.params))
        return correction(old, rollout, mask)

    trainer.advantage_stage = dataclasses.replace(trainer.advantage_stage, correction=record)
    for step in range(2):
        metrics = trainer.step()
        batch, d, mask = captured["batch"], captured["d"], captured["mask"]

        # by hand: log rho = old - rollout = -d (up to the sampler / trainer mismatch)
        log_rho = batch.old_log_probs - batch.rollout_log_probs
        np.testing.assert_allclose(log_rho * mask, -d * mask, atol=2e-4)
        rho = np.exp(log_rho)
        weights = np.minimum(rho, 1.5) * mask
        np.testing.assert_allclose(batch.rollout_is_weights, weights, rtol=1e-5, atol=1e-6)
        token_ok = 0.5 * log_rho**2 <= 0.3
        vetoed = ((rho < 0.3) & (mask > 0)).any(-1)
        kept = mask * token_ok * ~vetoed[:, None]
        np.testing.assert_array_equal(batch.response_mask, kept)
        assert vetoed.any() and 0 < kept.sum() < (mask * ~vetoed[:, None]).sum()  # both kinds of rejection
        np.testing.assert_allclose(metrics["rollout_corr/rollout_is_veto_fraction"], vetoed.mean(), rtol=1e-6)
        np.testing.assert_allclose(metrics["rollout_corr/rollout_rs_token_k2_masked_fraction"],
                                   ((1 - token_ok) * mask).sum() / mask.sum(), rtol=1e-5)
        # one mini-batch, updated from pi_old (ratio 1): vanilla PPO's term is -sum(w A) / sum(m) over kept tokens
        np.testing.assert_allclose(metrics["actor/pg_loss"], -(weights * batch.advantages * kept).sum() / kept.sum(),
                                   rtol=1e-4, atol=1e-6)

        # KL in the reward: -kl_coef * KL(pi_old || pi_ref), the KL straight from full [B, T, V] logits
        kl = direct_full_kl(trainer.actor.graphdef, captured["params"], trainer.reference,
                            jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask))
        np.testing.assert_allclose(batch.full_kl, kl, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(batch.token_level_rewards, batch.token_level_scores - 0.5 * kl * mask,
                                   rtol=1e-5, atol=1e-6)
        assert np.isfinite(metrics["actor/kl_loss"])
        if step == 0:  # the actor is the reference: KL 0
            assert metrics["actor/reward_kl_penalty"] < 1e-6 and metrics["actor/kl_loss"] < 1e-6
        else:
            assert metrics["actor/reward_kl_penalty"] > 1e-6 and metrics["actor/kl_loss"] > 1e-6
    trainer.close()


def direct_full_kl(graphdef, params, reference, ids, attn):
    model, ref = nnx.merge(graphdef, params), nnx.merge(graphdef, reference)
    log_p = jax.nn.log_softmax(model.hidden_states(ids, attn) @ model.unembedding(), -1)
    log_q = jax.nn.log_softmax(ref.hidden_states(ids, attn) @ ref.unembedding(), -1)
    return np.asarray(jnp.pad(jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1)[:, :-1], ((0, 0), (1, 0))))


def test_bypass_reinforce_through_the_trainer(tmp_path):
    """Bypass: old log-probs are the (shifted) sampler's; in the loss rho = pi_theta /
    pi_rollout = e^-d at the first update (pi_theta = the sampler's policy), so the
    REINFORCE loss and the rejected fraction follow from d by hand."""
    cfg = make_config(tmp_path, "trainer.total_steps=1", "actor.optim.lr=1e-2",
                      "algorithm.rollout_correction.bypass_mode=true",
                      "algorithm.rollout_correction.loss_type=reinforce",
                      "algorithm.rollout_correction.rollout_is=token",
                      "algorithm.rollout_correction.rollout_is_threshold=1.5",
                      "algorithm.rollout_correction.rollout_rs=token_k1",
                      "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0")
    trainer = RLTrainer(cfg)
    assert trainer.advantage_stage.correction is None  # nothing on the batch: it is all in the loss
    captured = shift_rollout_log_probs(trainer)
    metrics = trainer.step()
    trainer.close()
    batch, d, original = captured["batch"], captured["d"], captured["original"]
    m = batch.response_mask
    np.testing.assert_array_equal(batch.old_log_probs, batch.rollout_log_probs)
    assert batch.rollout_is_weights is None
    rho = np.exp(-d)
    kept = m * (1 / rho >= 0.5) * (1 / rho <= 2.0)  # token_k1 bounds exp(k1) = 1 / rho
    assert 0 < kept.sum() < m.sum()
    np.testing.assert_allclose(metrics["rollout_corr/rollout_rs_masked_fraction"], 1 - kept.sum() / m.sum(),
                               rtol=1e-5)
    # log pi_theta = the unshifted sampler log-prob (to < 1e-4)
    expected = -(np.minimum(rho, 1.5) * batch.advantages * original * kept).sum() / m.sum()
    np.testing.assert_allclose(metrics["actor/pg_loss"], expected, rtol=2e-3, atol=1e-5)
