"""A reward function's failures in both places reward functions run (worker processes,
and in-process for trusted code under `reward.mode: inline`):

- a reward that is not finite in float32 (1e308, nan, -inf) fails the batch with one line
  naming the function (file:name) and the sample (index, data_source, uid), whatever
  `on_error` says;
- a call that sleeps 30 s under a 1 s timeout is stopped within the timeout plus a small
  slack; `on_error: zero` scores it 0 and logs one line, `on_error: fail` raises one line
  at once, and the manager keeps working either way."""

import logging
import math
import os
import re
import time

import pytest

from rljax.rewards import FileRewardFn, RewardManager
from rljax.rewards.manager import NonFiniteRewardError, RewardFailureError
from rljax.rewards.result import NonFiniteScore, read_score

FNS = os.path.join(os.path.dirname(__file__), "reward_fns.py")
TIMEOUT = 1.0
SLACK = 2.0  # what "within the timeout plus a small slack" allows on a loaded 2-core machine
MODES = ["process", "inline"]  # worker processes | this process (a trusted function, SIGALRM)


def item(solution, truth="a", ds="test", uid=None):
    out = {"data_source": ds, "solution_str": solution, "ground_truth": truth, "extra_info": {}}
    if uid is not None:
        out["uid"] = uid
    return out


def make_manager(mode: str, on_error: str = "zero") -> RewardManager:
    if mode == "process":
        return RewardManager(FileRewardFn(FNS), mode="process", num_workers=2, timeout_s=TIMEOUT, on_error=on_error)
    return RewardManager(FileRewardFn(FNS), mode="inline", trust_custom_reward=True, timeout_s=TIMEOUT,
                         on_error=on_error)


@pytest.fixture(scope="module", params=MODES)
def manager(request):
    m = make_manager(request.param)
    yield m
    m.close()


def test_float32_range_is_the_bound():
    # float32's largest finite value is (2 - 2**-23) * 2**127 = 3.4028234663852886e38
    assert read_score(3.4e38)[0] == 3.4e38 and read_score(-3.4e38)[0] == -3.4e38
    for bad in (3.5e38, 1e308, -1e308, math.inf, -math.inf, math.nan):
        with pytest.raises(NonFiniteScore):
            read_score(bad)
    with pytest.raises(NonFiniteScore, match=r"1e\+308 \(inf in float32\)"):
        read_score({"score": 1e308})


@pytest.mark.parametrize("solution, shown", [("1e308", r"1e\+308 \(inf in float32\)"), ("nan", "nan"),
                                             ("-inf", "-inf")])
def test_nonfinite_reward_fails_naming_the_function_and_the_sample(manager, solution, shown):
    batch = [item("a", uid=4), item(solution, ds="my/source", uid=5), item("a", uid=6)]
    with pytest.raises(NonFiniteRewardError) as error:
        manager(batch)  # on_error is zero: a non-finite reward is still never scored
    message = str(error.value)
    assert "\n" not in message
    assert f"{FNS}:compute_score returned a reward that is not finite in float32" in message
    assert "on sample 1 of 3 (data_source 'my/source', uid 5)" in message
    assert re.search(f"non-finite reward {shown}", message), message
    assert manager([item("a"), item("b")]).scores.tolist() == [1.0, 0.0]  # and the manager goes on


@pytest.mark.parametrize("mode", MODES)
def test_sleeping_reward_is_stopped_within_the_timeout_and_scored_zero(mode, caplog):
    with make_manager(mode) as m, caplog.at_level(logging.WARNING, "rljax.rewards"):
        start = time.monotonic()
        result = m([item("a"), item("sleep:30", uid=3), item("b")])
        elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT + SLACK, elapsed
    assert result.scores.tolist() == [1.0, 0.0, 0.0]
    assert result.metrics["reward/timeouts"] == 1 and result.metrics["reward/errors"] == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "rljax.rewards"]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert f"{FNS}:compute_score timed out on sample 1 of 3 (data_source 'test', uid 3)" in lines[0]
    assert "timeout_s=1" in lines[0] and "scored 0 (reward.on_error=zero)" in lines[0]


@pytest.mark.parametrize("mode", MODES)
def test_on_error_fail_stops_at_the_first_timeout(mode):
    with make_manager(mode, on_error="fail") as m:
        start = time.monotonic()
        with pytest.raises(RewardFailureError) as error:
            m([item("sleep:30", uid=k) for k in range(8)])  # would take 4 x 30 s in two workers
        elapsed = time.monotonic() - start
        assert elapsed < TIMEOUT + SLACK, elapsed
        message = str(error.value)
        assert "\n" not in message and f"{FNS}:compute_score timed out on sample" in message
        assert "reward.on_error=fail" in message
        assert m([item("a"), item("b")]).scores.tolist() == [1.0, 0.0]  # the manager keeps working


@pytest.mark.parametrize("mode", MODES)
def test_on_error_fail_stops_at_an_exception(mode):
    with make_manager(mode, on_error="fail") as m:
        with pytest.raises(RewardFailureError, match=r"compute_score failed on sample 1 of 2 \(data_source 'test', "
                                                     r"uid 9\): RuntimeError: boom"):
            m([item("a"), item("raise", uid=9)])


def test_on_error_is_checked():
    with pytest.raises(ValueError, match="on_error"):
        RewardManager(mode="inline", on_error="ignore")
    with RewardManager.from_config({"mode": "inline", "on_error": "fail"}) as m:
        assert m.on_error == "fail"
