"""The depth-1 rollout producer of `trainer.mode: one_step_off`: the rollout of step k+1
runs in a background thread on the rollout devices while the trainer trains on step k's
batch.

    step k:  collect batch k ──► hand off weights v_k (sampler idle) ──► submit prompts k+1 ──► train on batch k
                                                                             │ (background thread)
                                                                             ▼
                                                        sample + score prompts k+1 with v_k
    step k+1: collect batch k+1 (waits only if the rollout is slower than the training) ...

Versions: `v_k` holds k learner steps. Step 0 trains on a batch sampled by v_0 (submitted
at once, nothing to overlap with); step k >= 1 on one sampled by v_(k-1): the staleness
(version trained minus the oldest version that produced a group's tokens) is 0 at step 0
and exactly 1 after. Weights cross only between rollouts: `update_weights` waits for the
rollout in flight to finish, so a batch is sampled by one version (no partial rollouts).

The producer knows which version the sampler's weights hold (`sampler_version`, set by
every `update_weights`) and stamps the samples with it; a `submit` whose stated version
differs is an error, so a skipped weight update cannot go unnoticed.

A checkpoint after step k holds batch k+1 (finished, not trained) as JSON
(`rollout_to_json`); the data position is past prompts k+1, so a resumed run collects the
restored batch and draws prompts k+2 next: nothing sampled is lost or trained twice.

With an inline reward manager the rollout's reward calls run on the main thread (SIGALRM,
`rljax.rl.main_thread`): the trainer serves them whenever it waits on the producer, so
scoring then overlaps nothing; `reward.mode: process` scores in the background too. With
several processes the rollout's gather (a collective) is such a main-thread call as well,
so it runs while every process waits for the same batch; a wait that reaches its deadline
reports the error a served call ended the rollout with (the gather's meeting of the
processes names a missing one) in preference to `RolloutTimeout`.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rljax.rl.batch import Sample
from rljax.rl.main_thread import MainThreadCalls
from rljax.rl.producer import Prompts, SyncProducer
from rljax.rl.scoring import ScoredRollout
from rljax.rollout.params import SamplingParams


_GRACE_S = 1.0  # after the deadline, how long a rollout may take to report the error it ended with


class RolloutTimeout(RuntimeError):
    """The rollout in flight did not finish within `async.timeout_s`."""


@dataclass
class _Pending:
    """A submitted batch: its future (None once restored from a checkpoint, then `done`
    holds the rollout), its prompts' step-boundary version and its generation interval."""

    future: concurrent.futures.Future | None
    version: int
    done: ScoredRollout | None = None
    start: float = 0.0
    end: float | None = None


class OneStepOffProducer:
    """Depth 1 over a `SyncProducer` (which runs dynamic sampling / ReMax's greedy rollout
    as configured): `submit` starts the batch in a background thread, `collect` waits for
    the oldest. At most one batch is pending (in flight or finished, not collected).

    `update_weights(params) -> metrics` hands new weights to the sampler (the rollout
    replicas); `main_thread` (the replicas' `MainThreadCalls`) is served while waiting;
    `timeout_s` bounds every wait (0: none)."""

    def __init__(self, inner: SyncProducer, update_weights: Callable[[Any], dict[str, float]],
                 main_thread: MainThreadCalls | None = None, timeout_s: float = 0.0, sampler_version: int = 0):
        self.inner = inner
        self._update_weights = update_weights
        self.main_thread = main_thread
        self.timeout_s = timeout_s
        self.sampler_version = sampler_version  # the learner steps in the sampler's weights
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rljax-producer")
        self._pending: _Pending | None = None
        self._intervals: list[tuple[float, float | None]] = []  # recent generation (start, end) times

    # ---- the producer seam ---------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """A batch is submitted and not yet collected."""
        return self._pending is not None

    def submit(self, prompts: Prompts, policy_version: int, params: SamplingParams) -> None:
        """Sample and score `prompts` in the background with the sampler's weights, which
        must hold `policy_version` (else RuntimeError: the weights were not handed over)."""
        if policy_version != self.sampler_version:
            raise RuntimeError(f"submit at policy version {policy_version}, but the sampler holds version "
                               f"{self.sampler_version}: its weights were not updated")
        if self._pending is not None:
            raise RuntimeError("submit() with a batch still pending: depth 1 holds one batch")
        pending = _Pending(None, policy_version)

        def produce() -> ScoredRollout:
            pending.start = time.perf_counter()
            self._intervals.append((pending.start, None))
            try:
                self.inner.submit(prompts, policy_version, params)
                return self.inner.collect()
            finally:
                pending.end = time.perf_counter()
                self._intervals[-1] = (pending.start, pending.end)
                del self._intervals[:-8]

        pending.future = self._pool.submit(produce)
        self._pending = pending

    def collect(self) -> ScoredRollout:
        """The pending batch, once finished (RolloutTimeout after `timeout_s`); its
        generation seconds are in `timing_s/gen` of its metrics."""
        if self._pending is None:
            raise RuntimeError("collect() before submit(): no batch of prompts is pending")
        rollout = self._wait()
        pending, self._pending = self._pending, None
        if pending.end is not None:
            rollout.metrics["timing_s/gen"] = pending.end - pending.start
        return rollout

    def update_weights(self, params, version: int) -> dict[str, float]:
        """Hand `params` (the learner's weights after `version` steps) to the sampler once
        the rollout in flight, if any, has finished; nothing to do when it already holds
        `version`."""
        if version == self.sampler_version:
            return {}
        if self._pending is not None:
            self._wait()
        metrics = self._update_weights(params)
        self.sampler_version = version
        return metrics

    # ---- checkpoints ---------------------------------------------------------------------

    def pending_rollout(self) -> ScoredRollout | None:
        """The pending batch, finished (waits for it), left pending; None if there is none."""
        return None if self._pending is None else self._wait()

    def restore(self, rollout: ScoredRollout | None, sampler_version: int) -> None:
        """After a resume: the checkpoint's pending batch (None: none) and the version the
        sampler's weights now hold."""
        self.sampler_version = sampler_version
        self._pending = None if rollout is None else _Pending(None, sampler_version, done=rollout)

    # ---- measures ------------------------------------------------------------------------

    def busy_seconds(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] (`time.perf_counter`) during which a rollout was running."""
        now = time.perf_counter()
        return sum(max(0.0, min(t1, end if end is not None else now) - max(t0, start))
                   for start, end in self._intervals)

    def close(self) -> None:
        """Stop taking work; a rollout in flight is left to end with the sampler's close."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _wait(self) -> ScoredRollout:
        pending = self._pending
        if pending.done is None:
            timeout = self.timeout_s or None
            try:
                if self.main_thread is not None and self.main_thread.on_owner:
                    self.main_thread.serve([pending.future], timeout_s=timeout)
                pending.done = pending.future.result(timeout=timeout)
            except (TimeoutError, concurrent.futures.TimeoutError):
                if self.main_thread is not None and self.main_thread.on_owner:
                    # a call served here may end at the same deadline (the gather's meeting of the processes):
                    # the error the rollout then ends with says more than the timeout
                    concurrent.futures.wait([pending.future], timeout=_GRACE_S)
                if pending.future.done() and pending.future.exception() is not None:
                    raise pending.future.exception() from None
                raise RolloutTimeout(f"the rollout of the batch sampled by policy version {pending.version} is not "
                                     f"done after async.timeout_s={self.timeout_s:g} s (a stalled sampler or "
                                     "reward)") from None
        return pending.done


def staleness_metrics(samples: list[Sample], trained_version: int) -> dict[str, float]:
    """`async/staleness/{mean,max}` over the groups of a batch: `trained_version` minus
    the oldest policy version among a group's samples (a group ages as a unit; prime-rl's
    definition), the mean taken over groups."""
    oldest: dict[int, int] = {}
    for s in samples:
        oldest[s.group_id] = min(oldest.get(s.group_id, s.policy_version), s.policy_version)
    ages = np.asarray([trained_version - v for v in oldest.values()], np.float64)
    return {"async/staleness/mean": float(ages.mean()), "async/staleness/max": float(ages.max())}


# ---- a rollout as JSON (the checkpoint's pending batch) ------------------------------------

def _plain(value: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists (exact: a float32 widens to a
    float64 that narrows back to the same value)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def rollout_to_json(rollout: ScoredRollout) -> dict:
    """Everything a step reads of a rollout, in JSON values (`rollout_from_json` inverts)."""
    samples = [{
        "prompt_ids": _plain(s.prompt_ids), "response_ids": _plain(s.response_ids),
        "response_mask": _plain(s.response_mask), "response_log_probs": [float(x) for x in s.response_log_probs],
        "group_id": int(s.group_id), "score": float(s.score), "truncated": bool(s.truncated),
        "baseline": float(s.baseline), "policy_version": s.policy_version,
        "expert_ids": None if s.expert_ids is None else _plain(np.asarray(s.expert_ids)),
    } for s in rollout.samples]
    return {"samples": samples, "metrics": _plain(rollout.metrics), "records": _plain(rollout.records)}


def rollout_from_json(data: dict) -> ScoredRollout:
    samples = []
    for d in data["samples"]:
        d = dict(d)
        if d["expert_ids"] is not None:
            d["expert_ids"] = np.asarray(d["expert_ids"], np.int32)
        samples.append(Sample(**d))
    return ScoredRollout(samples, dict(data["metrics"]), list(data["records"]))
