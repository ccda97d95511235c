"""Fixtures for the agent tests: chat tokenizers and small helpers.

Tokenizers: when ``RLJAX_TEST_TOKENIZERS`` points at a folder with ``qwen2.5-instruct/`` and
``qwen3/`` (CI sets it to the shared fixtures), the real Qwen2.5 and Qwen3 tokenizers with
their real chat templates are used. Otherwise the tests train two tiny byte-level BPE
tokenizers themselves (`rljax.bench.scripted_agent.build_tiny_chat_tokenizer`), save them as
`PreTrainedTokenizerFast` and load them back: a Qwen2.5-like template ("hermes") and one that
drops earlier ``<think>`` blocks like Qwen3 ("think").
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rljax.bench.scripted_agent import build_tiny_chat_tokenizer

ENV_VAR = "RLJAX_TEST_TOKENIZERS"


def _load(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def chat_tokenizers(tmp_path_factory) -> dict[str, object]:
    """``{"hermes": tok, "think": tok}``: Qwen2.5 / Qwen3 when available, tiny ones otherwise."""
    root = os.environ.get(ENV_VAR)
    if root:
        root_path = Path(root)
        hermes, think = root_path / "qwen2.5-instruct", root_path / "qwen3"
        if not (hermes.is_dir() and think.is_dir()):
            raise RuntimeError(f"{ENV_VAR}={root} has no qwen2.5-instruct/ and qwen3/ folders")
        return {"hermes": _load(hermes), "think": _load(think), "source": "fixtures"}
    base = tmp_path_factory.mktemp("tiny_tokenizers")
    return {
        "hermes": build_tiny_chat_tokenizer("hermes", base / "hermes"),
        "think": build_tiny_chat_tokenizer("think", base / "think"),
        "source": "tiny",
    }


@pytest.fixture(scope="session")
def hermes_tok(chat_tokenizers):
    """Qwen2.5-Instruct (or the tiny hermes-style tokenizer)."""
    return chat_tokenizers["hermes"]


@pytest.fixture(scope="session")
def think_tok(chat_tokenizers):
    """Qwen3 (or the tiny think-dropping tokenizer)."""
    return chat_tokenizers["think"]


@pytest.fixture(params=["hermes", "think"])
def any_tok(request, chat_tokenizers):
    """Each of the two chat tokenizers in turn."""
    return chat_tokenizers[request.param]
