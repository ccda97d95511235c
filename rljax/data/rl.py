"""RL prompt rows (verl format) -> one prompt for the sampler.

Row columns (names configurable in `DataConfig`):

* ``data_source`` (str) — selects the reward function;
* ``prompt`` — a list of chat messages (a plain string is accepted as one user message);
* ``reward_model`` — an object with a ``ground_truth`` key (any JSON value); in Parquet a
  nested struct column ``reward_model: {style, ground_truth}``;
* ``extra_info`` (optional object) — passed through (keys with None values dropped, so
  JSON-lines and Parquet rows read alike);
* ``tools`` (optional) — OpenAI function schemas for the template and the agent loop.

Example (plain Python values; prompts are not padded here):
``{"prompt_ids": list[int], "raw_prompt": list[message], "data_source": str,
"ground_truth": Any, "reward_model": dict, "extra_info": dict, "tools": list | None,
"index": int}``. ``prompt_ids`` is the chat template with ``add_generation_prompt=True``,
cut to ``max_prompt_length`` by the truncation policy. ``index`` is the row's position in
the concatenated files. A padding row gives an empty dict (dropped from the batch).
"""

from __future__ import annotations

from typing import Any

from rljax.data.chat import ChatRenderer, drop_none, normalize_messages, normalize_tools
from rljax.data.config import DataConfig
from rljax.data.sources import Row
from rljax.data.truncation import truncate


def rl_length(example: dict[str, Any]) -> int:
    """Tokens of an RL example's prompt (after truncation)."""
    return len(example["prompt_ids"])


class RLTransform:
    """Callable `Row -> prompt example` for the ``rl`` format."""

    def __init__(self, config: DataConfig, tokenizer: Any):
        self.config = config
        self.renderer = ChatRenderer(tokenizer, config.chat_template_kwargs)

    def __call__(self, row: Row) -> dict[str, Any]:
        if row.padding:
            return {}
        cfg = self.config
        data_source = row.require(cfg.data_source_key)
        if not isinstance(data_source, str):
            raise row.error(
                f"expected a string, got {type(data_source).__name__}", key=cfg.data_source_key
            )
        raw_prompt = row.require(cfg.prompt_key)
        if isinstance(raw_prompt, str):
            raw_prompt = [{"role": "user", "content": raw_prompt}]
        with row.context(cfg.prompt_key):
            messages = normalize_messages(raw_prompt)
        reward_model = row.require(cfg.reward_model_key)
        if not isinstance(reward_model, dict):
            raise row.error(
                f"expected an object with a 'ground_truth' key, got {type(reward_model).__name__}",
                key=cfg.reward_model_key,
            )
        if "ground_truth" not in reward_model:
            raise row.error(
                f"missing key 'ground_truth' (has {sorted(reward_model)})",
                key=f"{cfg.reward_model_key}.ground_truth",
            )
        extra_info = row.data.get(cfg.extra_info_key)
        if extra_info is None:
            extra_info = {}
        if not isinstance(extra_info, dict):
            raise row.error(
                f"expected an object, got {type(extra_info).__name__}", key=cfg.extra_info_key
            )
        tools = None
        if cfg.tools_key in row.data:
            with row.context(cfg.tools_key):
                tools = normalize_tools(row.data[cfg.tools_key])
        with row.context(cfg.prompt_key):
            ids = self.renderer.render_prompt(messages, tools=tools)
            ids = truncate(ids, cfg.max_prompt_length, cfg.truncation, what="prompt")
        return {
            "prompt_ids": [int(t) for t in ids],
            "raw_prompt": messages,
            "data_source": data_source,
            "ground_truth": reward_model["ground_truth"],
            "reward_model": reward_model,
            "extra_info": drop_none(extra_info),
            "tools": tools,
            "index": row.index,
        }
