"""Calls from rollout-replica threads run on the serving (main) thread: the inline reward
manager's SIGALRM timeout works there, results and errors reach the calling thread."""

import concurrent.futures
import threading

import pytest

from rljax.rewards.manager import RewardManager
from rljax.rewards.pool import can_alarm
from rljax.rl.main_thread import MainThreadCalls, OnMainThread


def test_worker_calls_run_on_the_serving_thread_with_their_results_and_errors():
    calls = MainThreadCalls()
    main = threading.get_ident()

    def where(x):
        return threading.get_ident(), can_alarm(), x * 2

    def fails():
        raise KeyError("bad row")

    def worker(x):
        ident, alarm, y = calls.call(where, x)
        with pytest.raises(KeyError, match="bad row"):
            calls.call(fails)
        return ident, alarm, y, threading.get_ident()

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(worker, x) for x in range(3)]
        calls.serve(futures)
        results = [f.result() for f in futures]
    assert [r[2] for r in results] == [0, 2, 4]
    assert all(ident == main and alarm for ident, alarm, _, _ in results)
    assert all(worker_ident != main for *_, worker_ident in results)
    assert calls.call(where, 5) == (main, True, 10)  # the owner's own call: direct


def test_inline_registry_rewards_score_from_replica_threads():
    manager = RewardManager.from_config({"mode": "inline", "timeout_s": 5})
    items = [{"data_source": "openai/gsm8k", "solution_str": "#### 7", "ground_truth": "7"},
             {"data_source": "openai/gsm8k", "solution_str": "#### 8", "ground_truth": "7"}]
    calls = MainThreadCalls()
    rewards = OnMainThread(manager, calls)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            bare = pool.submit(manager.score, items)
            proxied = pool.submit(rewards.score, items)
            calls.serve([bare, proxied])
        with pytest.raises(RuntimeError, match="SIGALRM"):  # what a replica thread meets unproxied
            bare.result()
        assert list(proxied.result().scores) == [1.0, 0.0]
        assert rewards.inline is manager.inline  # other attributes are the manager's
    finally:
        manager.close()
