"""LoRA in the RL loop: GRPO with adapters learns a reward; after every update the
sampler's log-probs equal the trainer's (the adapters handed over, none stale); the KL
reference is the base model (checked against a model built without adapters)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models.lora import LoRAConfig
from rljax.rl.trainer import RLTrainer
from rljax.train.setup import build_decoder
from tests.rl.test_rl_train import capture_batches, make_config

pytestmark = pytest.mark.slow


def test_lora_grpo_learns_with_fresh_sampler_adapters_and_the_base_as_reference(tmp_path):
    cfg = make_config(tmp_path, "trainer.total_steps=10", "actor.optim.lr=3e-2", "actor.optim.weight_decay=0.0",
                      "algorithm.adv_estimator=grpo", "model.lora.rank=4", "model.lora.alpha=8",
                      "model.hf_config.initializer_range=0.2", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.001")
    trainer = RLTrainer(cfg)
    assert trainer.reference is None  # no second copy of the weights
    captured = capture_batches(trainer)
    history = []
    for _ in range(cfg.trainer.total_steps):
        history.append(trainer.step())
        trainer.step_count = len(history)
    batch = captured["batch"]  # the last step's, taken after 9 updates of the adapters
    with jax.set_mesh(trainer.mesh):
        plain = build_decoder(dataclasses.replace(cfg.model, lora=LoRAConfig()), trainer.tokenizer, mesh=trainer.mesh)
        ref = plain.token_log_probs(jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask),
                                    temperature=cfg.rollout.temperature)
    trainer.close()
    mask = batch.response_mask > 0
    np.testing.assert_allclose(batch.ref_log_probs[mask], np.asarray(ref)[mask], atol=1e-5)
    assert np.abs(batch.old_log_probs - batch.ref_log_probs)[mask].max() > 1e-3  # the policy moved

    scores = [h["critic/score/mean"] for h in history]
    print("LoRA GRPO digit-fraction reward per step:", np.round(scores, 3))
    assert np.mean(scores[-3:]) > np.mean(scores[:3]) + 0.2, scores
    diffs = [h["training/rollout_probs_diff_max"] for h in history]
    print("sampler vs trainer max |log-prob diff| per step:", diffs)
    assert max(diffs) <= 1e-5  # every step samples with the adapters of the previous update


def test_lora_grpo_stopped_after_a_checkpoint_resumes_bit_identically(tmp_path):
    """GRPO with adapters (dropout on, KL to the adapters-off base) stopped after its
    step-2 checkpoint and resumed ends as the uninterrupted run: adapters, AdamW state
    and every step-3/4 metric equal (the dropout masks follow the restored (seed, step))."""
    import pytest

    def config(name):
        (tmp_path / name).mkdir()
        return make_config(tmp_path / name, "trainer.total_steps=4", "trainer.save_freq=2", "rollout.n=4",
                           "actor.ppo_mini_batch_size=4", "algorithm.adv_estimator=grpo", "actor.optim.lr=1e-2",
                           "model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0.1",
                           "model.lora.target_modules=[q_proj,down_proj]", "model.hf_config.initializer_range=0.2",
                           "actor.use_kl_loss=true", "actor.kl_loss_coef=0.01")

    straight = RLTrainer(config("straight"))
    full = straight.fit()

    stopped_cfg = config("stopped")
    stopped = RLTrainer(stopped_cfg)
    run_step = stopped.step

    def stop_at_3():
        if stopped.step_count == 2:  # after the step-2 checkpoint: Ctrl-C
            raise KeyboardInterrupt
        return run_step()

    stopped.step = stop_at_3
    with pytest.raises(KeyboardInterrupt):
        stopped.fit()
    resumed = RLTrainer(stopped_cfg)
    assert resumed.step_count == 2
    tail = resumed.fit()
    assert [h["step"] for h in tail] == [3, 4]

    for x, y in zip(jax.tree.leaves(jax.device_get(straight.actor.state)),
                    jax.tree.leaves(jax.device_get(resumed.actor.state))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    names = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(resumed.actor.state.params)}
    assert names == {f"['layers']['{t}_lora_{w}'].value" for t in ("q_proj", "down_proj") for w in "ab"}
    assert np.abs(jax.device_get(resumed.actor.state.params["layers"]["q_proj_lora_b"].get_value())).max() > 0
    timing = ("timing", "perf/", "throughput")
    for a, b in zip(full[2:], tail):
        keys = sorted(k for k in a if not any(t in k for t in timing))
        assert keys == sorted(k for k in b if not any(t in k for t in timing))
        assert [a[k] for k in keys] == [b[k] for k in keys], [(k, a[k], b[k]) for k in keys if a[k] != b[k]]
    assert max(h["training/rollout_probs_diff_max"] for h in full) <= 1e-5  # no dropout outside the train step


def base_buffers(trainer) -> set[int]:
    """Device buffers of the rollout replicas' base weights (every non-adapter leaf)."""
    return {shard.data.unsafe_buffer_pointer() for sampler in trainer.generation.replicas.samplers.values()
            for path, leaf in jax.tree_util.tree_leaves_with_path(sampler.engine.state)
            if "_lora_" not in jax.tree_util.keystr(path) for shard in leaf.addressable_shards}


def test_lora_grpo_on_rollout_replicas_equals_the_mesh_sampler_and_hands_off_only_adapters(tmp_path):
    """The same LoRA GRPO run sampling on the training mesh and on 4 replicas of 2
    devices: the same tokens, metrics within 1e-5; after an update each replica gets the
    new adapters (its base kept: the hand-off allocates at most the adapters' bytes)."""
    out = {}
    for name, extra in (("mesh", []), ("replicas", ["rollout.tensor_parallel_size=2"])):
        (tmp_path / name).mkdir()
        cfg = make_config(tmp_path / name, "trainer.total_steps=2", "algorithm.adv_estimator=grpo",
                          "rollout.n=4", "actor.optim.lr=1e-2", "model.lora.rank=4", "model.lora.alpha=8",
                          "model.hf_config.initializer_range=0.2", "model.hf_config.num_key_value_heads=2", *extra)
        trainer = RLTrainer(cfg)
        try:
            captured = capture_batches(trainer)
            metrics = [trainer.step()]
            kept = base_buffers(trainer) if name == "replicas" else None
            metrics.append(trainer.step())
            out[name] = (captured["batch"], metrics)
            if name == "replicas":
                assert base_buffers(trainer) == kept  # every replica's copy of the base stays
                replicas = trainer.generation.replicas
                assert replicas.layout.num_replicas == 4
                adapters = trainer.actor.state.params
                adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(adapters))
                base_bytes = sum(x.nbytes for x in jax.tree.leaves(trainer.actor.base))
                moved = replicas.last_hand_off.allocated_bytes  # the hand-off after the last update
                print(f"hand-off per device: max {max(moved.values())} B; adapters {adapter_bytes} B, "
                      f"base {base_bytes} B")
                assert 0 < max(moved.values()) <= adapter_bytes < base_bytes
                assert metrics[-1]["memory/update_weights_GiB"] * 2**30 <= adapter_bytes
                whole = jax.tree.leaves(trainer.actor.params)
                for sampler in replicas.samplers.values():  # the adapters of the last update, and the base
                    for a, b in zip(jax.tree.leaves(sampler.engine.state), whole):
                        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        finally:
            trainer.close()
    (batch_a, metrics_a), (batch_b, metrics_b) = out["mesh"], out["replicas"]
    np.testing.assert_array_equal(batch_a.input_ids, batch_b.input_ids)
    skip = ("timing", "perf/", "throughput", "memory/")
    for a, b in zip(metrics_a, metrics_b):
        keys = sorted(k for k in a if not any(s in k for s in skip))
        assert keys == sorted(k for k in b if not any(s in k for s in skip))
        np.testing.assert_allclose([a[k] for k in keys], [b[k] for k in keys], atol=1e-5, err_msg=str(keys))


def test_lora_ppo_critic_reads_the_actors_base_arrays(tmp_path):
    """PPO with LoRA: the critic starts from the actor's base model and reads its very
    arrays (no second copy), trains its own adapters and head, and both keep working."""
    cfg = make_config(tmp_path, "trainer.total_steps=2", "algorithm.adv_estimator=gae", "rollout.n=4",
                      "actor.optim.lr=1e-2", "critic.optim.lr=1e-2", "critic.ppo_mini_batch_size=8",
                      "model.lora.rank=4", "model.lora.alpha=8", "model.hf_config.initializer_range=0.2")
    trainer = RLTrainer(cfg)
    try:
        actor_base = jax.tree_util.tree_leaves_with_path(trainer.actor.base)
        critic_base = jax.tree_util.tree_leaves_with_path(trainer.critic.base)
        assert [jax.tree_util.keystr(k) for k, _ in critic_base] == [
            "['backbone']" + jax.tree_util.keystr(k) for k, _ in actor_base]
        assert all(c is a for (_, c), (_, a) in zip(critic_base, actor_base))  # the same arrays
        critic_adapters = trainer.critic.state.params["backbone"]["layers"]["q_proj_lora_a"].get_value()
        assert critic_adapters is not trainer.actor.state.params["layers"]["q_proj_lora_a"].get_value()
        history = [trainer.step() for _ in range(2)]
        assert all(np.isfinite(h["critic/vf_loss"]) for h in history)
        assert max(h["training/rollout_probs_diff_max"] for h in history) <= 1e-5
        b = trainer.critic.state.params["backbone"]["layers"]["q_proj_lora_b"].get_value()
        assert np.abs(jax.device_get(b)).max() > 0  # the critic's own adapters trained
        assert all(c is a and not a.is_deleted() for (_, c), (_, a) in zip(
            jax.tree_util.tree_leaves_with_path(trainer.critic.base), actor_base))
    finally:
        trainer.close()
