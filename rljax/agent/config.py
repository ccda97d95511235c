"""Typed configuration of the agent loop (the RL config's `agent:` section).

Loaded by `rljax.config` like every section (`load_config` for a run config,
`load_section(AgentConfig, mapping, "agent")` for the section alone): an unknown key, a
value of the wrong type or out of range is a one-line `ConfigError` naming the dotted key
(`agent.max_turns`). Configs are frozen, and checked at construction too (code builds
them for `AgentLoop`): no component mutates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from rljax.config import Bounds, PositiveFloat, Repeats, Rows, Threads, Tokens, check_config


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
    max_turns: Repeats = 8  # assistant turns (generations) per episode at most (verl: max_assistant_turns)
    max_response_tokens: Tokens = 4096  # tokens after the prompt (sampled + observations); RL: <= rollout.response_length
    max_tokens_per_turn: Tokens | None = None  # tokens of one generation at most; null: the remaining budget
    max_parallel_tool_calls: Threads = 4  # tool calls of one turn run concurrently (verl: max_parallel_calls)
    max_concurrent_tool_calls: Annotated[int, Bounds(ge=1, le=65536)] | None = None  # tool calls in flight across all episodes; null: no cap
    tool_timeout_s: PositiveFloat = 30.0  # seconds one tool call may take (then a `timeout` error observation)
    overflow: Literal["truncate", "end"] = "truncate"  # an observation over the budget: cut it | end the episode
    min_turn_tokens: Tokens = 16  # tokens kept free for the next generation when fitting an observation
    tool_config_path: str | None = None  # YAML declaring the tools (rljax.agent.tools.registry); null: none
    environment: EnvironmentConfig | None = None  # an environment instead of tools; null: tools
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra template variables (enable_thinking)
    chat_template: str | None = None  # a Jinja chat template overriding the tokenizer's
    end_of_turn_token: str | None = None  # string closing an assistant turn; null: the tokenizer's eos_token
    extra_turn_end_tokens: tuple[str, ...] = ()  # other tokens that also close a turn (<|eom_id|>)
    max_concurrent_episodes: Rows | None = None  # episodes in flight in `run_episodes`; null: all

    def __post_init__(self) -> None:
        check_config(self)
