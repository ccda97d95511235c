"""Typed configuration of the agent loop.

`AgentConfig.from_dict` builds the dataclasses from a (YAML-parsed) mapping; an unknown key
raises `ValueError` naming it with its dotted path (``agent.max_turn``), and obviously wrong
types (a string for ``max_turns``) raise too. Configs are frozen: no component mutates them.
`rljax.config` loads the RL config's `agent:` section with the same `from_dict` (its
errors become one-line `ConfigError`s), so the section reads the same in both places.
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
    """Which `Environment` class to build per episode, and its options."""

    class_name: str  # "pkg.module:Class", an `rljax.agent.Environment` subclass
    options: dict[str, Any] = field(default_factory=dict)  # keyword arguments of its constructor


@dataclass(frozen=True)
class AgentConfig:
    """Agent-loop settings (the RL config's `agent:` section; verl: `actor_rollout_ref.rollout.multi_turn`).

    `max_tokens_per_turn` *replaces* any `max_tokens` in the sampling params: samplers often
    default it to a small number, which would silently cut every turn. An observation that
    does not fit the remaining budget is cut to fit (`overflow: truncate`) unless even a
    fully cut one leaves fewer than `min_turn_tokens` for the next generation, when the
    episode ends; `overflow: end` ends it at once.
    """

    tool_parser: str = "hermes"  # registered tool-call parser: hermes (= qwen), llama3_json (verl: format)
    max_turns: int = 8  # assistant turns (generations) per episode at most (verl: max_assistant_turns)
    max_response_tokens: int = 4096  # tokens after the prompt (sampled + observations); RL: <= rollout.response_length
    max_tokens_per_turn: int | None = None  # tokens of one generation at most; null: the remaining budget
    max_parallel_tool_calls: int = 4  # tool calls of one turn run concurrently (verl: max_parallel_calls)
    max_concurrent_tool_calls: int | None = None  # tool calls in flight across all episodes; null: no cap
    tool_timeout_s: float = 30.0  # seconds one tool call may take (then a `timeout` error observation)
    overflow: Literal["truncate", "end"] = "truncate"  # an observation over the budget: cut it | end the episode
    min_turn_tokens: int = 16  # tokens kept free for the next generation when fitting an observation
    tool_config_path: str | None = None  # YAML declaring the tools (rljax.agent.tools.registry); null: none
    environment: EnvironmentConfig | None = None  # an environment instead of tools; null: tools
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra template variables (enable_thinking)
    chat_template: str | None = None  # a Jinja chat template overriding the tokenizer's
    end_of_turn_token: str | None = None  # string closing an assistant turn; null: the tokenizer's eos_token
    extra_turn_end_tokens: tuple[str, ...] = ()  # other tokens that also close a turn (<|eom_id|>)
    max_concurrent_episodes: int | None = None  # episodes in flight in `run_episodes`; null: all

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
