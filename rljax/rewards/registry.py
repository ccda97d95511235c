"""Registries keyed by ``data_source``: reward functions and answer extractors.

A key is an exact name (``"openai/gsm8k"``) or a glob pattern (``"aime*"``,
``"synthetic/*"``; `fnmatch` syntax, any of ``*?[``). Lookup tries the exact names first,
then the patterns, most specific (longest) first, so ``"synthetic/reverse"`` wins over
``"synthetic/*"`` and ``"synthetic/*"`` over ``"*"``.

A reward function has verl's signature::

    compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)
        -> float | dict   # a dict carries "score" plus extra fields (e.g. "acc", "pred")

An answer extractor maps a response to its normalised final answer (``str | None``); it
is what majority voting (`rljax.evaluation`) compares.

The built-in scorers register themselves here when `rljax.rewards.builtins` is imported.
This module does not import it (the scorer modules import this one, so that would be a
cycle): the package ``__init__`` imports `builtins` first, and Python runs the package
``__init__`` before any of its modules, so every lookup below already sees the built-ins.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Any, Callable, Generic, Iterable, TypeVar

RewardFn = Callable[..., "float | dict[str, Any]"]
Extractor = Callable[[str], "str | None"]

F = TypeVar("F", bound=Callable[..., Any])

logger = logging.getLogger("rljax.rewards")

_GLOB_CHARS = frozenset("*?[")


class UnknownDataSourceError(KeyError):
    """No reward function (or extractor) is registered for a ``data_source``."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def is_pattern(name: str) -> bool:
    return any(c in _GLOB_CHARS for c in name)


class PatternRegistry(Generic[F]):
    """Name -> value table with exact names and glob patterns (see the module docstring)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._exact: dict[str, F] = {}
        self._patterns: dict[str, F] = {}

    def register(self, names: Iterable[str], value: F, *, overwrite: bool = False) -> F:
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"{self.kind}: a data_source name must be a non-empty string, got {name!r}")
            table = self._patterns if is_pattern(name) else self._exact
            if name in table and table[name] is not value and not overwrite:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered ({_describe(table[name])}); "
                    "pass overwrite=True to replace it"
                )
            table[name] = value
        return value

    def unregister(self, name: str) -> None:
        (self._patterns if is_pattern(name) else self._exact).pop(name, None)

    def find(self, data_source: str) -> F | None:
        if data_source in self._exact:
            return self._exact[data_source]
        for pattern in sorted(self._patterns, key=lambda p: (-len(p), p)):
            if fnmatch.fnmatchcase(data_source, pattern):
                return self._patterns[pattern]
        return None

    def get(self, data_source: str) -> F:
        value = self.find(data_source)
        if value is None:
            raise UnknownDataSourceError(
                f"no {self.kind} for data_source {data_source!r}; known: {', '.join(self.names())}. "
                "Register one with @register_reward(name) or set custom_reward_function.path"
            )
        return value

    def names(self) -> list[str]:
        return sorted(self._exact) + sorted(self._patterns)

    def __contains__(self, data_source: str) -> bool:
        return self.find(data_source) is not None


def _describe(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


REWARDS: PatternRegistry[RewardFn] = PatternRegistry("reward function")
EXTRACTORS: PatternRegistry[Extractor] = PatternRegistry("answer extractor")


def register_reward(*names: str, overwrite: bool = False) -> Callable[[F], F]:
    """Decorator: register a ``compute_score``-style function under data_source `names`
    (exact names or glob patterns)."""
    if not names:
        raise ValueError("register_reward needs at least one data_source name")

    def deco(fn: F) -> F:
        return REWARDS.register(names, fn, overwrite=overwrite)

    return deco


def register_answer_extractor(*names: str, overwrite: bool = False) -> Callable[[F], F]:
    """Decorator: register ``extract(solution_str) -> str | None`` for `names`."""
    if not names:
        raise ValueError("register_answer_extractor needs at least one data_source name")

    def deco(fn: F) -> F:
        return EXTRACTORS.register(names, fn, overwrite=overwrite)

    return deco


def get_reward_fn(data_source: str) -> RewardFn:
    """The reward function registered for `data_source` (`UnknownDataSourceError` if none)."""
    return REWARDS.get(data_source)


def has_reward_fn(data_source: str, *, warn: bool = True) -> bool:
    """Whether a reward function is registered for `data_source`. The first miss of each
    name logs a loud warning (once per process and name, however many rows ask): callers
    that then score such rows 0 (a reward model run) must not do it silently."""
    if data_source in REWARDS:
        return True
    if warn and data_source not in _WARNED_UNSCORED:
        _WARNED_UNSCORED.add(data_source)
        logger.warning(
            "!!! NO REWARD FUNCTION for data_source %r: no rule scores its samples (with a reward "
            "model or verifier they get rule score 0.0). Register one with @register_reward(%r) or "
            "set reward.custom_reward_function.path; docs/rewards.md, 'Rule rewards and verl', lists the "
            "verl data sources rljax scores. Known: %s. (Logged once per data_source.)",
            data_source, data_source, ", ".join(REWARDS.names()),
        )
    return False


_WARNED_UNSCORED: set[str] = set()


def get_answer_extractor(data_source: str) -> Extractor | None:
    """The answer extractor for `data_source`, or None when none is registered."""
    return EXTRACTORS.find(data_source)


def known_data_sources() -> list[str]:
    """Registered reward names: exact names, then patterns."""
    return REWARDS.names()


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> float | dict[str, Any]:
    """verl's ``default_compute_score``: dispatch on `data_source` through the registry."""
    fn = get_reward_fn(data_source)
    return fn(data_source, solution_str, ground_truth, extra_info, **kwargs)

