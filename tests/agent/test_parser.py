"""Tool-call parsers: Hermes/Qwen and Llama 3 JSON, malformed input, the registry."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.agent.parser import (
    TOOL_PARSERS,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    get_tool_parser,
    register_tool_parser,
)

from .helpers import hermes_call


def test_hermes_single_and_multiple_calls():
    p = get_tool_parser("hermes")
    out = p.parse("I will compute.\n" + hermes_call("calculator", {"expression": "2+3"}))
    assert out.content == "I will compute."
    assert [(c.name, c.arguments, c.error) for c in out.calls] == [("calculator", {"expression": "2+3"}, None)]

    text = hermes_call("a", {"x": 1}) + "\n" + hermes_call("b", {}) + "\n" + hermes_call("c", {"y": [1, 2]})
    out = get_tool_parser("qwen").parse(text)
    assert [c.name for c in out.calls] == ["a", "b", "c"] and out.content == ""
    assert out.calls[2].arguments == {"y": [1, 2]}


def test_hermes_no_call_and_argument_forms():
    p = get_tool_parser("hermes")
    assert p.parse("The answer is 5.") == ParsedTurn("The answer is 5.", [])
    # arguments as a JSON string, "parameters" alias, missing arguments
    out = p.parse('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
                  '<tool_call>{"name": "g", "parameters": {"b": 2}}</tool_call>'
                  '<tool_call>{"name": "h"}</tool_call>')
    assert [(c.name, c.arguments) for c in out.calls] == [("f", {"a": 1}), ("g", {"b": 2}), ("h", {})]


@pytest.mark.parametrize("body,msg", [
    ("{not json}", "invalid JSON"),
    ('{"arguments": {}}', "no string \"name\""),
    ('["calculator"]', "must be a JSON object"),
    ('{"name": "f", "arguments": [1, 2]}', "arguments must be a JSON object"),
    ('{"name": "f", "arguments": "{oops"}', "arguments string is not valid JSON"),
])
def test_hermes_malformed(body, msg):
    out = get_tool_parser("hermes").parse(f"<tool_call>{body}</tool_call>")
    (call,) = out.calls
    assert call.malformed and msg in call.error


def test_hermes_unterminated_and_mixed():
    text = hermes_call("ok", {}) + "\n<tool_call>\n{\"name\": \"cut\", \"argu"
    out = get_tool_parser("hermes").parse(text)
    assert [c.malformed for c in out.calls] == [False, True]
    assert "unterminated" in out.calls[1].error


def test_llama3_json():
    p = get_tool_parser("llama3_json")
    call = {"name": "get_weather", "parameters": {"city": "Paris"}}
    for text in (json.dumps(call), "<|python_tag|>" + json.dumps(call), "  " + json.dumps(call) + "\n"):
        (c,) = p.parse(text).calls
        assert (c.name, c.arguments, c.error) == ("get_weather", {"city": "Paris"}, None)
    (c,) = p.parse(json.dumps({"name": "f", "arguments": {"a": 1}})).calls
    assert c.arguments == {"a": 1}
    # plain answers and JSON answers that are not calls
    assert p.parse("It is sunny.").calls == []
    assert p.parse('{"answer": 42}').calls == []
    # malformed: after python_tag, or an obvious attempt
    assert p.parse("<|python_tag|>{broken").calls[0].malformed
    assert p.parse('{"name": "f", "parameters": ').calls[0].malformed
    assert p.parse('<|python_tag|>{"parameters": {}}').calls[0].malformed


def test_registry_unknown_and_custom():
    with pytest.raises(ValueError, match="unknown tool parser 'nope'"):
        get_tool_parser("nope")

    @register_tool_parser("test_bang")
    class BangParser(ToolCallParser):
        def parse(self, text):
            if text.startswith("!"):
                return ParsedTurn("", [ToolCall(text[1:], {}, text)])
            return ParsedTurn(text)

    try:
        assert get_tool_parser("test_bang").parse("!ping").calls[0].name == "ping"
        with pytest.raises(ValueError, match="already registered"):
            register_tool_parser("test_bang")(type("Other", (BangParser,), {}))
    finally:
        TOOL_PARSERS.pop("test_bang")


@settings(max_examples=60, deadline=None)
@given(
    name=st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True),
    args=st.dictionaries(st.text(min_size=1, max_size=8),
                         st.one_of(st.integers(), st.text(max_size=10), st.booleans(), st.none()), max_size=4),
    prefix=st.text(max_size=20).filter(lambda s: "<tool_call>" not in s),
)
def test_hermes_roundtrip_property(name, args, prefix):
    out = get_tool_parser("hermes").parse(prefix + hermes_call(name, args))
    (c,) = out.calls
    assert c.name == name and c.arguments == args and not c.malformed
