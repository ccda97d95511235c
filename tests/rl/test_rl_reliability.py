"""How an RL run fails: updates that keep being skipped as non-finite stop the run (the
last checkpoint stays good, the resumed run's metrics hold each step once), and the
sampler never receives non-finite weights."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos.aggregation import AggTerms
from rljax.checkpoint import Checkpointer
from rljax.rl import trainer as rl_trainer
from rljax.rl.trainer import RLTrainer

from .test_rl_train import make_config

pytestmark = pytest.mark.slow

SMALL = ["algorithm.adv_estimator=grpo", "rollout.n=4", "actor.ppo_mini_batch_size=8"]


def steps_logged(run_dir) -> list[int]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [m["step"] for m in map(json.loads, f) if "event" not in m]  # events (a config change) aside


def test_skipped_updates_stop_the_run_and_resume_logs_each_step_once(tmp_path, monkeypatch):
    cfg = make_config(tmp_path, *SMALL, "trainer.total_steps=2", "trainer.save_freq=1")
    RLTrainer(cfg).fit()
    run_dir = os.path.join(str(tmp_path), cfg.trainer.experiment_name)
    ckpt = os.path.join(run_dir, "checkpoints")
    shutil.rmtree(os.path.join(ckpt, "2"))  # killed after logging step 2, before its save
    assert steps_logged(run_dir) == [1, 2]

    real = rl_trainer.actor_objective

    def nan_actor_objective(*args, **kwargs):
        objective, totals = real(*args, **kwargs)

        def nan_objective(model, batch, frozen, totals_, key):
            terms, metrics = objective(model, batch, frozen, totals_, key)
            return AggTerms(terms.numerator * jnp.nan, terms.denominator), metrics

        return nan_objective, totals

    monkeypatch.setattr(rl_trainer, "actor_objective", nan_actor_objective)
    cfg = make_config(tmp_path, *SMALL, "trainer.total_steps=6", "trainer.save_freq=1",
                      "trainer.max_consecutive_skipped_steps=2")
    with pytest.raises(RuntimeError) as info:
        RLTrainer(cfg).fit()  # resumes from 1; steps 2 and 3 skipped: stops at 3
    message = str(info.value)
    assert "\n" not in message and "2 consecutive" in message and "actor.optim.lr" in message, message
    assert f"{ckpt}/1" in message
    assert Checkpointer(ckpt, async_save=False).all_steps() == [1]  # skipped step 2 is never checkpointed
    assert steps_logged(run_dir) == [1, 2]  # step 2 once (the resumed run's); step 3 stopped the run


def test_sampler_never_receives_non_finite_weights(tmp_path):
    """A learning rate that overflows float32: the first update is accepted (finite loss
    and gradient) and leaves inf/NaN parameters; the run stops before the sampler gets them."""
    cfg = make_config(tmp_path, *SMALL, "trainer.total_steps=3", "actor.optim.lr=1e39")
    trainer = RLTrainer(cfg)
    received = []
    update = trainer.generation.sampler.update_params

    def spy(params):
        received.append(all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(jax.device_get(params))))
        return update(params)

    trainer.generation.sampler.update_params = spy
    with pytest.raises(RuntimeError) as info:
        trainer.fit()
    message = str(info.value)
    assert "\n" not in message and "not finite" in message and "actor.optim.lr" in message, message
    assert all(received), received
