"""Chat-template rendering for the agent loop: the initial prompt and observation deltas.

The agent loop never re-renders a conversation into its token buffer. It renders only

1. the initial prompt (`prompt_ids`), once per episode, and
2. for every tool or user turn, the *delta*: the tokens that the chat template puts after an
   assistant turn's end-of-turn token, up to and including the next assistant generation
   prompt.

Delta convention (exact; tested at every boundary)
--------------------------------------------------
A fixed dummy conversation ``[system, user, assistant(MARKER)]`` is extended with the new
messages and rendered with ``add_generation_prompt=True``. In the rendered text we find the
dummy assistant's content MARKER and the first end-of-turn string after it (``<|im_end|>`` for
Qwen, ``<|eot_id|>`` for Llama 3; by default the special token the template writes right after
assistant content, else the tokenizer's ``eos_token``). The delta is the
text *after* that end-of-turn string, tokenized on its own. For Qwen that is::

    "\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n"

i.e. it starts with the ``"\\n"`` that the template writes after ``<|im_end|>``. The buffer
already ends with the sampled ``<|im_end|>`` (samplers return the stop token; see
`protocol.py`), so buffer + delta equals what the template would render for that boundary.
If a sampled turn ended without the end-of-turn token (the model stopped on another stop token)
the loop appends the end-of-turn id itself, masked 0, before the delta.

Rendering the suffix together with a dummy prefix and then cutting it at the end-of-turn
*string* (rather than rendering the new messages alone) keeps everything a template writes
between turns, and is immune to templates that render the previous assistant turn differently
once more messages follow it (Qwen3 drops or adds ``<think>`` blocks): the cut is taken inside a
single rendering. Two invariants are checked on every call and raise `ChatTemplateError` if a
template breaks them: the dummy assistant content must be followed directly by the end-of-turn
string, and ``encode(eot + delta) == [eot_id] + encode(delta)`` (the end-of-turn token is a
special token that tokenization never merges across), which is what makes "tokenize the delta
alone and append" equal to "tokenize the whole rendering".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_MARKER = "rljax-dummy-assistant-turn-7f3c1"
_DUMMY_PREFIX: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "rljax dummy system prompt"},
    {"role": "user", "content": "rljax dummy user turn"},
    {"role": "assistant", "content": _MARKER},
)
TRUNCATION_NOTE = "\n...[truncated]"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template breaks an assumption of the delta convention."""


class ChatFormatter:
    """Renders prompts and observation deltas for one tokenizer + chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: OpenAI function schemas passed to the template (``tools=``) for the prompt and
            the deltas; ``None`` when the episode has no tools.
        chat_template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``).
        end_of_turn_token: the string that closes an assistant turn; default: the special token
            the template writes right after assistant content (else ``eos_token``).
        extra_turn_end_tokens: other tokens that also close a turn when sampled (e.g. Llama 3's
            ``<|eom_id|>``); a turn ending with one of them gets no extra end-of-turn token.
        chat_template: a Jinja template overriding the tokenizer's own.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[dict] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        end_of_turn_token: str | None = None,
        extra_turn_end_tokens: Sequence[str] = (),
        chat_template: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.tools = list(tools) if tools else None
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        eot = end_of_turn_token or self._detect_end_of_turn()
        if not eot:
            raise ChatTemplateError(
                "cannot tell which token ends an assistant turn; set end_of_turn_token"
            )
        self.end_of_turn_token: str = eot
        self.end_of_turn_id: int = self._single_id(eot)
        self.turn_end_ids: frozenset[int] = frozenset(
            [self.end_of_turn_id, *(self._single_id(t) for t in extra_turn_end_tokens)]
        )

    # -- tokenization helpers -------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Tokenize text with no added BOS/EOS (templates write their own special tokens)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids keeping special tokens (used for parsing and logging only)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _single_id(self, token: str) -> int:
        ids = self.encode(token)
        if len(ids) != 1:
            raise ChatTemplateError(f"{token!r} must be a single token, tokenizes to {ids}")
        return ids[0]

    def _detect_end_of_turn(self) -> str | None:
        """The special/added token the template writes right after assistant content.

        Falls back to ``eos_token``. (Qwen base tokenizers have ``eos_token`` =
        ``<|endoftext|>`` while their template closes turns with ``<|im_end|>``.)
        """
        try:
            text = self._render(_DUMMY_PREFIX, add_generation_prompt=False)
        except Exception:  # noqa: BLE001 - a template that cannot render the dummy: fall back
            text = ""
        pos = text.find(_MARKER)
        if pos >= 0:
            after = text[pos + len(_MARKER):]
            specials = set(getattr(self.tokenizer, "all_special_tokens", []) or [])
            get_added = getattr(self.tokenizer, "get_added_vocab", None)
            if callable(get_added):
                specials.update(get_added())
            for tok in sorted((t for t in specials if t), key=len, reverse=True):
                if after.startswith(tok):
                    return tok
        return getattr(self.tokenizer, "eos_token", None)

    def _render(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **({"chat_template": self.chat_template} if self.chat_template else {}),
            **self.chat_template_kwargs,
        )

    # -- public API ---------------------------------------------------------------------
    def prompt_ids(self, messages: Sequence[dict]) -> list[int]:
        """The initial prompt: messages rendered with the generation prompt, tokenized once."""
        return self.encode(self._render(messages, add_generation_prompt=True))

    def observation_text(self, messages: Sequence[dict]) -> str:
        """The delta text after an assistant end-of-turn token (see module docstring)."""
        if not messages:
            raise ValueError("an observation needs at least one message")
        text = self._render([*_DUMMY_PREFIX, *messages], add_generation_prompt=True)
        start = text.find(_MARKER)
        if start < 0:
            raise ChatTemplateError("the chat template dropped the assistant content of the dummy turn")
        after = start + len(_MARKER)
        cut = text.find(self.end_of_turn_token, after)
        if cut < 0:
            raise ChatTemplateError(
                f"no end-of-turn {self.end_of_turn_token!r} after the dummy assistant turn"
            )
        if text[after:cut]:
            raise ChatTemplateError(
                "the chat template writes text between assistant content and end-of-turn "
                f"({text[after:cut]!r}); sampled turns would not match the template"
            )
        return text[cut + len(self.end_of_turn_token):]

    def observation_ids(self, messages: Sequence[dict]) -> list[int]:
        """Delta tokens for tool/user messages, to append after a closed assistant turn."""
        delta_text = self.observation_text(messages)
        ids = self.encode(delta_text)
        joined = self.encode(self.end_of_turn_token + delta_text)
        if joined != [self.end_of_turn_id, *ids]:
            raise ChatTemplateError(
                "tokenization merges across the end-of-turn token; the delta cannot be "
                "tokenized on its own"
            )
        return ids

    def fit_observation(self, messages: Sequence[dict], budget: int) -> tuple[list[int], bool] | None:
        """Observation tokens that fit in `budget` tokens, truncating message contents in tokens.

        Returns ``(ids, truncated)``, or ``None`` when even the template framing with empty
        contents does not fit. Truncation keeps the first tokens of each over-long content
        (largest contents are cut first, to a common cap) and appends `TRUNCATION_NOTE`. The
        truncated contents are tool/user text, never model output, so decoding the kept prefix
        and rendering it again is fine; the framing (end of turn, next generation prompt) is
        always intact.
        """
        ids = self.observation_ids(messages)
        if len(ids) <= budget:
            return ids, False
        contents = [m.get("content") for m in messages]
        if not all(isinstance(c, str) for c in contents):
            return None
        empty = [{**m, "content": TRUNCATION_NOTE} for m in messages]
        if len(self.observation_ids(empty)) > budget:
            return None
        tokens = [self.encode(c) for c in contents]
        caps = [len(t) for t in tokens]
        for _ in range(8):
            excess = len(ids) - budget
            if excess <= 0:
                return ids, True
            caps = _lower_caps(caps, excess)
            trimmed = [
                {**m, "content": c if cap >= len(t) else self.decode(t[:cap]) + TRUNCATION_NOTE}
                for m, c, t, cap in zip(messages, contents, tokens, caps)
            ]
            ids = self.observation_ids(trimmed)
        if len(ids) <= budget:
            return ids, True
        ids = self.observation_ids(empty)
        return (ids, True) if len(ids) <= budget else None


def _lower_caps(caps: list[int], excess: int) -> list[int]:
    """Water-filling: lower the largest caps to a common level so they shrink by >= excess."""
    total = sum(caps)
    target = max(total - excess, 0)
    lo, hi = 0, max(caps)
    while lo < hi:  # largest level whose capped sum fits the target
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in caps) <= target:
            lo = mid
        else:
            hi = mid - 1
    return [min(c, lo) for c in caps]
