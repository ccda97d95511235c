"""Tools for the agent loop: the `Tool` interface, built-ins, and the YAML registry.

The names below are imported from their module on first use, so importing the package
(or `rljax.agent.tools.registry`) loads no built-in tool and not the OS sandbox.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module under rljax.agent.tools that defines it
_EXPORTS: dict[str, str] = {
    "ERROR_KINDS": "base", "Tool": "base", "ToolResult": "base",
    "CalculatorTool": "calculator", "PythonSandboxTool": "python_sandbox",
    "TOOL_CLASSES": "registry", "build_tool": "registry", "load_tools": "registry",
    "register_tool": "registry", "tool_class": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rljax.agent.tools' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rljax.agent.tools.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
