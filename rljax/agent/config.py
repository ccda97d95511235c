"""Typed configuration of the agent loop.

`AgentConfig.from_dict` builds the dataclasses from a (YAML-parsed) mapping; an unknown key
raises `ValueError` naming it with its dotted path (``agent.max_turn``), and obviously wrong
types (a string for ``max_turns``) raise too. Configs are frozen: no component mutates them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

OVERFLOW_POLICIES = ("truncate", "end")


@dataclass(frozen=True)
class EnvironmentConfig:
    """Which `Environment` class to build per episode (``"pkg.module:Class"``) and its options."""

    class_name: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentConfig:
    """Agent-loop settings.

    Attributes:
        tool_parser: registered tool-call parser (``hermes``/``qwen``, ``llama3_json``).
        max_turns: maximum assistant turns (generations) per episode.
        max_response_tokens: budget for everything after the prompt (sampled tokens and
            observation tokens), in tokens.
        max_tokens_per_turn: optional cap on one generation; the per-turn ``max_tokens`` sent
            to the sampler is ``min(this, remaining budget)`` and *replaces* any
            ``max_tokens`` in the sampling params (samplers often default it to a small
            number, which would silently cut every turn).
        max_parallel_tool_calls: tool calls of one turn run concurrently up to this many.
        max_concurrent_tool_calls: optional cap on tool calls in flight across all episodes.
        tool_timeout_s: wall-clock limit of one tool call (a ``timeout`` error observation).
        overflow: what happens when an observation does not fit in the remaining budget:
            ``truncate`` its contents in tokens, or ``end`` the episode.
        min_turn_tokens: tokens kept free for the next generation when fitting an observation;
            if even a fully truncated observation leaves fewer, the episode ends.
        tool_config_path: YAML file declaring the tools (see `rljax.agent.tools.registry`).
        environment: an environment class to use instead of tools.
        chat_template_kwargs: extra chat-template variables (e.g. ``enable_thinking``).
        chat_template: a Jinja chat template overriding the tokenizer's.
        end_of_turn_token: string closing an assistant turn (default: tokenizer eos_token).
        extra_turn_end_tokens: other tokens that also close a turn (e.g. ``<|eom_id|>``).
        max_concurrent_episodes: optional cap on episodes in flight in `run_episodes`.
    """

    tool_parser: str = "hermes"
    max_turns: int = 8
    max_response_tokens: int = 4096
    max_tokens_per_turn: int | None = None
    max_parallel_tool_calls: int = 4
    max_concurrent_tool_calls: int | None = None
    tool_timeout_s: float = 30.0
    overflow: Literal["truncate", "end"] = "truncate"
    min_turn_tokens: int = 16
    tool_config_path: str | None = None
    environment: EnvironmentConfig | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    end_of_turn_token: str | None = None
    extra_turn_end_tokens: tuple[str, ...] = ()
    max_concurrent_episodes: int | None = None

    def __post_init__(self) -> None:
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"agent.overflow must be one of {OVERFLOW_POLICIES}, got {self.overflow!r}")
        for name in ("max_turns", "max_response_tokens", "max_parallel_tool_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_tokens_per_turn", "max_concurrent_tool_calls", "max_concurrent_episodes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"agent.{name} must be >= 1 or null, got {value}")
        if not 0 < self.tool_timeout_s < float("inf"):
            raise ValueError(f"agent.tool_timeout_s must be a finite number > 0, got {self.tool_timeout_s}")
        if self.min_turn_tokens < 1:
            raise ValueError("agent.min_turn_tokens must be >= 1")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, path: str = "agent") -> AgentConfig:
        """Build from a mapping; unknown keys raise `ValueError` naming the dotted key."""
        return from_dict(cls, data or {}, path)


def _check_type(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(value, a, where)
            except (TypeError, ValueError) as e:
                errors.append(e)
        raise errors[0] if errors else TypeError(f"{where}: bad value {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ValueError(f"{where} must be one of {typing.get_args(tp)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"{where} must be a mapping, got {type(value).__name__}")
        return from_dict(tp, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where} must be a list, got {type(value).__name__}")
        return tuple(value)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{where} must be a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where} must be an integer, got {value!r}")
        return value
    if tp in (str, bool) and not isinstance(value, tp):
        raise TypeError(f"{where} must be a {tp.__name__}, got {value!r}")
    return value


def from_dict(cls: type, data: Mapping[str, Any], path: str) -> Any:
    """Instantiate dataclass `cls` from `data`, recursing into nested dataclass fields."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{path} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise ValueError(f"unknown config key {path}.{key} (valid: {sorted(fields)})")
        kwargs[key] = _check_type(value, hints[key], f"{path}.{key}")
    return cls(**kwargs)
