"""Calls made from worker threads, run on the thread that serves them.

Rollout replicas sample in threads (`rljax.rl.replica_rollout`), but some of what a rollout calls
must run on the main thread: the inline reward manager enforces `reward.timeout_s` with
SIGALRM, which Python delivers to the main thread only. The rollout's threads hand those
calls to `MainThreadCalls`; the main thread, waiting for the rollout, runs them in arrival
order while the other replicas go on sampling.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import Any, Callable, Iterable


class MainThreadCalls:
    """Owned by the thread that creates it. `call(fn, ...)` from the owner calls `fn`;
    from any other thread it queues `fn` for the owner and returns its result (or raises
    its error). The owner runs queued calls in `serve(futures)`, until every future is
    done: a worker may only `call` while its work is among the futures being served."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._owner = threading.get_ident()
        self.deadline: float | None = None  # while serving with a timeout: when it ends (time.monotonic)

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        if threading.get_ident() == self._owner:
            return fn(*args, **kwargs)
        result: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((result, fn, args, kwargs))
        return result.result()

    @property
    def on_owner(self) -> bool:
        """The calling thread is the owner (the one that serves)."""
        return threading.get_ident() == self._owner

    def serve(self, futures: Iterable[concurrent.futures.Future], poll_s: float = 0.01,
              timeout_s: float | None = None) -> None:
        """Run queued calls until every future is done; `TimeoutError` after `timeout_s`
        seconds (None: no limit)."""
        if threading.get_ident() != self._owner:
            raise RuntimeError("MainThreadCalls.serve: only the thread that created it serves its calls")
        deadline = self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self._serve(set(futures), poll_s, deadline, timeout_s)
        finally:
            self.deadline = None

    def _serve(self, pending: set, poll_s: float, deadline: float | None, timeout_s: float | None) -> None:
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} task(s) not done after {timeout_s:g} s")
            try:
                result, fn, args, kwargs = self._queue.get(timeout=poll_s)
            except queue.Empty:
                pending = {f for f in pending if not f.done()}
                continue
            try:
                result.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - the caller's thread raises it
                result.set_exception(e)


class OnMainThread:
    """`target`, whose `score(...)` runs through `calls` (the reward manager's interface);
    every other attribute is `target`'s own."""

    def __init__(self, target: Any, calls: MainThreadCalls):
        self._target, self._calls = target, calls

    def score(self, *args, **kwargs):
        return self._calls.call(self._target.score, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)
