"""Fixtures for the data tests: our char tokenizer always; real Qwen tokenizers only when
`RLJAX_TEST_TOKENIZERS` points at the fixture folder (tests using them skip otherwise)."""

from __future__ import annotations

import os

import pytest

from rljax.data.tokenizer import build_char_tokenizer


def _fixture_tokenizer(name: str):
    root = os.environ.get("RLJAX_TEST_TOKENIZERS")
    if not root or not os.path.isdir(os.path.join(root, name)):
        pytest.skip(f"RLJAX_TEST_TOKENIZERS does not provide {name}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.join(root, name))


@pytest.fixture(scope="session")
def char_tok():
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def qwen25_tok():
    return _fixture_tokenizer("qwen2.5-instruct")


@pytest.fixture(scope="session")
def qwen3_tok():
    return _fixture_tokenizer("qwen3")


@pytest.fixture(params=["char", "qwen2.5"])
def any_tok(request):
    """Each chat test runs on our char tokenizer and (when available) real Qwen2.5."""
    if request.param == "char":
        return request.getfixturevalue("char_tok")
    return request.getfixturevalue("qwen25_tok")
