"""The `Tool` interface and `ToolResult`.

A tool is declared by an OpenAI function schema
(``{"type": "function", "function": {"name", "description", "parameters"}}``) and implemented
by a `Tool` subclass. Per-episode state: the loop calls `create_state()` the first time an
episode uses the tool, passes that state to every `call`, asks `reward(state)` at the end of
the episode (``None`` = no reward contribution) and finally `release(state)`. Any of
`create_state`, `release`, `reward` may be plain or ``async`` methods.

`call` returns a `ToolResult` (or a plain string). A tool reports a failure the model should
see as ``ToolResult(text, error=kind)`` with a kind from `ERROR_KINDS`; it may also raise, in
which case the loop turns the exception into an ``exception`` observation. Either way the
episode goes on.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rljax.agent.tools.schema import check_function_schema, validate

ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout")


@dataclass
class ToolResult:
    """What the model sees (``text``) and, when the call failed, the error kind."""

    text: str
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.error is not None and self.error not in ERROR_KINDS:
            raise ValueError(f"ToolResult.error must be one of {ERROR_KINDS}, got {self.error!r}")


class Tool(ABC):
    """Base class of tools. Subclasses set `default_schema` and implement `call`.

    Args:
        schema: the OpenAI function schema; defaults to the class's `default_schema`. Its
            ``function.name`` is the name the model calls the tool by.
        **options: implementation options (keyword arguments of the subclass ``__init__``).
    """

    default_schema: ClassVar[dict[str, Any] | None] = None

    def __init__(self, schema: dict[str, Any] | None = None):
        schema = schema if schema is not None else self.default_schema
        if schema is None:
            raise ValueError(f"{type(self).__name__} needs a tool schema")
        fn = check_function_schema(schema)
        self.schema: dict[str, Any] = schema
        self.name: str = fn["name"]
        self.parameters: dict[str, Any] = fn.get("parameters", {"type": "object", "properties": {}})

    def validate_arguments(self, arguments: dict[str, Any]) -> list[str]:
        """Violations of the parameters schema (required keys, types, ...); empty = valid."""
        return validate(arguments, self.parameters)

    def create_state(self) -> Any:
        """Per-episode state (may be async). Default: none."""
        return None

    @abstractmethod
    async def call(self, arguments: dict[str, Any], state: Any) -> ToolResult | str:
        """Run the tool on validated arguments."""

    def reward(self, state: Any) -> float | None:
        """The tool's reward for the episode (may be async). Default: none."""
        return None

    def release(self, state: Any) -> None:
        """Free per-episode state (may be async)."""
        return None


class PerLoopSemaphore:
    """An `asyncio.Semaphore` per running event loop.

    A plain semaphore binds to the first loop that waits on it, so an object reused across
    ``asyncio.run`` calls (a trainer running one rollout per step) would fail on the second
    loop. This hands out one semaphore per loop, all with the same limit.
    """

    def __init__(self, value: int):
        self.value = value
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._by_loop.get(loop)
        if sem is None:
            sem = self._by_loop[loop] = asyncio.Semaphore(self.value)
        return sem


async def maybe_await(value: Any) -> Any:
    """Await `value` if it is awaitable (lets hooks be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value
