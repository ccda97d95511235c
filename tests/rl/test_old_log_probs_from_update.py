"""Old log-probs from the update itself (`rljax.rl.batch.old_log_probs_from_update`): with
one optimizer step per batch the actor's own forward, detached, is pi_old, and the
separate old-log-prob forward is skipped. When it applies, and that a step taken this way
equals one with the forward: parameters, losses, the filled old log-probs."""

import dataclasses

import jax
import numpy as np
import pytest

import rljax.rl.trainer as trainer_module
from rljax.config import load_config
from rljax.rl.batch import old_log_probs_from_update
from rljax.rl.config import RLConfig
from rljax.rl.trainer import RLTrainer
from tests.rl.test_rl_train import make_config


@pytest.mark.parametrize("overrides, applies", [
    ([], True),  # one epoch over one mini-batch of the whole batch
    (["actor.ppo_epochs=2"], False),  # the second pass runs at new parameters
    (["data.train_batch_size=16"], False),  # two mini-batches of 8: the second at new parameters
    (["algorithm.use_kl_in_reward=true"], False),  # the reward's KL needs them before the update
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2"], False),
    (["algorithm.rollout_correction.bypass_mode=true"], False),  # the sampler's: no forward at all
    (["actor.use_rollout_log_probs=true"], False),
    (["model.lora.rank=4", "model.lora.dropout=0.1"], False),  # the update's forward drops out, the old one not
    (["model.lora.rank=4"], True),
    (["actor.use_kl_loss=true", "algorithm.adv_estimator=gae"], True),  # a KL loss and a critic change nothing
])
def test_when_the_update_gives_the_old_log_probs(overrides, applies):
    assert old_log_probs_from_update(load_config(RLConfig, None, overrides)) is applies


@pytest.mark.slow
def test_a_step_with_them_equals_a_step_with_their_own_forward(tmp_path, monkeypatch):
    cfg = make_config(tmp_path, "trainer.total_steps=1", "actor.optim.lr=1e-2", "actor.ppo_micro_batch_size_per_device=4")
    seen = {}
    mismatch = trainer_module.rollout_mismatch
    monkeypatch.setattr(trainer_module, "rollout_mismatch", lambda batch: seen.setdefault("batch", batch) is not None
                        and mismatch(batch))
    results = {}
    for shortcut in (True, False):
        trainer = RLTrainer(cfg)
        try:
            assert trainer.fields.old_log_probs_from_update and trainer.forwards.old_from_update
            if not shortcut:  # the forward of their own, as verl always runs it
                trainer.fields = dataclasses.replace(trainer.fields, old_log_probs_from_update=False)
                trainer.forwards.old_from_update = False
            seen.clear()
            metrics = trainer.step()
            params = [np.asarray(x) for x in jax.tree.leaves(trainer.actor.state.params)]
            results[shortcut] = (metrics, params, seen["batch"])
        finally:
            trainer.close()
    (m1, p1, b1), (m0, p0, b0) = results[True], results[False]
    assert "timing_s/old_log_prob" in m0 and "timing_s/old_log_prob" not in m1
    np.testing.assert_array_equal(b1.input_ids, b0.input_ids)  # the same samples
    mask = b0.response_mask > 0
    np.testing.assert_allclose(b1.old_log_probs[mask], b0.old_log_probs[mask], atol=1e-5)
    for key in ("actor/pg_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/grad_norm", "actor/entropy",
                "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max"):
        np.testing.assert_allclose(m1[key], m0[key], rtol=1e-4, atol=1e-6, err_msg=key)
    # the update packs its rows, the old forward does not: pi_theta / pi_old is 1 up to float
    # rounding there, and AdamW's first step (lr x g / |g|) magnifies that on near-zero gradients
    for a, b in zip(p1, p0):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert m1["actor/ppo_kl"] == 0.0 and m1["actor/pg_clipfrac"] == 0.0  # the ratio is exactly 1


def test_a_kl_loss_of_weight_zero_needs_no_reference():
    """`actor.use_kl_loss` with `kl_loss_coef: 0` adds nothing to the loss: no reference
    log-probs in the batch, so no reference forward; any other weight keeps them."""
    from rljax.rl.batch import BatchFields

    zero = load_config(RLConfig, None, ["actor.use_kl_loss=true", "actor.kl_loss_coef=0"])
    assert not zero.actor.kl_loss and not BatchFields.of(zero).ref_log_probs
    some = load_config(RLConfig, None, ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.001"])
    assert some.actor.kl_loss and BatchFields.of(some).ref_log_probs
