"""Containment: errors, timeouts and dead workers are scored 0 and counted; the manager
keeps working. A hung call is interrupted in its worker; one the alarm cannot stop costs
its worker process. Process-pool tests share one module-scoped manager to keep them fast."""

import os
import signal
import time

import numpy as np
import pytest

from rljax.rewards import FileRewardFn, RewardManager, ScoringPool, UnknownDataSourceError

FNS = os.path.join(os.path.dirname(__file__), "reward_fns.py")
TIMEOUT = 1.0


def item(solution, truth="a", ds="test"):
    return {"data_source": ds, "solution_str": solution, "ground_truth": truth, "extra_info": {"i": 0}}


@pytest.fixture(scope="module")
def manager():
    m = RewardManager(FileRewardFn(FNS), num_workers=2, timeout_s=TIMEOUT)
    yield m
    m.close()


def test_good_batch(manager):
    result = manager([item("a"), item("b"), item("a")])
    assert result.scores.dtype == np.float32
    assert result.scores.tolist() == [1.0, 0.0, 1.0]
    assert result.extras["acc"] == [1.0, 0.0, 1.0]
    assert result.metrics["reward/errors"] == 0 and result.metrics["reward/timeouts"] == 0
    assert result.metrics["reward/acc/mean"] == pytest.approx(2 / 3)
    assert len(set(result.extras["pid"])) >= 1 and os.getpid() not in result.extras["pid"]


def test_exceptions_and_bad_returns_are_contained(manager):
    result = manager([item("raise"), item("a"), item("nodict")])
    assert result.scores.tolist() == [0.0, 1.0, 0.0]
    assert result.metrics["reward/errors"] == 2
    assert "RuntimeError: boom" in result.errors[0]
    assert "'score'" in result.errors[2]
    assert result.extras["acc"] == [None, 1.0, None]


def test_hang_is_a_timeout_interrupted_in_the_worker(manager):
    restarts = manager.pool_restarts
    batch = [item("a"), item("hang"), item("sleep:0.2"), item("b"), item("a")]
    result = manager(batch)
    assert result.scores.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert result.metrics["reward/timeouts"] == 1 and result.metrics["reward/errors"] == 0
    assert 1 in result.errors and "timeout" in result.errors[1] and "interrupted in the worker" in result.errors[1]
    assert manager.pool_restarts == restarts  # the worker survives its interrupted call
    after = manager([item("a")] * 6)
    assert after.scores.tolist() == [1.0] * 6 and not after.errors


@pytest.mark.slow
def test_call_the_alarm_cannot_stop_costs_its_worker_and_manager_keeps_working(manager):
    restarts = manager.pool_restarts
    result = manager([item("a"), item("unstoppable"), item("b"), item("a")])
    assert result.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert result.metrics["reward/timeouts"] == 1 and "worker process was killed" in result.errors[1]
    assert manager.pool_restarts == restarts + 1
    after = manager([item("a")] * 6)  # the fresh pool scores normally
    assert after.scores.tolist() == [1.0] * 6 and not after.errors


def test_dead_worker_blames_only_the_killer(manager):
    result = manager([item("a"), item("die"), item("a"), item("b")])
    assert result.scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert result.metrics["reward/errors"] == 1 and "died" in result.errors[1]
    assert manager([item("a")]).scores.tolist() == [1.0]


def test_worker_killed_between_batches(manager):
    pids = set(manager([item("a")] * 4).extras["pid"])
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    result = manager([item("a"), item("b"), item("a")])
    assert result.scores.tolist() == [1.0, 0.0, 1.0] and not result.errors


def test_empty_batch(manager):
    result = manager([])
    assert result.scores.shape == (0,) and result.metrics["reward/errors"] == 0


def test_inline_mode_builtins_and_kwargs():
    with RewardManager(mode="inline") as m:
        batch = [
            item("#### 42", "42", "openai/gsm8k"),
            item(r"\boxed{\frac12}", "0.5", "lighteval/MATH"),
            item("cba", "cba", "synthetic/reverse"),
            item("<answer>1+2</answer>", {"target": 3, "numbers": [1, 2]}, "countdown"),
            item("<answer>1+2</answer>", "not a dict", "countdown"),  # raises inside: contained
        ]
        result = m(batch)
        assert result.scores.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0]
        assert result.metrics["reward/errors"] == 1
        assert result.extras["pred"][:3] == ["42", "1/2", "cba"]
    with RewardManager(FileRewardFn(FNS), mode="inline", reward_kwargs={"bonus": 0.5}) as m:
        assert m([item("a")]).scores.tolist() == [1.5]


def test_unknown_data_source_fails_loudly():
    with RewardManager(mode="inline") as m:
        with pytest.raises(UnknownDataSourceError, match="no/such"):
            m([item("x", ds="no/such")])


def test_missing_keys_and_bad_config():
    with RewardManager(mode="inline") as m:
        with pytest.raises(ValueError, match="lacks"):
            m([{"data_source": "synthetic/reverse", "solution_str": "x"}])
    with pytest.raises(ValueError, match="mode"):
        RewardManager(mode="threads")
    with pytest.raises(ValueError, match="unknown key"):
        RewardManager.from_config({"timeout": 3})


def test_unpicklable_function_is_refused_for_processes():
    with pytest.raises(TypeError, match="pickled"):
        ScoringPool(lambda **kw: 1.0, num_workers=1)


def test_closed_manager_refuses():
    m = RewardManager(FileRewardFn(FNS), num_workers=1, timeout_s=5)
    m.close()
    with pytest.raises(RuntimeError, match="closed"):
        m([item("a")])


def test_worker_that_cannot_load_the_function_fails_at_startup(tmp_path):
    with pytest.raises(RuntimeError, match="failed to start"):
        ScoringPool(FileRewardFn(str(tmp_path / "gone.py")), num_workers=1, startup_timeout_s=30)
