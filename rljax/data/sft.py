"""SFT rows (``messages`` [+ ``tools``]) -> one tokenized example.

An example is ``{"input_ids": int32[L], "loss_mask": float32[L]}`` with L <= max_length.
``loss_mask[t] = 1`` where ``input_ids[t]`` is an assistant token (content, tool calls,
end-of-turn token; not the generation prompt), aligned with ``input_ids``: the model
predicts ``input_ids[t]`` from the logits at ``t - 1``, so ``loss_mask[0]`` is forced to 0
(it matters after left truncation). A padding row gives L = 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rljax.data.chat import ChatRenderer, normalize_messages, normalize_tools
from rljax.data.config import DataConfig
from rljax.data.sources import Row
from rljax.data.truncation import truncation_slice


def empty_sft_example() -> dict[str, np.ndarray]:
    return {
        "input_ids": np.zeros((0,), np.int32),
        "loss_mask": np.zeros((0,), np.float32),
    }


def sft_length(example: dict[str, np.ndarray]) -> int:
    """Tokens of an SFT example (after truncation)."""
    return len(example["input_ids"])


class SFTTransform:
    """Callable `Row -> example` for the ``sft`` format (thread-safe, no state)."""

    def __init__(self, config: DataConfig, tokenizer: Any):
        self.config = config
        self.renderer = ChatRenderer(tokenizer, config.chat_template_kwargs)

    def __call__(self, row: Row) -> dict[str, np.ndarray]:
        if row.padding:
            return empty_sft_example()
        cfg = self.config
        raw = row.require(cfg.messages_key)
        with row.context(cfg.messages_key):
            messages = normalize_messages(raw, require_assistant=True)
        tools = None
        if cfg.tools_key in row.data:
            with row.context(cfg.tools_key):
                tools = normalize_tools(row.data[cfg.tools_key])
        with row.context(cfg.messages_key):
            rendered = self.renderer.render_conversation(messages, tools=tools)
            keep = truncation_slice(
                len(rendered.input_ids), cfg.max_length, cfg.truncation, what="conversation"
            )
        ids = np.asarray(rendered.input_ids[keep], dtype=np.int32)
        mask = np.asarray(rendered.loss_mask[keep], dtype=np.float32)
        if mask.size:
            mask[0] = 0.0
        return {"input_ids": ids, "loss_mask": mask}
