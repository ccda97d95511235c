"""The RL loop end to end on a tiny random model: GRPO learns a reward, PPO updates
actor and critic. The reward is a custom function loaded from a file, as users do."""

import os

import jax
import numpy as np
import pytest
from flax import nnx

from rljax.config import load_config
from rljax.rl.config import RLConfig
from rljax.rl.trainer import RLTrainer
from tests.tiny_models import tiny_qwen2_hf

pytestmark = pytest.mark.slow

DIGIT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Fraction of the response's characters that are digits."""
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
'''

BASE = {
    "model": {"tokenizer": "char", "hf_config": tiny_qwen2_hf()},
}


def make_config(tmp_path, *overrides):
    reward = tmp_path / "digit_reward.py"
    reward.write_text(DIGIT_REWARD)
    import yaml
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return load_config(RLConfig, str(path), [
        f"trainer.default_local_dir={tmp_path}", "trainer.logger=[jsonl]", "trainer.async_save=false",
        'data.train_files=["synthetic:arithmetic/rl?n=512&seed=0&digits=1"]', "data.train_batch_size=8",
        "data.max_prompt_length=32", "data.bucket_size=16", "rollout.n=8", "rollout.response_length=8",
        "rollout.max_num_seqs=64", "rollout.num_pages=256", "rollout.page_size=8", "actor.ppo_mini_batch_size=8",
        f"reward.custom_reward_function.path={reward}", "reward.mode=inline", "trainer.save_freq=0",
        *overrides])


def capture_batches(trainer) -> dict:
    """Record the rollout and the batch of the trainer's next step(s) in the returned dict:
    the batch after the update (with old log-probs even where the update computes them)."""
    captured = {}
    make_batch, update = trainer.make_batch, trainer.update

    def spy_batch(rollout, timer):
        batch, metrics = make_batch(rollout, timer)
        captured["rollout"], captured["batch"] = rollout, batch
        return batch, metrics

    def spy_update(batch, timer):
        batch, metrics = update(batch, timer)
        captured["batch"] = batch
        return batch, metrics

    trainer.make_batch, trainer.update = spy_batch, spy_update
    return captured


def test_grpo_raises_a_learnable_reward(tmp_path):
    cfg = make_config(tmp_path, "trainer.total_steps=14", "actor.optim.lr=1e-2", "actor.optim.weight_decay=0.0",
                      "algorithm.adv_estimator=grpo")
    history = RLTrainer(cfg).fit()
    scores = [h["critic/score/mean"] for h in history]
    first, last = np.mean(scores[:3]), np.mean(scores[-3:])
    print("GRPO digit-fraction reward per step:", np.round(scores, 3))
    # 64 samples per step: the noise of a step's mean is ~0.03; demand 10x that
    assert last > first + 0.3, scores
    assert all(np.isfinite(h["actor/pg_loss"]) for h in history)
    assert history[-1]["training/rollout_probs_diff_max"] < 1e-4  # sampler == trainer log-probs


def test_ppo_step_updates_actor_and_critic(tmp_path):
    cfg = make_config(tmp_path, "trainer.total_steps=1", "algorithm.adv_estimator=gae", "algorithm.lam=0.95",
                      "actor.optim.lr=1e-3", "critic.optim.lr=2e-3",
                      "critic.ppo_mini_batch_size=8")
    trainer = RLTrainer(cfg)
    before_actor = jax.device_get(trainer.actor.state.params)
    before_critic = jax.device_get(trainer.critic.state.params)
    metrics = trainer.step()
    trainer.save()
    trainer.close()
    changed = lambda a, b: any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    assert changed(before_actor, jax.device_get(trainer.actor.state.params))
    assert changed(before_critic, jax.device_get(trainer.critic.state.params))
    for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/values/mean", "actor/pg_loss", "actor/pg_clipfrac",
                "actor/ppo_kl", "actor/entropy", "timing_s/gen", "timing_s/update_critic", "timing_s/update_actor",
                "response_length/mean", "perf/throughput"):
        assert key in metrics, key
    # each module's train-step metrics under its own name (verl's actor/lr, critic/grad_norm)
    assert metrics["actor/lr"] == pytest.approx(1e-3) and metrics["critic/lr"] == pytest.approx(2e-3)
    assert metrics["actor/grad_norm"] > 0 and metrics["critic/grad_norm"] > 0
    assert metrics["actor/grad_norm"] != metrics["critic/grad_norm"]
    assert not any(k.startswith("train/") and k not in ("train/num_gen_batches", "train/filter_groups_underfilled")
                   for k in metrics), sorted(k for k in metrics if k.startswith("train/"))

    # `rljax export` of an RL run writes the policy (the actor's parameters, read alone)
    from rljax.models import load_hf
    from rljax.commands.export import export_run

    out = export_run(os.path.join(cfg.trainer.default_local_dir, cfg.trainer.experiment_name),
                     str(tmp_path / "policy_hf"))
    exported = jax.device_get(nnx.state(load_hf(out, dtype="float32"), nnx.Param))
    trained = jax.device_get(trainer.actor.state.params)
    assert jax.tree.structure(exported) == jax.tree.structure(trained)
    for x, y in zip(jax.tree.leaves(exported), jax.tree.leaves(trained)):
        np.testing.assert_array_equal(x, y)


def test_grpo_steps_on_a_mixture_of_experts(tmp_path):
    """GRPO on a tiny Qwen3-MoE (8 experts, top 2) with the load-balancing loss and a KL
    loss, on the default mesh (experts over fsdp = 8): finite updates, the aux loss
    reported, and the sampler's log-probs equal the trainer's (fp32, no routing replay)."""
    moe = {"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
           "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}
    cfg = make_config(tmp_path, "trainer.total_steps=2", "actor.optim.lr=1e-3", "algorithm.adv_estimator=grpo",
                      "actor.use_kl_loss=true", "actor.router_aux_loss_coef=0.01",
                      "model.hf_config=" + str(moe).replace("'", ""))
    history = RLTrainer(cfg).fit()
    for h in history:
        assert np.isfinite(h["actor/pg_loss"]) and np.isfinite(h["actor/kl_loss"])
        assert 0.0 < h["actor/router_aux_loss"] <= 8.0  # X sum_e f_e P_e: k = 2 when uniform, at most X = 8
    print("MoE sampler vs trainer log-prob diff max:", [h["training/rollout_probs_diff_max"] for h in history])
    assert history[-1]["training/rollout_probs_diff_max"] < 1e-4
