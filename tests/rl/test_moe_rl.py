"""GRPO on a tiny Qwen3-MoE (float32) with and without routing replay
(`actor.router_replay`): the sampler records each token's experts, the trainer's
forwards route to them, and the KL term reads token log-probs only."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.config import load_config
from rljax.rl.config import RLConfig
from rljax.rl.actor_critic import ActorBatch, actor_objective
from rljax.rl.trainer import RLTrainer

from .test_rl_train import capture_batches, make_config

MOE = {"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
       "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "num_hidden_layers": 2,
       "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "tie_word_embeddings": True,
       "initializer_range": 0.2}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def moe_config(tmp_path, *overrides):
    hf = [f"model.hf_config.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in MOE.items()]
    return make_config(tmp_path, *hf, "actor.use_kl_loss=true", "actor.kl_loss_type=low_var_kl",
                       "actor.kl_loss_coef=0.1", "actor.optim.lr=1e-2", "algorithm.adv_estimator=grpo", *overrides)


def low_var_kl(log_p, ref_log_p):
    """Schulman's k3 estimator of KL(pi || pi_ref) per token, clipped to [-10, 10] (verl)."""
    d = ref_log_p - log_p
    return np.clip(np.exp(d) - d - 1, -10, 10)


@pytest.fixture(scope="module")
def replay_step(tmp_path_factory):
    """One GRPO step with routing replay: the trainer and the batch it built."""
    trainer = RLTrainer(moe_config(tmp_path_factory.mktemp("replay"), "actor.router_replay=true"))
    before = jax.tree.map(np.asarray, trainer.actor.params)
    captured = capture_batches(trainer)
    metrics = trainer.step()
    yield trainer, captured["batch"], metrics, before
    trainer.close()


@pytest.mark.slow
def test_replay_makes_old_log_probs_the_rollouts(replay_step):
    trainer, batch, metrics, before = replay_step
    experts, mask, response = batch.expert_ids, batch.attention_mask, batch.response_mask > 0
    assert experts.shape == (*batch.input_ids.shape, 2, 2)
    assert (experts[mask == 0] == -1).all()  # padding has no record
    lengths = mask.sum(1)
    for i, n in enumerate(lengths):  # every token but the last (never fed to the sampler) recorded
        assert (experts[i, : n - 1] >= 0).all() and (experts[i, n - 1] == -1).all()
    diff = np.abs(batch.old_log_probs - batch.rollout_log_probs)[response]
    assert diff.max() < 1e-5, diff.max()
    assert metrics["training/rollout_probs_diff_max"] < 1e-5
    assert np.isfinite(metrics["actor/pg_loss"]) and np.isfinite(metrics["actor/kl_loss"])
    after = jax.tree.map(np.asarray, trainer.actor.params)
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


@pytest.mark.slow
def test_the_replayed_ids_are_used(replay_step):
    """Other experts at recorded tokens change the log-probs: the forwards read the record."""
    trainer, batch, _, before = replay_step
    params = jax.tree.map(jnp.asarray, before)  # the weights the old log-probs were computed with
    experts = batch.expert_ids
    shifted = np.where(experts >= 0, (experts + 1) % MOE["num_experts"], -1)  # still k distinct experts
    ids, mask = batch.input_ids, batch.attention_mask
    same = np.asarray(trainer.forwards.log_probs(params, ids, mask, experts))
    moved = np.asarray(trainer.forwards.log_probs(params, ids, mask, shifted))
    response = batch.response_mask > 0
    np.testing.assert_allclose(same[response], batch.old_log_probs[response], atol=1e-5)
    assert np.abs(moved - same)[response].max() > 1e-2


@pytest.mark.slow
def test_kl_term_reads_token_log_probs_only(replay_step):
    """The reference routes its own way (no replay), and the actor's KL loss is k3 of the
    policy's token log-probs (under the routing it ran) against the reference's: the same
    hand-computed value with replay on or off, whatever routing the batch records."""
    trainer, batch, _, before = replay_step
    params = jax.tree.map(jnp.asarray, before)
    ids, mask = batch.input_ids, batch.attention_mask
    response = batch.response_mask
    np.testing.assert_allclose(batch.ref_log_probs,
                               np.asarray(trainer.forwards.log_probs(trainer.reference, ids, mask)), atol=1e-5)
    graphdef = trainer.actor.graphdef
    shifted = np.where(batch.expert_ids >= 0, (batch.expert_ids + 3) % MOE["num_experts"], -1)
    cfg = trainer.cfg
    kls = []
    for replay, experts in ((False, batch.expert_ids), (True, batch.expert_ids), (True, shifted)):
        actor = cfg.actor.__class__(**{**vars(cfg.actor), "router_replay": replay})
        objective, totals = actor_objective(actor, 1.0)
        mini = ActorBatch(**{k: jnp.asarray(getattr(batch, k)) for k in (
            "input_ids", "attention_mask", "response_mask", "old_log_probs", "advantages", "ref_log_probs")},
            expert_ids=jnp.asarray(experts))
        run = jax.jit(lambda p, b, o=objective, t=totals: o(nnx.merge(graphdef, p), b, None, t(b),
                                                            jax.random.key(0))[1]["actor/kl_loss"])
        kl = float(run(params, mini))
        policy = np.asarray(trainer.forwards.log_probs(params, ids, mask, experts if replay else None))
        want = (low_var_kl(policy, batch.ref_log_probs) * response).sum() / response.sum()  # token-mean
        np.testing.assert_allclose(kl, want, rtol=1e-5, atol=1e-7)
        kls.append(kl)
    np.testing.assert_allclose(kls[1], kls[0], rtol=1e-5)  # replaying the policy's own routing: the same KL
    assert abs(kls[2] - kls[0]) > 1e-6  # another routing is another policy, with another KL


@pytest.mark.slow
def test_grpo_step_without_replay(tmp_path):
    trainer = RLTrainer(moe_config(tmp_path))
    captured = capture_batches(trainer)
    metrics = trainer.step()
    trainer.close()
    assert captured["batch"].expert_ids is None  # nothing recorded
    assert np.isfinite(metrics["actor/pg_loss"])
    # float32: the sampler's and the trainer's own top-k agree, so the log-probs do too
    assert metrics["training/rollout_probs_diff_max"] < 1e-4


@pytest.mark.slow
def test_replay_on_rollout_replicas_after_a_weight_hand_off(tmp_path):
    """Two rollout replicas of one device each (on 2 of the 8 training devices): each
    replica records its own samples' experts, and after the update's hand-off the
    second step's recomputed old log-probs are still the rollout's."""
    trainer = RLTrainer(moe_config(tmp_path, "actor.router_replay=true", "rollout.tensor_parallel_size=1",
                                   "rollout.data_parallel_size=2"))
    assert trainer.generation.replicas is not None and trainer.generation.replicas.layout.num_replicas == 2
    captured = capture_batches(trainer)
    trainer.step()
    metrics = trainer.step()
    trainer.close()
    batch = captured["batch"]
    for experts, n in zip(batch.expert_ids, batch.attention_mask.sum(1)):  # all but the last token recorded
        assert (experts[: n - 1] >= 0).all() and (experts[n - 1:] == -1).all()
    diff = np.abs(batch.old_log_probs - batch.rollout_log_probs)[batch.response_mask > 0]
    assert diff.max() < 1e-5, diff.max()
    assert metrics["training/rollout_probs_diff_max"] < 1e-5


@pytest.mark.slow
def test_router_replay_refused_for_dense_models_only(tmp_path):
    with pytest.raises(Exception, match=r"actor.router_replay: the model \(qwen2\) is dense"):
        RLTrainer(make_config(tmp_path, "actor.router_replay=true"))
    # agent rollouts stitch each episode's routing from its turns (tests/rl/test_agent_rl.py)
    cfg = load_config(RLConfig, os.path.join(REPO, "configs", "agent_quickstart.yaml"), ["actor.router_replay=true"])
    assert cfg.actor.router_replay and cfg.agent is not None
