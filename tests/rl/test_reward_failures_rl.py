"""Reward failures in an RL run (tiny random model, custom reward functions from files):

- an agent episode whose tool reward is 1e308 (task reward + tool reward inf in float32)
  fails the rollout naming the sample;

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

import yaml

from rljax.agent.tools.calculator import CalculatorTool
from rljax.data.synthetic_tools import make_rows
from rljax.data.tokenizer import build_char_tokenizer
from rljax.rewards.manager import NonFiniteRewardError, RewardFailureError, RewardManager
from rljax.rewards.sources import Combine, FunctionSource, RewardSources
from rljax.rl.agent_rollout import agent_config, agent_generate_and_score
from rljax.rl.trainer import RLTrainer
from rljax.rollout.params import SamplingParams
from tests.rl.test_agent_rl import IM_END, TOOLS_YAML, ScriptedRolloutSampler, call_text, enc, question_of
from tests.rl.test_rl_train import make_config


class HugeRewardCalculator(CalculatorTool):
    """The calculator, rewarding every episode that uses it with 1e308."""

    def reward(self, state):
        return 1e308


def test_agent_episode_reward_must_be_finite_in_float32(tmp_path):
    tok = build_char_tokenizer()
    rows = make_rows("rl", 2, seed=11)
    prompts = {"raw_prompt": [r["prompt"] for r in rows], "data_source": [r["data_source"] for r in rows],
               "ground_truth": [r["reward_model"]["ground_truth"] for r in rows],
               "extra_info": [r["extra_info"] for r in rows]}

    def script(turn, request):
        expression = question_of(tok, request.prompt_token_ids)
        if turn == 0:
            return enc(tok, call_text(expression) + IM_END)
        a, b = map(int, expression.split("*"))
        return enc(tok, str(a * b) + IM_END)

    tools = yaml.safe_load(open(TOOLS_YAML))
    tools["tools"][0] = {"class": f"{__name__}:HugeRewardCalculator", "schema": tools["tools"][0]["schema"]}
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(tools))
    config = agent_config({"tool_config_path": str(path), "max_turns": 3, "max_tokens_per_turn": 96,
                           "min_turn_tokens": 8})
    with RewardManager(mode="inline") as manager:
        rewards = RewardSources([(FunctionSource(manager), Combine())])
        with pytest.raises(NonFiniteRewardError, match=r"^the episode reward \(task reward \+ tool / environment "
                                                       r"rewards\) gave inf for sample 0 of 4 \(data_source "
                                                       r"'synthetic/tool_arithmetic', uid 0\)"):
            agent_generate_and_score(ScriptedRolloutSampler(tok, script), rewards, tok, prompts,
                                     SamplingParams(n=2, temperature=1.0, max_tokens=128, seed=3), config)


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


@pytest.mark.slow
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


@pytest.mark.slow
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
