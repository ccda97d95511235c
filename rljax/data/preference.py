"""Preference rows (``prompt`` / ``chosen`` / ``rejected``) -> one tokenized pair.

* ``prompt``: a string (one user message) or a list of messages (may contain earlier
  assistant turns; those are never trained on).
* ``chosen`` / ``rejected``: a string (one assistant message), one assistant message
  object, or a list of messages (e.g. assistant tool call, tool result, assistant answer).
  Each must contain an assistant message.

Each side is rendered as ``prompt + response`` token-in-token-out (`chat.py`); its loss
mask covers the response's assistant tokens (end-of-turn included, generation prompt
excluded), aligned with the ids. The prompt part is everything before the response's
first assistant content (so it ends with the generation prompt); it is cut to
``max_prompt_length`` by the truncation policy, then the response is cut on the right so
the side fits ``max_length`` (with ``truncation="error"`` both raise instead).

Example: ``{"chosen_input_ids": int32[Lc], "chosen_loss_mask": float32[Lc],
"rejected_input_ids": int32[Lr], "rejected_loss_mask": float32[Lr]}``; a padding row
gives empty arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rljax.data.chat import ChatRenderer, normalize_messages, normalize_tools
from rljax.data.config import DataConfig
from rljax.data.errors import FormatError
from rljax.data.sources import Row
from rljax.data.truncation import truncation_slice

SIDES: tuple[str, ...] = ("chosen", "rejected")


def empty_preference_example() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for side in SIDES:
        out[f"{side}_input_ids"] = np.zeros((0,), np.int32)
        out[f"{side}_loss_mask"] = np.zeros((0,), np.float32)
    return out


def preference_length(example: dict[str, np.ndarray]) -> int:
    """Tokens of the longer side of a preference example (after truncation)."""
    return max(len(example[f"{side}_input_ids"]) for side in SIDES)


def prompt_messages(value: Any) -> list[dict[str, Any]]:
    """A prompt column value as normalized messages (a string is one user message)."""
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    return normalize_messages(value)


def response_messages(value: Any) -> list[dict[str, Any]]:
    """A chosen/rejected value as normalized messages containing an assistant message."""
    if isinstance(value, str):
        value = [{"role": "assistant", "content": value}]
    elif isinstance(value, dict):
        value = [value]
    return normalize_messages(value, require_assistant=True)


class PreferenceTransform:
    """Callable `Row -> example` for the ``preference`` format."""

    def __init__(self, config: DataConfig, tokenizer: Any):
        self.config = config
        self.renderer = ChatRenderer(tokenizer, config.chat_template_kwargs)

    def __call__(self, row: Row) -> dict[str, np.ndarray]:
        if row.padding:
            return empty_preference_example()
        cfg = self.config
        with row.context(cfg.prompt_key):
            prompt = prompt_messages(row.require(cfg.prompt_key))
        tools = None
        if cfg.tools_key in row.data:
            with row.context(cfg.tools_key):
                tools = normalize_tools(row.data[cfg.tools_key])
        out: dict[str, np.ndarray] = {}
        for side, key in zip(SIDES, (cfg.chosen_key, cfg.rejected_key)):
            raw = row.require(key)
            with row.context(key):
                response = response_messages(raw)
                if response[0]["role"] == "system":
                    raise FormatError("a response may not start with a system message", "[0].role")
                rendered = self.renderer.render_conversation(
                    prompt + response, tools=tools, train_from=len(prompt)
                )
            start = rendered.response_start
            ids, mask = rendered.input_ids, rendered.loss_mask
            with row.context(cfg.prompt_key):
                p_keep = truncation_slice(
                    start, cfg.max_prompt_length, cfg.truncation, what="prompt"
                )
            p_ids, p_mask = ids[:start][p_keep], mask[:start][p_keep]
            budget = cfg.max_length - len(p_ids)
            with row.context(key):
                r_keep = truncation_slice(
                    len(ids) - start,
                    budget,
                    "error" if cfg.truncation == "error" else "right",
                    what=f"response (after a {len(p_ids)}-token prompt, "
                    f"max_length {cfg.max_length})",
                )
            out_ids = np.asarray(p_ids + ids[start:][r_keep], dtype=np.int32)
            out_mask = np.asarray(p_mask + mask[start:][r_keep], dtype=np.float32)
            if out_mask.size:
                out_mask[0] = 0.0
            out[f"{side}_input_ids"] = out_ids
            out[f"{side}_loss_mask"] = out_mask
        return out
