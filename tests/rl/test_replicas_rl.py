"""Rollout replicas in the RL loop: the number of replicas changes no token, no log-prob
and no reward (per-request sampling keys, contiguous group assignment, results gathered in
prompt order), and a GRPO step runs on replicas with weights handed off in device memory."""

import dataclasses

import jax
import numpy as np
import pytest

from rljax.data import make_dataset
from rljax.parallel import make_mesh
from rljax.rl.generation import Generation, rollout_layout
from rljax.train.setup import build_decoder, load_tokenizer

from tests.rl.test_rl_train import make_config, capture_batches


def _replica_config(cfg, replicas: int, tp: int = 1):
    return dataclasses.replace(cfg, rollout=dataclasses.replace(
        cfg.rollout, tensor_parallel_size=tp, data_parallel_size=replicas))


@pytest.mark.slow
def test_one_two_four_eight_replicas_sample_the_same_tokens(tmp_path):
    cfg = make_config(tmp_path, "rollout.temperature=1.0", "rollout.num_pages=64", "rollout.n=2")
    mesh = make_mesh(cfg.mesh)
    tokenizer = load_tokenizer(cfg.model)
    decoder = build_decoder(cfg.model, tokenizer, mesh=mesh)
    from rljax.data.synthetic_spec import materialize
    data = dataclasses.replace(cfg.data, format="rl",
                               train_files=materialize(cfg.data.train_files, str(tmp_path / "data"), "train"))
    prompts = next(make_dataset(data, tokenizer, "train", process_index=0, process_count=1))
    params = cfg.sampling_params(step=3)
    results = {}
    for replicas in (1, 2, 4, 8):
        generation = Generation(_replica_config(cfg, replicas), decoder, tokenizer)
        try:
            assert generation.replicas.layout.num_replicas == replicas
            rollout = generation.rollout(prompts, params, offset=5)
        finally:
            generation.close()
        results[replicas] = rollout
    reference = results[1]
    assert len(reference.samples) == cfg.data.batch_size * cfg.rollout.n
    assert [s.group_id for s in reference.samples] == [5 + i // cfg.rollout.n for i in range(len(reference.samples))]
    assert len({tuple(s.response_ids) for s in reference.samples}) > len(reference.samples) // 2  # really sampled
    assert len({tuple(s.response_ids) for s in reference.samples[:2]}) == 2  # a prompt's two samples differ
    for replicas, rollout in results.items():
        assert [s.group_id for s in rollout.samples] == [s.group_id for s in reference.samples]
        assert [s.response_ids for s in rollout.samples] == [s.response_ids for s in reference.samples], replicas
        # the same tokens; log-probs to float rounding (the batch shapes differ with the replica count)
        np.testing.assert_allclose(np.concatenate([s.response_log_probs for s in rollout.samples]),
                                   np.concatenate([s.response_log_probs for s in reference.samples]), atol=1e-5)
        assert [s.score for s in rollout.samples] == [s.score for s in reference.samples]


def test_layout_errors_name_the_keys(tmp_path):
    from rljax.config import ConfigError, validate

    cfg = make_config(tmp_path)
    with pytest.raises(ConfigError, match=r"^rollout.tensor_parallel_size=3 x rollout.data_parallel_size=auto"):
        validate(_replica_config(cfg, 0, tp=3), 8)
    with pytest.raises(ConfigError, match=r"^rollout.tensor_parallel_size=2 x rollout.data_parallel_size=8"):
        validate(_replica_config(cfg, 8, tp=2), 8)
    validate(_replica_config(cfg, 2, tp=2), 8)  # 2 replicas on 4 of the 8 devices: one process may
    assert rollout_layout(_replica_config(cfg, 2, tp=2)).num_replicas == 2


@pytest.mark.slow
def test_grpo_step_on_replicas_equals_the_training_mesh_sampler(tmp_path):
    """Same config, sampler on the training mesh vs 4 replicas of 2 devices: the same
    tokens, rewards and losses (fp32, tiny model), and the replicas get the new weights."""
    out = {}
    for name, extra in (("mesh", []), ("replicas", ["rollout.tensor_parallel_size=2"])):
        from rljax.rl.trainer import RLTrainer

        (tmp_path / name).mkdir()
        cfg = make_config(tmp_path / name, "trainer.total_steps=2", "algorithm.adv_estimator=grpo",
                          "model.hf_config.num_key_value_heads=2", *extra)  # kv heads split over tp=2
        trainer = RLTrainer(cfg)
        try:
            captured = capture_batches(trainer)
            metrics = [trainer.step(), trainer.step()]
            out[name] = (captured["batch"], metrics)
            if name == "replicas":
                assert trainer.generation.replicas.layout.num_replicas == 4
                params = jax.tree.leaves(trainer.actor.state.params)
                for sampler in trainer.generation.replicas.samplers.values():  # the weights of the last update
                    for a, b in zip(jax.tree.leaves(sampler.engine.state), params):
                        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        finally:
            trainer.close()
    (batch_a, metrics_a), (batch_b, metrics_b) = out["mesh"], out["replicas"]
    np.testing.assert_array_equal(batch_a.input_ids, batch_b.input_ids)
    np.testing.assert_allclose(batch_a.token_level_scores, batch_b.token_level_scores)
    np.testing.assert_allclose(batch_a.rollout_log_probs, batch_b.rollout_log_probs, atol=1e-5)
    for a, b in zip(metrics_a, metrics_b):
        np.testing.assert_allclose(a["actor/pg_loss"], b["actor/pg_loss"], atol=1e-5)
        assert "memory/update_weights_GiB" in b and "memory/update_weights_GiB" not in a
