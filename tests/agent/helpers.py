"""Shared helpers for the agent tests: running coroutines, tokenizing, test tools."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rljax.agent.tools.base import Tool, ToolResult


def run(coro):
    """Run a coroutine to completion in a fresh event loop (no pytest-asyncio needed)."""
    return asyncio.run(coro)


def enc(tok, text: str) -> list[int]:
    """Tokenize without added special tokens, as the agent loop does."""
    return list(tok.encode(text, add_special_tokens=False))


def hermes_call(name: str, arguments: Any) -> str:
    """The text of one Hermes/Qwen tool call, formatted like the Qwen templates render it."""
    import json

    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(arguments) + "}\n</tool_call>"


def fn_schema(name: str, properties: dict | None = None, required: list | None = None) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"test tool {name}",
            "parameters": {"type": "object", "properties": properties or {}, "required": required or []},
        },
    }


class EchoTool(Tool):
    """Returns its ``text`` argument (or a fixed text), counting state lifecycle calls."""

    def __init__(self, schema: dict | None = None, reply: str | None = None, reward_value: float | None = None):
        super().__init__(schema or fn_schema("echo", {"text": {"type": "string"}}, ["text"]))
        self.reply = reply
        self.reward_value = reward_value
        self.created = 0
        self.released: list[Any] = []

    def create_state(self) -> dict:
        self.created += 1
        return {"calls": 0}

    async def call(self, arguments: dict, state: dict) -> ToolResult:
        state["calls"] += 1
        return ToolResult(self.reply if self.reply is not None else arguments["text"])

    def reward(self, state: dict) -> float | None:
        return None if self.reward_value is None else self.reward_value * state["calls"]

    async def release(self, state: dict) -> None:
        self.released.append(state)


class SleepTool(Tool):
    """Sleeps ``seconds`` and records ``(event, tag, time)`` start/end events."""

    def __init__(self, schema: dict | None = None):
        super().__init__(schema or fn_schema("sleep", {"seconds": {"type": "number"}, "tag": {"type": "string"}},
                                             ["seconds"]))
        self.events: list[tuple[str, str, float]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.cancelled = 0

    async def call(self, arguments: dict, state: Any) -> str:
        tag = str(arguments.get("tag", ""))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.events.append(("start", tag, time.perf_counter()))
        try:
            await asyncio.sleep(float(arguments["seconds"]))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
            self.events.append(("end", tag, time.perf_counter()))
        return f"slept {arguments['seconds']}"


class RaisingTool(Tool):
    """Always raises."""

    def __init__(self, schema: dict | None = None):
        super().__init__(schema or fn_schema("boom"))

    async def call(self, arguments: dict, state: Any) -> str:
        raise RuntimeError("kaboom")
