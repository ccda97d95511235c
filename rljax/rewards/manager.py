"""`RewardManager`: score a batch of responses with rule-based reward functions, contained.

Each batch item is a mapping with verl's fields: ``data_source``, ``solution_str`` (the
decoded response), ``ground_truth`` and optional ``extra_info``. The reward function is
either the registry dispatcher (`default_compute_score`, the default), a custom function
(`custom_reward_function` config, `FileRewardFn`) or any picklable callable.

Failures: a function that raises (``sys.exit`` included), returns garbage (no ``score``),
runs longer than `timeout_s` (interrupted in its worker, or the worker killed; see
`rljax.rewards.pool`) or kills its process fails on that sample. `on_error` says what
follows: ``"zero"`` scores the sample `error_score` (0.0) and counts it in
``reward/errors`` / ``reward/timeouts`` (the run goes on, and so does the manager: a hung
or dead worker is replaced); ``"fail"`` raises `RewardFailureError` at the first failure.
Either way the first failure of a batch is one log line, as it happens, naming the
function and the sample (index, ``data_source``, ``uid`` when the item has one).

A score that is not finite in float32, the dtype rewards are trained in (nan, inf, or a
float64 such as 1e308 that overflows float32), is never a score to train on: `score`
raises `NonFiniteRewardError` naming the function and the sample, whatever `on_error`.

Where a function runs:

`code_settings` (`rljax.rewards.code.CodeRewardSettings`) reaches the built-in code scorers
(``codecontests``, ``apps``, ``codeforces``, ``taco``) as their ``settings`` argument.

* ``mode="process"``: every function in worker processes.
* ``mode="inline"``: the built-in scorers (the registry dispatcher, trusted code) in the
  calling process, faster; `timeout_s` is enforced there with ``SIGALRM``, which needs
  the main thread (`score` refuses elsewhere rather than run without a timeout). A custom
  function still runs in worker processes, since it may hang or call ``os._exit``, unless
  ``trust_custom_reward=True`` runs it inline too.

A reward that fails on every sample of `max_consecutive_failed_steps` batches in a row
(one `score` call per RL step) is broken, not unlucky: `score` raises
`RewardFailureError` naming the function instead of letting the run train on zeros.

Worker processes start with ``forkserver`` (``spawn`` where unavailable), which imports the
main module once: a training *script* must guard its entry point with
``if __name__ == "__main__":`` (the ``rljax`` command does), and a reward function must
be picklable (a module-level function, `FileRewardFn`, `FormatReward`, `WithKwargs`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from rljax.rewards.code import CODE_SOURCES, CodeRewardSettings
from rljax.rewards.custom import FileRewardFn, custom_reward_fn_from_config
from rljax.rewards.pool import Outcome, ScoringPool, can_alarm, score_item_inline
from rljax.rewards.registry import REWARDS, UnknownDataSourceError, default_compute_score
from rljax.rewards.result import RewardResult, collect_extras, extra_metrics

logger = logging.getLogger("rljax.rewards")

Mode = Literal["process", "inline"]
OnError = Literal["zero", "fail"]
REQUIRED_KEYS = ("data_source", "solution_str", "ground_truth")


class RewardFailureError(RuntimeError):
    """The reward function failed: on a sample with ``on_error="fail"``, or on every sample
    of several batches in a row."""


class NonFiniteRewardError(RewardFailureError):
    """A reward that is not finite in float32 (nan, inf, 1e308)."""


def describe_sample(item: Mapping[str, Any], index: int, n: int) -> str:
    """``sample 3 of 16 (data_source 'gsm8k', uid 5)``: which sample of a batch, for messages."""
    uid = f", uid {item['uid']}" if item.get("uid") is not None else ""
    return f"sample {index} of {n} (data_source {str(item.get('data_source'))!r}{uid})"


@dataclass(frozen=True)
class WithKwargs:
    """Picklable ``partial``: `fn` called with `kwargs` added (verl's ``reward_kwargs``);
    with `sources`, only for items whose ``data_source`` is one of them (the code scorers'
    settings, which the other scorers do not take)."""

    fn: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] | None = None  # None: every item

    def load(self) -> None:
        load = getattr(self.fn, "load", None)
        if callable(load):
            load()

    def __call__(self, **call_kwargs: Any) -> Any:
        if self.sources is not None and call_kwargs.get("data_source") not in self.sources:
            return self.fn(**call_kwargs)
        return self.fn(**call_kwargs, **self.kwargs)


def describe_reward_fn(fn: Callable[..., Any], data_source: str | None = None) -> str:
    """A reward function's name for messages: ``path:name`` for a file's function,
    ``module:name`` for any other; for the registry dispatcher, the function registered
    for `data_source` when given."""
    if isinstance(fn, WithKwargs):
        return describe_reward_fn(fn.fn, data_source)
    if isinstance(fn, FileRewardFn):
        return f"{fn.path}:{fn.name}"
    if fn is default_compute_score:
        registered = REWARDS.find(data_source) if data_source is not None else None
        if registered is None:
            return "the built-in scorer (default_compute_score)"
        return f"the built-in scorer {describe_reward_fn(registered)}"
    name = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if name is None:
        return repr(fn)
    return f"{module}:{name}" if module else name


class RewardManager:
    """Scores batches: ``manager(batch) -> RewardResult``. Close it (or use ``with``) to
    stop its worker processes."""

    def __init__(
        self,
        compute_score: Callable[..., Any] | None = None,
        *,
        reward_kwargs: Mapping[str, Any] | None = None,
        mode: Mode = "process",
        num_workers: int | None = None,
        timeout_s: float = 10.0,
        error_score: float = 0.0,
        mp_context: str | None = None,
        trust_custom_reward: bool = False,
        max_consecutive_failed_steps: int = 3,
        on_error: OnError = "zero",
        code_settings: CodeRewardSettings | None = None,
    ):
        if mode not in ("process", "inline"):
            raise ValueError(f"reward mode must be 'process' or 'inline', got {mode!r}")
        if on_error not in ("zero", "fail"):
            raise ValueError(f"reward on_error must be 'zero' or 'fail', got {on_error!r}")
        if not timeout_s > 0:
            raise ValueError(f"reward timeout_s must be > 0, got {timeout_s}")
        if max_consecutive_failed_steps < 0:
            raise ValueError(f"reward max_consecutive_failed_steps must be >= 0, got {max_consecutive_failed_steps}")
        if trust_custom_reward and mode != "inline":
            raise ValueError("reward trust_custom_reward: only with mode='inline' (in 'process' mode every "
                             "function runs in worker processes)")
        self.uses_registry = compute_score is None
        fn: Callable[..., Any] = default_compute_score if compute_score is None else compute_score
        if reward_kwargs:
            fn = WithKwargs(fn, dict(reward_kwargs))
        if code_settings is not None and self.uses_registry:
            fn = WithKwargs(fn, {"settings": code_settings}, CODE_SOURCES)
        self.fn = fn
        self.mode = mode
        self.on_error = on_error
        self.error_score = float(error_score)
        self.timeout_s = float(timeout_s)
        self.max_consecutive_failed_steps = int(max_consecutive_failed_steps)
        self._failed_batches = 0  # consecutive score() calls where every sample failed
        # inline mode runs only trusted code in this process: the built-ins, or a custom function on request
        self.inline = mode == "inline" and (self.uses_registry or trust_custom_reward)
        self._pool: ScoringPool | None = None
        if not self.inline:
            if mode == "inline":
                logger.info("reward.mode=inline: the custom reward function %s runs in worker processes "
                            "(reward.trust_custom_reward=true runs it inline)", describe_reward_fn(fn))
            workers = num_workers or max(1, min(8, (os.cpu_count() or 2) - 1))
            self._pool = ScoringPool(fn, num_workers=workers, timeout_s=timeout_s, mp_context=mp_context)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | None = None, custom_reward_function: Mapping[str, Any] | None = None
    ) -> "RewardManager":
        """From a ``reward`` config block (keys: ``mode``, ``num_workers``, ``timeout_s``,
        ``error_score``, ``mp_context``, ``reward_kwargs``, ``trust_custom_reward``,
        ``max_consecutive_failed_steps``, ``on_error``, ``code_settings``) and verl's ``custom_reward_function``
        block (``path``, ``name``, ``reward_kwargs``)."""
        config = dict(config or {})
        allowed = {"mode", "num_workers", "timeout_s", "error_score", "mp_context", "reward_kwargs",
                   "trust_custom_reward", "max_consecutive_failed_steps", "on_error", "code_settings"}
        unknown = set(config) - allowed
        if unknown:
            raise ValueError(f"reward config: unknown key(s) {sorted(unknown)}; expected {sorted(allowed)}")
        custom = custom_reward_fn_from_config(custom_reward_function)
        return cls(custom, **config)

    # -- scoring --

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> RewardResult:
        return self.score(batch)

    def score(self, batch: Sequence[Mapping[str, Any]]) -> RewardResult:
        """Scores, extra fields and metrics of `batch` (see `RewardResult`). Raises
        `NonFiniteRewardError` at a score not finite in float32; `RewardFailureError` at the
        first failure with ``on_error="fail"``, or when every sample has failed in
        `max_consecutive_failed_steps` consecutive calls."""
        self._check(batch)
        watch = _FirstFailure(self, batch)
        if not self.inline:
            if self._pool is None:
                raise RuntimeError("the reward manager is closed")
            outcomes = self._pool.map(batch, watch)
        else:
            if not can_alarm():
                raise RuntimeError(
                    f"reward.mode=inline cannot enforce reward.timeout_s={self.timeout_s:g} here: the in-process "
                    "timeout uses SIGALRM, which needs the main thread of a POSIX process; score from the main "
                    "thread or use reward.mode=process")
            outcomes = []
            for i, item in enumerate(batch):
                outcomes.append(score_item_inline(self.fn, item, self.timeout_s))
                watch(i, outcomes[-1])
        result = self._result(outcomes)
        self._count_failures(batch, result)
        return result

    def failure_line(self, batch: Sequence[Mapping[str, Any]], index: int, outcome: Outcome) -> str:
        """One line: which function failed how on which sample."""
        item = batch[index]
        what = {"timeout": "timed out", "nonfinite": "returned a reward that is not finite in float32",
                "error": "failed"}[outcome.status]
        return (f"reward function {describe_reward_fn(self.fn, str(item['data_source']))} {what} on "
                f"{describe_sample(item, index, len(batch))}: {outcome.message}")

    def _count_failures(self, batch: Sequence[Mapping[str, Any]], result: RewardResult) -> None:
        if not batch:
            return
        self._failed_batches = self._failed_batches + 1 if len(result.errors) == len(batch) else 0
        limit = self.max_consecutive_failed_steps
        if limit and self._failed_batches >= limit:
            first = result.errors[min(result.errors)]
            sources = ", ".join(sorted({str(item["data_source"]) for item in batch}))
            raise RewardFailureError(
                f"reward function {describe_reward_fn(self.fn)} failed on every sample of {self._failed_batches} "
                f"consecutive batches (data_source {sources}; last error: {first}); fix it, or raise "
                "reward.max_consecutive_failed_steps (0: never stop)")

    def _check(self, batch: Sequence[Mapping[str, Any]]) -> None:
        for i, item in enumerate(batch):
            missing = [k for k in REQUIRED_KEYS if k not in item]
            if missing:
                raise ValueError(f"reward batch item {i} lacks {missing}; it has {sorted(item)}")
        if self.uses_registry:  # a config error, not a reward failure: fail loudly
            unknown = sorted({str(item["data_source"]) for item in batch if item["data_source"] not in REWARDS})
            if unknown:
                raise UnknownDataSourceError(
                    f"no reward function for data_source {unknown}; known: {', '.join(REWARDS.names())}. "
                    "Register one with @register_reward(name) or set custom_reward_function.path"
                )

    def _result(self, outcomes: list[Outcome]) -> RewardResult:
        n = len(outcomes)
        scores = np.array([o.score if o.status == "ok" else self.error_score for o in outcomes], dtype=np.float32)
        extras = collect_extras([o.extras for o in outcomes], n)
        errors = {i: f"{o.status}: {o.message}" for i, o in enumerate(outcomes) if o.status != "ok"}
        metrics = {
            "reward/errors": float(sum(o.status == "error" for o in outcomes)),
            "reward/timeouts": float(sum(o.status == "timeout" for o in outcomes)),
            **extra_metrics(extras),
        }
        return RewardResult(scores, extras, metrics, errors)

    # -- lifecycle --

    @property
    def pool_restarts(self) -> int:
        return self._pool.restarts if self._pool is not None else 0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "RewardManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _FirstFailure:
    """`score`'s outcome watcher: a non-finite score raises `NonFiniteRewardError`; the
    first failure of the batch raises `RewardFailureError` (``on_error="fail"``) or is
    logged as one line (``"zero"``)."""

    def __init__(self, manager: RewardManager, batch: Sequence[Mapping[str, Any]]):
        self.manager, self.batch, self.seen = manager, batch, False

    def __call__(self, index: int, outcome: Outcome) -> None:
        if outcome.status == "ok":
            return
        line = self.manager.failure_line(self.batch, index, outcome)
        if outcome.status == "nonfinite":
            raise NonFiniteRewardError(f"{line}; a reward must be finite in float32, the dtype it is trained in")
        if self.manager.on_error == "fail":
            raise RewardFailureError(f"{line} (reward.on_error=fail; zero scores a failed sample "
                                     f"{self.manager.error_score:g} and goes on)")
        if not self.seen:
            self.seen = True
            logger.warning("%s; scored %g (reward.on_error=zero), this batch's failures are counted in "
                           "reward/errors and reward/timeouts", line, self.manager.error_score)
