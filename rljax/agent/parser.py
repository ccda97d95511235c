"""Tool-call parsers: decoded assistant text -> tool calls, in a registry keyed by name.

Parsing works on the *decoded text* of one sampled assistant turn (with its final stop token
removed). Decoding for parsing is fine; the trajectory never re-encodes that text.

Built-in formats:

- ``hermes`` (alias ``qwen``): zero or more
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks anywhere in the turn
  (Qwen2.5 / Qwen3 / Hermes templates). ``arguments`` may also be a JSON-encoded string.
- ``llama3_json`` (alias ``llama3``): the whole message is one JSON object
  ``{"name": ..., "parameters": {...}}`` (``arguments`` accepted too), optionally after
  ``<|python_tag|>``. A message that starts with ``{`` but has no ``"name"`` key is a plain
  answer, not a call; a message after ``<|python_tag|>`` or mentioning ``"name"`` that is not
  such an object is a malformed call.

A call that cannot be parsed becomes a `ToolCall` with ``error`` set (kind ``malformed``): the
loop answers it with an error observation instead of raising. Register another format with
``@register_tool_parser("name")`` on a `ToolCallParser` subclass.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar


@dataclass
class ToolCall:
    """One parsed call. ``error`` is set (and name/arguments may be None) when malformed."""

    name: str | None
    arguments: dict[str, Any] | None
    raw: str
    error: str | None = None

    @property
    def malformed(self) -> bool:
        return self.error is not None


@dataclass
class ParsedTurn:
    """The text outside tool calls (``content``) and the calls, in order of appearance."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)


class ToolCallParser(ABC):
    """Turns the decoded text of one assistant turn into a `ParsedTurn`."""

    name: str = ""

    @abstractmethod
    def parse(self, text: str) -> ParsedTurn: ...


P = TypeVar("P", bound=type[ToolCallParser])
TOOL_PARSERS: dict[str, type[ToolCallParser]] = {}


def register_tool_parser(*names: str) -> Callable[[P], P]:
    """Class decorator: register a parser class under one or more names."""

    def deco(cls: P) -> P:
        for n in names:
            if n in TOOL_PARSERS and TOOL_PARSERS[n] is not cls:
                raise ValueError(f"tool parser {n!r} is already registered")
            TOOL_PARSERS[n] = cls
        if not cls.name:
            cls.name = names[0]
        return cls

    return deco


def get_tool_parser(name: str, **options: Any) -> ToolCallParser:
    """Instantiate the parser registered as `name`; `ValueError` listing valid names."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool parser {name!r}; valid: {sorted(TOOL_PARSERS)}")
    return TOOL_PARSERS[name](**options)


def _call_from_obj(obj: Any, raw: str, args_keys: tuple[str, ...]) -> ToolCall:
    """Validate the decoded JSON of one call: an object with a string name and object args."""
    if not isinstance(obj, dict):
        return ToolCall(None, None, raw, f"tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, None, raw, 'tool call has no string "name"')
    args: Any = {}
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models emit arguments as a JSON-encoded string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name, None, raw, f"arguments string is not valid JSON: {e.msg}")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name, None, raw, f"arguments must be a JSON object, got {type(args).__name__}")
    return ToolCall(name, args, raw)


@register_tool_parser("hermes", "qwen")
class HermesToolParser(ToolCallParser):
    """``<tool_call>{json}</tool_call>`` blocks (several per turn allowed)."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self) -> None:
        self._block = re.compile(re.escape(self.open_tag) + r"(.*?)" + re.escape(self.close_tag), re.S)

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        pieces: list[str] = []
        pos = 0
        for m in self._block.finditer(text):
            pieces.append(text[pos:m.start()])
            pos = m.end()
            body = m.group(1).strip()
            try:
                obj = json.loads(body)
            except json.JSONDecodeError as e:
                calls.append(ToolCall(None, None, m.group(0), f"invalid JSON in tool call: {e.msg}"))
                continue
            calls.append(_call_from_obj(obj, m.group(0), ("arguments", "parameters")))
        rest = text[pos:]
        dangling = rest.find(self.open_tag)
        if dangling >= 0:
            pieces.append(rest[:dangling])
            calls.append(ToolCall(None, None, rest[dangling:], f"unterminated {self.open_tag}"))
        else:
            pieces.append(rest)
        return ParsedTurn("".join(pieces).strip(), calls)


@register_tool_parser("llama3_json", "llama3")
class Llama3JsonToolParser(ToolCallParser):
    """The whole message is ``{"name": ..., "parameters": {...}}``, maybe after python_tag."""

    python_tag = "<|python_tag|>"

    def parse(self, text: str) -> ParsedTurn:
        s = text.strip()
        tagged = s.startswith(self.python_tag)
        if tagged:
            s = s[len(self.python_tag):].strip()
        elif not s.startswith("{"):
            return ParsedTurn(text.strip())
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as e:
            if tagged or '"name"' in s:
                return ParsedTurn("", [ToolCall(None, None, s, f"invalid JSON in tool call: {e.msg}")])
            return ParsedTurn(text.strip())
        if not tagged and not (isinstance(obj, dict) and "name" in obj):
            return ParsedTurn(text.strip())  # a JSON answer, not a call
        return ParsedTurn("", [_call_from_obj(obj, s, ("parameters", "arguments"))])
