"""Reward failures in an RL run (tiny random model, custom reward functions from files):

- a custom reward of 1e308 (inf in float32) stops the run in its first step's rollout,
  with one line naming the function and the sample, before any update: the weights are
  the initial ones and no checkpoint is written;
- a custom reward that sleeps 30 s under `reward.timeout_s=1` does not hold the run:
  with `reward.on_error=fail` the rollout's scoring stops within the timeout plus a small
  slack, with one line."""

import os
import time

import jax
import numpy as np
import pytest

from rljax.rewards.manager import NonFiniteRewardError, RewardFailureError
from rljax.rl.trainer import RLTrainer
from tests.rl.test_rl_train import make_config

pytestmark = pytest.mark.slow

HUGE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1e308 if len(solution_str) % 2 else 0.5
'''

SLEEPY = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(30)
    return 1.0
'''


def reward_file(tmp_path, name, text):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("where", [["reward.mode=process"], ["reward.mode=inline", "reward.trust_custom_reward=true"]],
                         ids=["worker_processes", "in_process"])
def test_inf_in_float32_reward_stops_the_run_before_any_update(tmp_path, where):
    path = reward_file(tmp_path, "huge", HUGE)
    cfg = make_config(tmp_path, "trainer.total_steps=2", f"reward.custom_reward_function.path={path}",
                      *where, "reward.num_workers=1", "trainer.save_freq=1")
    trainer = RLTrainer(cfg)
    before = [np.asarray(x).copy() for x in jax.tree.leaves(trainer.actor.state.params)]
    with pytest.raises(NonFiniteRewardError) as error:
        trainer.fit()
    message = str(error.value)
    assert "\n" not in message
    assert f"{path}:compute_score returned a reward that is not finite in float32 on sample" in message
    assert "(data_source 'synthetic/arithmetic', uid" in message and "1e+308 (inf in float32)" in message
    after = [np.asarray(x) for x in jax.tree.leaves(trainer.actor.state.params)]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))  # no update
    assert trainer.step_count == 0
    checkpoints = os.path.join(trainer.run.directory, "checkpoints")
    assert not (os.path.isdir(checkpoints) and os.listdir(checkpoints))


def test_sleeping_reward_with_on_error_fail_stops_the_run_within_the_timeout(tmp_path):
    path = reward_file(tmp_path, "sleepy", SLEEPY)
    cfg = make_config(tmp_path, "trainer.total_steps=1", f"reward.custom_reward_function.path={path}",
                      "reward.mode=process", "reward.num_workers=2", "reward.timeout_s=1", "reward.on_error=fail")
    trainer = RLTrainer(cfg)
    scoring = []
    score = trainer.generation.rewards.score

    def timed(batch):
        start = time.monotonic()
        try:
            return score(batch)
        finally:
            scoring.append(time.monotonic() - start)

    trainer.generation.rewards.score = timed
    with pytest.raises(RewardFailureError, match=r"sleepy\.py:compute_score timed out on sample \d+ of 64 .*"
                                                 r"timeout_s=1.*reward\.on_error=fail"):
        trainer.fit()
    assert len(scoring) == 1 and scoring[0] < 1 + 2.0, scoring  # 64 samples x 30 s in 2 workers, stopped at 1 s
