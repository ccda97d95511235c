"""Token-in-token-out chat rendering and the assistant loss mask."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rljax.data.chat import ChatRenderer, normalize_messages, normalize_tools
from rljax.data.errors import FormatError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expr": {"type": "string"}},
                "required": ["expr"],
            },
        },
    }
]


def _call(expr: str, as_string: bool = False) -> dict:
    args = {"expr": expr}
    return {
        "type": "function",
        "function": {"name": "calc", "arguments": json.dumps(args) if as_string else args},
    }


def tool_conversation(as_string: bool = False) -> list[dict]:
    return [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 2+3 and 4*5?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("2+3", as_string), _call("4*5", as_string)],
        },
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "20"},
        {"role": "assistant", "content": "2+3=5 and 4*5=20."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."},
    ]


EXPECTED_TOOL_SPANS = [
    '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "calc", "arguments": {"expr": "4*5"}}\n</tool_call><|im_end|>',
    "2+3=5 and 4*5=20.<|im_end|>",
    "You are welcome.<|im_end|>",
]


def full_ids(tok, messages, tools=None, **kw) -> list[int]:
    out = tok.apply_chat_template(messages, tools=tools, tokenize=True, **kw)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def spans(ids, mask):
    """[(start, end)] of the runs of mask == 1."""
    runs, start = [], None
    for t, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


def check_rendering(tok, messages, tools, expected_spans, **kw):
    renderer = ChatRenderer(tok, kw)
    msgs = normalize_messages(messages, require_assistant=True)
    tools = normalize_tools(tools)
    r = renderer.render_conversation(msgs, tools=tools)
    # Prefix-by-prefix tokens equal the full rendering.
    assert r.input_ids == full_ids(tok, msgs, tools=tools, **kw)
    assert len(r.loss_mask) == len(r.input_ids)
    runs = spans(r.input_ids, r.loss_mask)
    assert [tok.decode(r.input_ids[a:b]) for a, b in runs] == expected_spans
    gen_prompt = tok.decode(renderer.encode([{"role": "user", "content": "x"}], add_generation_prompt=True))
    gen_prompt = gen_prompt[gen_prompt.rindex("<|im_start|>"):]
    for a, b in runs:
        # the generation prompt right before a span is excluded ...
        assert tok.decode(r.input_ids[:a]).endswith(gen_prompt)
        # ... and every trained span ends with the end-of-turn token.
        assert r.input_ids[b - 1] == tok.convert_tokens_to_ids("<|im_end|>")
    return r


def test_tool_conversation_masks(any_tok):
    check_rendering(any_tok, tool_conversation(), TOOLS, EXPECTED_TOOL_SPANS)


def test_string_tool_arguments_are_parsed(any_tok):
    a = check_rendering(any_tok, tool_conversation(as_string=True), TOOLS, EXPECTED_TOOL_SPANS)
    b = check_rendering(any_tok, tool_conversation(), json.dumps(TOOLS), EXPECTED_TOOL_SPANS)
    assert a.input_ids == b.input_ids


def test_multi_turn_without_tools(any_tok):
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "bye"},  # trailing user turn: rendered, not trained
    ]
    r = check_rendering(any_tok, msgs, None, ["hello<|im_end|>", "4<|im_end|>"])
    assert r.response_start > 0


def test_generation_prompt_and_glue_are_not_trained(char_tok):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    r = ChatRenderer(char_tok).render_conversation(normalize_messages(msgs))
    text = [char_tok.decode([t]) for t in r.input_ids]
    assert "".join(text) == "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
    trained = [t for t, m in zip(text, r.loss_mask) if m]
    assert trained == ["b", "<|im_end|>"]
    assert r.loss_mask[-1] == 0  # the "\n" after <|im_end|> is template glue


def test_train_from_skips_prompt_assistant_turns(char_tok):
    msgs = normalize_messages([
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ])
    r = ChatRenderer(char_tok).render_conversation(msgs, train_from=3)
    runs = spans(r.input_ids, r.loss_mask)
    assert [char_tok.decode(r.input_ids[a:b]) for a, b in runs] == ["a2<|im_end|>"]
    assert r.response_start == runs[0][0]


def test_assistant_first_is_an_error(char_tok):
    msgs = normalize_messages([{"role": "assistant", "content": "x"}])
    with pytest.raises(FormatError, match="starts with an assistant"):
        ChatRenderer(char_tok).render_conversation(msgs)


def test_template_exception_is_a_format_error(char_tok):
    msgs = normalize_messages([
        {"role": "user", "content": "x"},
        {"role": "system", "content": "late system"},
        {"role": "assistant", "content": "y"},
    ])
    with pytest.raises(FormatError, match="cannot render.*system message may only be the first"):
        ChatRenderer(char_tok).render_conversation(msgs)


# ---- Qwen3: a template that is not prefix-stable -------------------------------------


def test_qwen3_single_turn_is_fine(qwen3_tok):
    msgs = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    # Qwen3 renders the final assistant turn with an (empty) think block: trained on.
    check_rendering(qwen3_tok, msgs, None, ["<think>\n\n</think>\n\n4<|im_end|>"])


def test_qwen3_multi_turn_raises_not_prefix_stable(qwen3_tok):
    msgs = normalize_messages([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>greet</think>hello"},
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
    ])
    with pytest.raises(FormatError, match=r"not prefix-stable: rendering messages\[:3\]"):
        ChatRenderer(qwen3_tok).render_conversation(msgs)


# ---- message validation --------------------------------------------------------------


@pytest.mark.parametrize(
    "messages, key, match",
    [
        ("hi", None, "expected a list of messages"),
        ([], None, "empty list"),
        (["hi"], "[0]", "must be an object"),
        ([{"content": "x"}], "[0].role", "missing key 'role'"),
        ([{"role": 3, "content": "x"}], "[0].role", "role must be a string"),
        ([{"role": "robot", "content": "x"}], "[0].role", "unknown role"),
        ([{"role": "user"}], "[0].content", "missing key 'content'"),
        ([{"role": "user", "content": None}], "[0].content", "content is null"),
        ([{"role": "user", "content": [{"type": "text"}]}], "[0].content", "multimodal"),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": {}}],
            "[1].tool_calls", "must be a list",
        ),
        (
            [{"role": "user", "content": "x"},
             {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}],
            "[1].tool_calls[0].function.name", "needs a string 'name'",
        ),
        ([{"role": "user", "content": "x"}], None, "no assistant message"),
    ],
)
def test_normalize_messages_errors(messages, key, match):
    with pytest.raises(FormatError, match=match) as e:
        normalize_messages(messages, require_assistant=True)
    assert e.value.key == key


def test_normalize_drops_nones_and_fills_tool_call_content():
    out = normalize_messages([
        {"role": "user", "content": "x", "tool_calls": None, "name": None},
        {"role": "assistant", "content": None, "tool_calls": [_call("1")]},
    ])
    assert out[0] == {"role": "user", "content": "x"}
    assert out[1]["content"] == ""


def test_normalize_tools():
    assert normalize_tools(None) is None
    assert normalize_tools("") is None
    assert normalize_tools(json.dumps(TOOLS)) == TOOLS
    with pytest.raises(FormatError, match="not valid JSON"):
        normalize_tools("[{")
    with pytest.raises(FormatError, match="must be a list"):
        normalize_tools({"a": 1})


# ---- property test on the char tokenizer ---------------------------------------------

_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " .,!?+-*=\n", min_size=0, max_size=12)


@st.composite
def conversations(draw):
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(_TEXT)})
    expected = []
    for _ in range(draw(st.integers(1, 3))):
        msgs.append({"role": "user", "content": draw(_TEXT)})
        if draw(st.booleans()):
            expr = draw(_TEXT)
            msgs.append({"role": "assistant", "content": "", "tool_calls": [_call(expr)]})
            expected.append(
                '<tool_call>\n{"name": "calc", "arguments": ' + json.dumps({"expr": expr})
                + "}\n</tool_call><|im_end|>"
            )
            msgs.append({"role": "tool", "content": draw(_TEXT)})
        content = draw(_TEXT)
        msgs.append({"role": "assistant", "content": content})
        expected.append(content + "<|im_end|>")
    return msgs, expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversations())
def test_char_masks_property(char_tok, conv):
    msgs, expected = conv
    check_rendering(char_tok, msgs, TOOLS, expected)
