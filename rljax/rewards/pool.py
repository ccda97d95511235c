"""Run a reward function on many items in worker processes, with a per-item timeout.

A Python thread that hangs cannot be killed, a process can. `ScoringPool` scores items in
a `concurrent.futures.ProcessPoolExecutor` (``forkserver`` context where available, else
``spawn``: never ``fork``, which would copy the parent's JAX threads):

* the reward function is pickled once and loaded by each worker's initializer;
* at most `num_workers` items are in flight, so every submitted item runs at once and its
  clock (started at submission) measures its own run time;
* the timeout is enforced in the worker: a call still running after `timeout_s` is
  interrupted there by ``SIGALRM`` (as `score_item_inline` does in-process) and returned
  as a *timeout*; the worker goes on with the next item;
* a call the alarm cannot stop (C code holding the GIL, a function that catches
  ``BaseException`` around its own hang) is still running `KILL_GRACE_S` later: the
  pool's processes are terminated (killed if they ignore SIGTERM), a fresh pool is
  started, the item is a *timeout* and the other items that were in flight are resubmitted;
* an exception in the reward function is caught in the worker and returned as an *error*;
  a score that is not finite in float32 (nan, inf, 1e308) is *nonfinite*;
* a worker that dies (``os._exit``, segfault, OOM kill) breaks the pool: its in-flight
  items are rerun one at a time in a fresh pool, so only the item that kills a worker on
  its own is an error.

`ScoringPool.map` reports each outcome as it arrives to an optional callback; when the
callback raises (the caller stops at a failure), the items still in flight are abandoned
with their pool (a fresh one starts at the next `map`) and the error propagates, at once.

`score_item_inline` is the in-process counterpart (``RewardManager(mode="inline")`` for
trusted functions): the same containment of exceptions (``sys.exit`` included), and
`timeout_s` enforced with ``SIGALRM`` on the main thread. What it cannot stop: a call that
holds the GIL in C code past the deadline (it is interrupted when it returns to Python),
``os._exit``, or a function that catches ``BaseException`` around its own hang.

A (re)started pool initialises all its workers (imports the reward function's module)
before it takes items, so import time never counts toward an item's timeout. Workers exit
when the process that owns the pool dies (even by SIGKILL: they watch a pipe whose only
writer is the owner), so a killed trainer leaves no orphans holding its stdout.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import pickle
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

from rljax.rewards.result import NonFiniteScore, read_score

Status = Literal["ok", "error", "timeout", "nonfinite"]
MAX_MESSAGE_CHARS = 1000
KILL_GRACE_S = 1.0  # after timeout_s, how long the parent waits for the worker's own alarm before killing it


@dataclass(frozen=True)
class Outcome:
    """One item's result: its score and extra fields, or why it has none."""

    status: Status
    score: float = 0.0
    extras: dict[str, Any] | None = None
    message: str | None = None


def score_item(fn: Callable[..., Any], item: Mapping[str, Any]) -> Outcome:
    """Call `fn` with verl's keyword arguments; exceptions (and ``sys.exit``) become an
    error `Outcome`, a score not finite in float32 a nonfinite one."""
    try:
        result = fn(
            data_source=item["data_source"],
            solution_str=item["solution_str"],
            ground_truth=item["ground_truth"],
            extra_info=item.get("extra_info"),
        )
        score, extras = read_score(result)
        return Outcome("ok", score, extras)
    except NonFiniteScore as e:
        return Outcome("nonfinite", message=str(e)[:MAX_MESSAGE_CHARS])
    except (Exception, SystemExit) as e:  # noqa: BLE001 — containment is the point
        return Outcome("error", message=f"{type(e).__name__}: {e}"[:MAX_MESSAGE_CHARS])


class _InlineTimeout(BaseException):
    """Raised into a reward function by the alarm; not an `Exception`, so that the
    function's own ``except Exception`` does not swallow it."""


ALARM_REPEAT_S = 0.05  # the alarm repeats until the call is out: one swallowed raise is not enough


def can_alarm() -> bool:
    """Whether `score_item_inline` can enforce a timeout here (POSIX, main thread)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def score_item_inline(fn: Callable[..., Any], item: Mapping[str, Any], timeout_s: float,
                      where: str = "in-process") -> Outcome:
    """`score_item` in this process, interrupted after `timeout_s` seconds (a *timeout*
    `Outcome`, its message saying `where`) by ``SIGALRM``; only on the main thread
    (`can_alarm`). The previous ``SIGALRM`` handler and interval timer are restored
    afterwards."""
    if not can_alarm():
        raise RuntimeError("a reward timeout is enforced in-process with SIGALRM, which needs the main thread "
                           "of a POSIX process")
    armed = True

    def on_alarm(signum, frame):
        if armed:
            raise _InlineTimeout

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s, ALARM_REPEAT_S)
    start = time.monotonic()
    try:
        try:
            return score_item(fn, item)
        finally:
            armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _InlineTimeout:
        return Outcome("timeout", message=f"no result within timeout_s={timeout_s:g} (interrupted {where})")
    finally:
        signal.signal(signal.SIGALRM, previous_handler if previous_handler is not None else signal.SIG_DFL)
        if previous_delay > 0:
            left = max(previous_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)


# ---- worker side -----------------------------------------------------------------------

_WORKER_FN: Callable[..., Any] | None = None
_BARRIER: Any = None
_TIMEOUT_S: float | None = None


def _exit_with_owner(alive: Any) -> None:
    """Block until the pool's owner is gone (EOF on `alive`: its only writer died or
    closed it), then end this worker at once."""
    try:
        alive.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(0)


def _init_worker(fn_bytes: bytes, barrier: Any, alive: Any, timeout_s: float) -> None:
    global _WORKER_FN, _BARRIER, _TIMEOUT_S
    threading.Thread(target=_exit_with_owner, args=(alive,), daemon=True, name="reward-owner-watch").start()
    _WORKER_FN = pickle.loads(fn_bytes)
    _BARRIER = barrier
    _TIMEOUT_S = timeout_s
    load = getattr(_WORKER_FN, "load", None)  # e.g. FileRewardFn: import its file now
    if callable(load):
        load()


def _run(item: Mapping[str, Any]) -> Outcome:
    assert _WORKER_FN is not None and _TIMEOUT_S is not None, "reward worker was not initialised"
    if can_alarm():  # tasks run on the worker's main thread
        return score_item_inline(_WORKER_FN, item, _TIMEOUT_S, where="in the worker")
    return score_item(_WORKER_FN, item)


def _warm(timeout_s: float) -> int:
    """Wait until every worker of the pool runs one of these: the pool then holds
    `num_workers` initialised processes (they are spawned on demand, one per task that
    finds no idle worker)."""
    assert _WORKER_FN is not None and _BARRIER is not None
    _BARRIER.wait(timeout_s)
    return os.getpid()


# ---- parent side -----------------------------------------------------------------------


def default_context() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


class ScoringPool:
    """Worker processes that score items with one reward function (see module docstring)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        num_workers: int = 2,
        timeout_s: float = 10.0,
        mp_context: str | None = None,
        startup_timeout_s: float = 120.0,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        try:
            self._fn_bytes = pickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"the reward function {fn!r} cannot be pickled to worker processes ({type(e).__name__}: {e}); "
                "use a module-level function, a FileRewardFn (custom_reward_function.path), "
                "or RewardManager(mode='inline', trust_custom_reward=True)"
            ) from e
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.context_name = mp_context or default_context()
        if self.context_name == "fork":
            raise ValueError("mp_context='fork' is unsafe with JAX's threads; use 'forkserver' or 'spawn'")
        self._context = multiprocessing.get_context(self.context_name)
        self.startup_timeout_s = startup_timeout_s
        # workers hold the reading end; only this process writes (never): its death is their EOF
        self._alive_r, self._alive_w = self._context.Pipe(duplex=False)
        self._executor: ProcessPoolExecutor | None = None
        self.restarts = 0  # pools replaced after a timeout, a dead worker or an abandoned map
        self._closed = False
        self._start()

    # -- pool lifecycle --

    def _start(self) -> None:
        self._executor = ProcessPoolExecutor(
            max_workers=self.num_workers,
            mp_context=self._context,
            initializer=_init_worker,
            initargs=(self._fn_bytes, self._context.Barrier(self.num_workers), self._alive_r, self.timeout_s),
        )
        try:
            # Start and initialise every worker now, so that no item's clock runs while
            # a worker is still importing.
            warm = [self._executor.submit(_warm, self.startup_timeout_s) for _ in range(self.num_workers)]
            pids = {f.result(timeout=self.startup_timeout_s) for f in warm}
            if len(pids) != self.num_workers:
                raise RuntimeError(f"expected {self.num_workers} distinct workers, got pids {sorted(pids)}")
        except Exception as e:
            self._kill()
            raise RuntimeError(
                f"reward worker processes failed to start and load the reward function "
                f"({type(e).__name__}: {e}); see the worker's traceback above"
            ) from e

    def _processes(self) -> list:
        return list((getattr(self._executor, "_processes", None) or {}).values())

    def _kill(self) -> None:
        processes = self._processes()
        executor, self._executor = self._executor, None
        if executor is None:
            return
        for p in processes:
            if p.is_alive():
                p.terminate()
        executor.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)

    def _discard(self) -> None:
        """Kill the pool; a fresh one starts when there is something to score (`restarts`
        counts the pools discarded)."""
        self._kill()
        self.restarts += 1

    def _ensure_started(self) -> None:
        if self._executor is None:
            self._start()

    def _restart(self) -> None:
        self._discard()
        self._ensure_started()

    def close(self) -> None:
        self._closed = True
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        self._alive_w.close()  # any worker still around exits
        self._alive_r.close()

    def __enter__(self) -> "ScoringPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- scoring --

    def _submit(self, item: Mapping[str, Any]) -> Future:
        assert self._executor is not None
        try:
            return self._executor.submit(_run, item)
        except BrokenProcessPool:  # a worker died between items: nothing was lost
            self._restart()
            return self._executor.submit(_run, item)

    def map(self, items: Sequence[Mapping[str, Any]],
            on_outcome: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """One `Outcome` per item, in order. `on_outcome(index, outcome)` is called as each
        arrives; if it raises, the items in flight are abandoned with their pool and the
        error propagates."""
        if self._closed:
            raise RuntimeError("the scoring pool is closed")
        if self._executor is not None and not all(p.is_alive() for p in self._processes()):
            self._restart()  # a worker died between batches (a signal, the OOM killer)
        outcomes: list[Outcome | None] = [None] * len(items)
        inflight: dict[Future, tuple[int, float, bool]] = {}  # future -> (index, start, alone)
        try:
            self._map(items, outcomes, inflight, on_outcome)
        except BaseException:
            if inflight:
                self._discard()  # its workers may be busy for up to timeout_s: not worth waiting for
            raise
        return [o for o in outcomes if o is not None]

    def _map(self, items, outcomes, inflight, on_outcome) -> None:
        queue = collections.deque(range(len(items)))
        suspects: collections.deque[int] = collections.deque()  # rerun alone after a worker died
        kill_after = self.timeout_s + KILL_GRACE_S  # the worker's own alarm fires at timeout_s

        def settle(i: int, outcome: Outcome) -> None:
            outcomes[i] = outcome
            if on_outcome is not None:
                on_outcome(i, outcome)

        while queue or suspects or inflight:
            self._ensure_started()  # after a kill (a hung call, a dead worker, an abandoned map)
            if suspects:
                if not inflight:
                    i = suspects.popleft()
                    inflight[self._submit(items[i])] = (i, time.monotonic(), True)
            else:
                while queue and len(inflight) < self.num_workers:
                    i = queue.popleft()
                    inflight[self._submit(items[i])] = (i, time.monotonic(), False)

            deadline = min(start for _, start, _ in inflight.values()) + kill_after
            done, _ = wait(list(inflight), timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
            broken = False
            for future in done:
                i, _, alone = inflight.pop(future)
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    broken = True
                    if alone:
                        settle(i, Outcome("error", message="the reward worker process died while scoring this item"))
                    else:
                        suspects.append(i)
                except Exception as e:  # e.g. an unpicklable item or result
                    settle(i, Outcome("error", message=f"{type(e).__name__}: {e}"[:MAX_MESSAGE_CHARS]))
                else:
                    settle(i, outcome)

            now = time.monotonic()
            expired = [inflight.pop(f)[0] for f, (_, start, _) in list(inflight.items()) if now - start >= kill_after]
            if expired or broken:
                # The pool goes (a fresh one starts when there is more to score); the other
                # in-flight items die with it: rerun them.
                for i, _, alone in inflight.values():
                    if broken and not alone:
                        suspects.append(i)
                    else:
                        queue.appendleft(i)
                inflight.clear()
                self._discard()
            for i in expired:
                settle(i, Outcome("timeout", message=f"no result within timeout_s={self.timeout_s:g} (its worker "
                                                     "process was killed)"))
