"""Containment under `reward.mode: inline` (the quickstart's): a custom reward function runs
in worker processes unless trusted, so a hang is a timeout and `os._exit` a counted
failure; trusted inline code honours `timeout_s` on the main thread; a reward that fails on
every sample for `max_consecutive_failed_steps` batches in a row stops the run."""

import os
import textwrap
import threading
import time

import pytest

from rljax.rewards import RewardManager, register_reward
from rljax.rewards.manager import RewardFailureError
from rljax.rewards.registry import REWARDS

TIMEOUT = 1.0

MISBEHAVING = """
import os, sys, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str.startswith("sleep:"):
        time.sleep(float(solution_str.split(":")[1]))
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "sys.exit":
        sys.exit(4)
    if solution_str == "raise":
        raise RuntimeError("boom")
    return {"score": float(solution_str == ground_truth), "pid": os.getpid()}
"""


def item(solution, truth="a", ds="test"):
    return {"data_source": ds, "solution_str": solution, "ground_truth": truth}


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "misbehaving.py"
    path.write_text(textwrap.dedent(MISBEHAVING))
    return str(path)


@pytest.fixture(scope="module")
def inline_custom(reward_file):
    """What the quickstart's `reward.mode: inline` builds for a custom function."""
    m = RewardManager.from_config({"mode": "inline", "timeout_s": TIMEOUT, "num_workers": 1},
                                  {"path": reward_file})
    yield m
    m.close()


def test_custom_function_is_contained_under_inline_mode(inline_custom):
    result = inline_custom([item("a"), item("b")])
    assert result.scores.tolist() == [1.0, 0.0]
    assert os.getpid() not in result.extras["pid"]


def test_sleeping_custom_reward_returns_within_timeout(inline_custom):
    start = time.monotonic()
    result = inline_custom([item("sleep:30"), item("a")])
    assert time.monotonic() - start < 10 * TIMEOUT
    assert result.scores.tolist() == [0.0, 1.0]
    assert result.metrics["reward/timeouts"] == 1 and "timeout" in result.errors[0]


def test_os_exit_is_a_counted_failure(inline_custom):
    result = inline_custom([item("a"), item("exit"), item("a")])
    assert result.scores.tolist() == [1.0, 0.0, 1.0]
    assert result.metrics["reward/errors"] == 1 and "died" in result.errors[1]
    assert inline_custom([item("a")]).scores.tolist() == [1.0]  # and the manager goes on


def test_trusted_inline_custom_honours_the_timeout(reward_file):
    with RewardManager.from_config({"mode": "inline", "timeout_s": TIMEOUT, "trust_custom_reward": True},
                                   {"path": reward_file}) as m:
        result = m([item("a")])
        assert result.extras["pid"] == [os.getpid()]  # really inline
        start = time.monotonic()
        result = m([item("sleep:30"), item("a")])
        assert time.monotonic() - start < 3 * TIMEOUT
        assert result.scores.tolist() == [0.0, 1.0]
        assert result.metrics["reward/timeouts"] == 1
        assert "timeout_s=1" in result.errors[0]
        # sys.exit inside a reward is a failure, not the end of the trainer
        result = m([item("sys.exit")])
        assert result.metrics["reward/errors"] == 1 and "SystemExit" in result.errors[0]


@pytest.fixture
def sleepy_builtin():
    @register_reward("test/sleepy_builtin")
    def sleepy(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(float(solution_str))
        return 1.0

    yield
    REWARDS.unregister("test/sleepy_builtin")


def test_inline_builtin_honours_the_timeout(sleepy_builtin):
    with RewardManager(mode="inline", timeout_s=TIMEOUT) as m:
        start = time.monotonic()
        result = m([item("30", ds="test/sleepy_builtin"), item("0", ds="test/sleepy_builtin")])
        assert time.monotonic() - start < 3 * TIMEOUT
        assert result.scores.tolist() == [0.0, 1.0] and result.metrics["reward/timeouts"] == 1
        # off the main thread no alarm can interrupt it: a timeout it cannot honour is refused
        out = {}

        def score_in_thread():
            try:
                m([item("0", ds="test/sleepy_builtin")])
            except RuntimeError as e:
                out["error"] = str(e)

        t = threading.Thread(target=score_in_thread)
        t.start()
        t.join(60)
        assert "main thread" in out["error"] and "reward.mode=process" in out["error"]


def test_always_failing_reward_stops_the_run(reward_file):
    with RewardManager.from_config({"mode": "inline", "timeout_s": TIMEOUT, "trust_custom_reward": True,
                                    "max_consecutive_failed_steps": 3}, {"path": reward_file}) as m:
        assert m([item("raise")] * 2).metrics["reward/errors"] == 2
        assert m([item("raise"), item("a")]).scores.tolist() == [0.0, 1.0]  # one success: the count restarts
        m([item("raise")] * 2)
        m([item("raise")] * 2)
        with pytest.raises(RewardFailureError, match=r"misbehaving\.py:compute_score.* 3 consecutive batches.*"
                                                     r"RuntimeError: boom.*reward\.max_consecutive_failed_steps"):
            m([item("raise")] * 2)


def test_failure_limit_zero_disables_it(reward_file):
    with RewardManager.from_config({"mode": "inline", "trust_custom_reward": True,
                                    "max_consecutive_failed_steps": 0}, {"path": reward_file}) as m:
        for _ in range(5):
            assert m([item("raise")]).metrics["reward/errors"] == 1


def test_trust_requires_inline_mode(reward_file):
    with pytest.raises(ValueError, match="trust_custom_reward"):
        RewardManager.from_config({"mode": "process", "trust_custom_reward": True}, {"path": reward_file})


KILLED_TRAINER = """
import os, signal, sys
from rljax.rewards import RewardManager
m = RewardManager.from_config({"mode": "inline", "num_workers": 2}, {"path": sys.argv[1]})
print(m([{"data_source": "d", "solution_str": "a", "ground_truth": "a"}]).scores.tolist(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_workers_die_with_a_killed_trainer(reward_file):
    """A trainer killed by SIGKILL (preemption) leaves no reward workers holding its stdout:
    whoever waits for its output (a launcher, `subprocess.run`) sees it end."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", KILLED_TRAINER, reward_file], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -9 and proc.stdout.strip() == "[1.0]", proc.stderr[-2000:]
