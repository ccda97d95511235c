"""A killed RL run resumes from its last checkpoint and ends where an uninterrupted run
ends: PPO with a critic and an adaptive KL-in-reward controller, killed with SIGKILL
(no cleanup, no final save) after step 3 of 4, the last checkpoint being step 2."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
import yaml

from rljax.checkpoint import Checkpointer
from rljax.config import load_config
from rljax.rl.config import RLConfig
from rljax.rl.trainer import RLTrainer

from .test_rl_train import BASE, DIGIT_REWARD

pytestmark = pytest.mark.slow

KILL_AFTER_STEP_3 = textwrap.dedent("""
    import os, signal, sys
    from rljax.config import load_config
    from rljax.rl import trainer
    from rljax.tracking import Tracker
    from rljax.rl.config import RLConfig
    real_log = Tracker.log
    def log(self, step, metrics):
        real_log(self, step, metrics)
        if step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    Tracker.log = log
    trainer.RLTrainer(load_config(RLConfig, sys.argv[1], sys.argv[2:])).fit()
""")


def config_and_overrides(tmp_path, run_root):
    (tmp_path / "digit_reward.py").write_text(DIGIT_REWARD)
    path = tmp_path / "rl.yaml"
    path.write_text(yaml.safe_dump(BASE))
    overrides = [
        f"trainer.default_local_dir={run_root}", "trainer.logger=[jsonl]", "trainer.async_save=false",
        'data.train_files=["synthetic:arithmetic/rl?n=512&seed=0&digits=1"]', "data.train_batch_size=8",
        "data.max_prompt_length=32", "data.bucket_size=16", "rollout.n=4", "rollout.response_length=8",
        "rollout.max_num_seqs=32", "rollout.num_pages=256", "rollout.page_size=8", "actor.ppo_mini_batch_size=4",
        f"reward.custom_reward_function.path={tmp_path / 'digit_reward.py'}", "reward.mode=inline",
        "trainer.total_steps=4", "trainer.save_freq=2", "algorithm.adv_estimator=gae",
        "critic.ppo_mini_batch_size=4", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.05", "actor.optim.lr=1e-2", "critic.optim.lr=1e-2",
    ]
    return str(path), overrides


def test_sigkill_then_resume_ends_where_an_uninterrupted_run_ends(tmp_path, capsys):
    config, overrides = config_and_overrides(tmp_path, tmp_path / "straight")
    straight = RLTrainer(load_config(RLConfig, config, overrides))
    straight.fit()

    config, overrides = config_and_overrides(tmp_path, tmp_path / "killed")
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_STEP_3, config, *overrides],
                            capture_output=True, text=True, env=dict(os.environ), timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    cfg = load_config(RLConfig, config, overrides)
    run_dir = os.path.join(cfg.trainer.default_local_dir, cfg.trainer.experiment_name)
    assert Checkpointer(os.path.join(run_dir, "checkpoints")).latest_step() == 2
    resumed = RLTrainer(cfg)
    history = resumed.fit()
    assert "resumed from" in capsys.readouterr().out
    assert [h["step"] for h in history] == [3, 4]

    for a, b in ((straight.actor.state, resumed.actor.state), (straight.critic.state, resumed.critic.state)):
        for x, y in zip(jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert straight.kl_ctrl.value == resumed.kl_ctrl.value != 0.05  # the adaptive coefficient moved, and resumed
    assert straight.train_data.get_state() == resumed.train_data.get_state()

    # trainer.resume_mode=<path>: a new run directory starting from another run's step-2
    # checkpoint continues that run (it does not start from scratch)
    straight_dir = os.path.join(tmp_path / "straight", cfg.trainer.experiment_name)
    config, overrides = config_and_overrides(tmp_path, tmp_path / "forked")
    forked = RLTrainer(load_config(RLConfig, config,
                                   overrides + [f"trainer.resume_mode={straight_dir}/checkpoints/2"]))
    assert [h["step"] for h in forked.fit()] == [3, 4]
    for x, y in zip(jax.tree.leaves(jax.device_get(straight.actor.state)),
                    jax.tree.leaves(jax.device_get(forked.actor.state))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
