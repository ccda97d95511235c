"""Chat messages -> tokens, token-in-token-out, with an assistant-token loss mask.

Conventions
-----------
* Messages are OpenAI-style dicts: ``role`` in system / user / assistant / tool, ``content``
  a string (None or missing only for an assistant message with ``tool_calls``). An
  assistant's ``tool_calls`` are ``{"type": "function", "function": {"name", "arguments"}}``;
  ``arguments`` given as a JSON string is parsed into a dict (as verl does), because some
  templates (Qwen2.5) would otherwise JSON-encode the string a second time. ``tools`` is a
  list of OpenAI function schemas (or a JSON string of one) passed to
  ``apply_chat_template(tools=...)``. Keys whose value is None are dropped (Parquet fills
  absent struct fields with None; templates test ``is defined``).
* `render_conversation` builds the token buffer the way an agent loop would: it renders
  the conversation only at assistant-turn boundaries and appends token *deltas*:

      for each assistant message i:
          A = tokens(messages[:i], add_generation_prompt=True)    # prompt for turn i
          B = tokens(messages[:i + 1])                             # turn i rendered
          buffer += A[len(buffer):]   (mask 0: context, tool output, generation prompt)
          buffer += B[len(A):]        (mask 1 up to and including the end-of-turn token,
                                       0 for template glue after it, e.g. Qwen's "\\n")
      then the rest of the conversation (mask 0) if it does not end with an assistant.

  Before each append it checks that the tokens already in the buffer are a prefix of the
  new rendering. For a prefix-stable template (Qwen2.5, our ChatML char tokenizer) the
  buffer therefore equals ``apply_chat_template(messages, tokenize=True)``. A template that
  rewrites earlier turns when the conversation grows (Qwen3 drops the ``<think>`` block of
  earlier assistant turns) raises `FormatError` naming the message and the first token
  that changed: such conversations cannot be trained token-in-token-out as one sequence.
  Single-turn conversations (one assistant message at the end) are always fine.
* Tokens of the generation prompt (``<|im_start|>assistant\\n``) are never trained on; the
  end-of-turn token (``<|im_end|>``) of a trained assistant turn is.
* Only assistant messages with index >= `train_from` are trained on (preference data
  trains on the response, not on assistant turns inside the prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rljax.data.errors import FormatError

ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})

# End-of-turn tokens of common chat formats; those present in a vocabulary (plus its
# eos token) end an assistant turn.
KNOWN_END_OF_TURN_TOKENS: tuple[str, ...] = (
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<|eom_id|>",
)


def drop_none(value: Any) -> Any:
    """Recursively drop dict entries whose value is None."""
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_none(v) for v in value]
    return value


def _normalize_tool_call(call: Any, key: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise FormatError(f"a tool call must be an object, got {type(call).__name__}", key)
    call = {k: v for k, v in call.items() if v is not None}
    fn = call.get("function", call)
    if not isinstance(fn, dict):
        raise FormatError("'function' of a tool call must be an object", key + ".function")
    fn_key = key + (".function" if "function" in call else "")
    if not isinstance(fn.get("name"), str):
        raise FormatError("a tool call needs a string 'name'", fn_key + ".name")
    fn = {k: v for k, v in fn.items() if v is not None}
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            args = parsed
    fn["arguments"] = args
    if "function" in call:
        return {**call, "function": fn}
    return fn


def normalize_messages(messages: Any, *, require_assistant: bool = False) -> list[dict[str, Any]]:
    """Validate a list of chat messages and return a cleaned copy.

    Raises `FormatError` (key relative to the list, e.g. ``"[2].content"``) for: not a list,
    an empty list, a message that is not an object, a missing / non-string / unknown
    role, content that is not a string (multimodal content lists are not supported),
    malformed tool calls, and — with `require_assistant` — no assistant message.
    """
    if not isinstance(messages, list):
        raise FormatError(f"expected a list of messages, got {type(messages).__name__}")
    if not messages:
        raise FormatError("empty list of messages")
    out: list[dict[str, Any]] = []
    for j, msg in enumerate(messages):
        key = f"[{j}]"
        if not isinstance(msg, dict):
            raise FormatError(f"a message must be an object, got {type(msg).__name__}", key)
        role = msg.get("role")
        if role is None:
            raise FormatError("missing key 'role'", key + ".role")
        if not isinstance(role, str):
            raise FormatError(f"role must be a string, got {type(role).__name__}", key + ".role")
        if role not in ROLES:
            raise FormatError(
                f"unknown role {role!r} (expected one of {sorted(ROLES)})", key + ".role"
            )
        clean = {k: v for k, v in msg.items() if v is not None}
        tool_calls = clean.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant":
                raise FormatError("only assistant messages may have tool_calls", key + ".tool_calls")
            if not isinstance(tool_calls, list):
                raise FormatError("tool_calls must be a list", key + ".tool_calls")
            clean["tool_calls"] = [
                _normalize_tool_call(c, f"{key}.tool_calls[{k}]") for k, c in enumerate(tool_calls)
            ]
            if not clean["tool_calls"]:
                del clean["tool_calls"]
        content = msg.get("content")
        if content is None:
            if role == "assistant" and clean.get("tool_calls"):
                clean["content"] = ""
            elif "content" in msg:
                raise FormatError("content is null", key + ".content")
            else:
                raise FormatError("missing key 'content'", key + ".content")
        elif not isinstance(content, str):
            raise FormatError(
                f"content must be a string, got {type(content).__name__} "
                "(multimodal content lists are not supported)",
                key + ".content",
            )
        out.append(clean)
    if require_assistant and not any(m["role"] == "assistant" for m in out):
        raise FormatError("no assistant message to train on")
    return out


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Validate a tools column: None, a list of function schemas, or a JSON string of one.

    Returns None for no tools. Raises `FormatError` otherwise.
    """
    if tools is None:
        return None
    if isinstance(tools, str):
        if not tools.strip():
            return None
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise FormatError(f"tools is a string but not valid JSON: {e}") from None
    if not isinstance(tools, list):
        raise FormatError(f"tools must be a list of function schemas, got {type(tools).__name__}")
    for k, t in enumerate(tools):
        if not isinstance(t, dict):
            raise FormatError(f"a tool schema must be an object, got {type(t).__name__}", f"[{k}]")
    tools = drop_none(tools)
    return tools or None


def end_of_turn_ids(tokenizer: Any) -> frozenset[int]:
    """Ids that end an assistant turn: the eos token and known end-of-turn tokens."""
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in KNOWN_END_OF_TURN_TOKENS if t in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


@dataclass(frozen=True)
class RenderedConversation:
    """Token buffer of a conversation.

    `loss_mask[t]` is 1 when `input_ids[t]` is a trained assistant token (content, tool
    calls and the end-of-turn token), else 0. `response_start` is the buffer length just
    before the first trained assistant turn's content, i.e. after its generation prompt
    (the length of the "prompt" in preference data); -1 if no turn is trained.
    """

    input_ids: list[int]
    loss_mask: list[int]
    response_start: int


class ChatRenderer:
    """Renders messages with a tokenizer's chat template (token-in-token-out).

    `chat_template_kwargs` are passed to every ``apply_chat_template`` call (e.g.
    ``{"enable_thinking": False}``). `eot_ids` overrides `end_of_turn_ids(tokenizer)`.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        eot_ids: Sequence[int] | None = None,
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.eot_ids = frozenset(eot_ids) if eot_ids is not None else end_of_turn_ids(tokenizer)

    def render_text(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for `messages`; a template failure is a `FormatError`."""
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.kwargs,
            )
        except Exception as e:  # jinja2.TemplateError, TypeError, ValueError, ...
            raise FormatError(
                f"the chat template cannot render messages[:{len(messages)}] "
                f"(roles {[m.get('role') for m in messages]}): {type(e).__name__}: {e}"
            ) from e
        if not isinstance(text, str):
            raise FormatError(f"the chat template returned {type(text).__name__}, not a string")
        return text

    def encode(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """Token ids of the rendered text (no extra special tokens added)."""
        text = self.render_text(messages, tools=tools, add_generation_prompt=add_generation_prompt)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_prompt(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Prompt tokens for generation: the template with ``add_generation_prompt=True``."""
        return self.encode(messages, tools=tools, add_generation_prompt=True)

    def _append(
        self,
        buffer: list[int],
        mask: list[int],
        tokens: list[int],
        new_mask: Sequence[int] | int,
        upto: int,
        prev: int,
    ) -> None:
        """Append `tokens[len(buffer):]` after checking `buffer` is a prefix of `tokens`."""
        n = len(buffer)
        if tokens[:n] != buffer:
            pos = next(
                (k for k in range(min(n, len(tokens))) if tokens[k] != buffer[k]), min(n, len(tokens))
            )
            old = self.tokenizer.decode(buffer[max(0, pos - 8) : pos + 8])
            new = self.tokenizer.decode(tokens[max(0, pos - 8) : pos + 8])
            raise FormatError(
                f"the chat template is not prefix-stable: rendering messages[:{upto}] changes "
                f"tokens already rendered for messages[:{prev}] at token {pos} "
                f"(before: {old!r}, after: {new!r}). Templates that rewrite earlier turns "
                "(e.g. Qwen3 drops the <think> block of earlier assistant turns) cannot be "
                "trained token-in-token-out on multi-turn conversations; use single-turn "
                "rows or a prefix-stable template."
            )
        delta = tokens[n:]
        buffer.extend(delta)
        if isinstance(new_mask, int):
            mask.extend([new_mask] * len(delta))
        else:
            mask.extend(new_mask)

    def _assistant_mask(self, delta: list[int]) -> list[int]:
        """1 up to and including the last end-of-turn token of `delta`, 0 after it."""
        last = max((k for k, t in enumerate(delta) if t in self.eot_ids), default=len(delta) - 1)
        return [1] * (last + 1) + [0] * (len(delta) - last - 1)

    def render_conversation(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        train_from: int = 0,
    ) -> RenderedConversation:
        """Token buffer and assistant loss mask of `messages` (see the module docstring).

        `messages` must already be normalized (`normalize_messages`). Raises `FormatError`
        for an assistant first message (there is no prompt to render) and for templates
        that are not prefix-stable on this conversation.
        """
        buffer: list[int] = []
        mask: list[int] = []
        response_start = -1
        prev = 0
        for i, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            if i == 0:
                raise FormatError(
                    "the conversation starts with an assistant message; an assistant turn "
                    "needs a preceding system/user message", "[0].role"
                )
            prompt = self.encode(messages[:i], tools=tools, add_generation_prompt=True)
            self._append(buffer, mask, prompt, 0, upto=i, prev=prev)
            turn = self.encode(messages[: i + 1], tools=tools)
            n = len(buffer)
            if turn[:n] != buffer:
                self._append(buffer, mask, turn, 0, upto=i + 1, prev=i)  # raises
            delta = turn[n:]
            trained = i >= train_from
            if trained and response_start < 0:
                response_start = n
            self._append(
                buffer, mask, turn,
                self._assistant_mask(delta) if trained else [0] * len(delta),
                upto=i + 1, prev=i,
            )
            prev = i + 1
        if prev < len(messages):
            full = self.encode(messages, tools=tools)
            self._append(buffer, mask, full, 0, upto=len(messages), prev=prev)
        return RenderedConversation(buffer, mask, response_start)
