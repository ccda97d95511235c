"""`RewardManager`: score a batch of responses with rule-based reward functions, contained.

Each batch item is a mapping with verl's fields: ``data_source``, ``solution_str`` (the
decoded response), ``ground_truth`` and optional ``extra_info``. The reward function is
either the registry dispatcher (`default_compute_score`, the default), a custom function
(`custom_reward_function` config, `FileRewardFn`) or any picklable callable.

Containment: a function that raises, returns garbage (no ``score``, NaN) or — in
``mode="process"`` — runs longer than `timeout_s` is scored `error_score` (0.0) and
counted in ``reward/errors`` / ``reward/timeouts``; the run goes on, and so does the
manager (a hung worker is killed and replaced; see `rljax.rewards.pool`).
``mode="inline"`` scores in the calling process: faster, for trusted functions (the
built-ins); exceptions are still contained, hangs are not.

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

from rljax.rewards.custom import custom_reward_fn_from_config
from rljax.rewards.pool import Outcome, ScoringPool, score_item
from rljax.rewards.registry import REWARDS, UnknownDataSourceError, _ensure_builtins, default_compute_score
from rljax.rewards.result import RewardResult, collect_extras, extra_metrics

logger = logging.getLogger("rljax.rewards")

Mode = Literal["process", "inline"]
REQUIRED_KEYS = ("data_source", "solution_str", "ground_truth")


@dataclass(frozen=True)
class WithKwargs:
    """Picklable ``partial``: `fn` called with `kwargs` added (verl's ``reward_kwargs``)."""

    fn: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def load(self) -> None:
        load = getattr(self.fn, "load", None)
        if callable(load):
            load()

    def __call__(self, **call_kwargs: Any) -> Any:
        return self.fn(**call_kwargs, **self.kwargs)


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
    ):
        if mode not in ("process", "inline"):
            raise ValueError(f"reward mode must be 'process' or 'inline', got {mode!r}")
        self.uses_registry = compute_score is None
        fn: Callable[..., Any] = default_compute_score if compute_score is None else compute_score
        if reward_kwargs:
            fn = WithKwargs(fn, dict(reward_kwargs))
        self.fn = fn
        self.mode = mode
        self.error_score = float(error_score)
        self.timeout_s = timeout_s
        self._pool: ScoringPool | None = None
        if mode == "process":
            workers = num_workers or max(1, min(8, (os.cpu_count() or 2) - 1))
            self._pool = ScoringPool(fn, num_workers=workers, timeout_s=timeout_s, mp_context=mp_context)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | None = None, custom_reward_function: Mapping[str, Any] | None = None
    ) -> "RewardManager":
        """From a ``reward`` config block (keys: ``mode``, ``num_workers``, ``timeout_s``,
        ``error_score``, ``mp_context``, ``reward_kwargs``) and verl's
        ``custom_reward_function`` block (``path``, ``name``, ``reward_kwargs``)."""
        config = dict(config or {})
        allowed = {"mode", "num_workers", "timeout_s", "error_score", "mp_context", "reward_kwargs"}
        unknown = set(config) - allowed
        if unknown:
            raise ValueError(f"reward config: unknown key(s) {sorted(unknown)}; expected {sorted(allowed)}")
        custom = custom_reward_fn_from_config(custom_reward_function)
        return cls(custom, **config)

    # -- scoring --

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> RewardResult:
        return self.score(batch)

    def score(self, batch: Sequence[Mapping[str, Any]]) -> RewardResult:
        """Scores, extra fields and metrics of `batch` (see `RewardResult`)."""
        self._check(batch)
        if self.mode == "process":
            if self._pool is None:
                raise RuntimeError("the reward manager is closed")
            outcomes = self._pool.map(batch)
        else:
            outcomes = [score_item(self.fn, item) for item in batch]
        return self._result(outcomes)

    def _check(self, batch: Sequence[Mapping[str, Any]]) -> None:
        for i, item in enumerate(batch):
            missing = [k for k in REQUIRED_KEYS if k not in item]
            if missing:
                raise ValueError(f"reward batch item {i} lacks {missing}; it has {sorted(item)}")
        if self.uses_registry:  # a config error, not a reward failure: fail loudly
            _ensure_builtins()
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
        if errors:
            first = min(errors)
            logger.warning("reward: %d of %d samples failed; first (sample %d): %s", len(errors), n, first, errors[first])
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
