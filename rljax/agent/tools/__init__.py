"""Tools for the agent loop: the `Tool` interface, built-ins, and the YAML registry.

The names below are imported from their module on first use, so importing the package
(or `rljax.agent.tools.registry`) loads no built-in tool and not the OS sandbox.
"""

from __future__ import annotations

from rljax.lazy import lazy_exports

# public name -> the module under rljax.agent.tools that defines it
_EXPORTS: dict[str, str] = {
    "ERROR_KINDS": "base", "Tool": "base", "ToolResult": "base",
    "CalculatorTool": "calculator", "PythonSandboxTool": "python_sandbox",
    "TOOL_CLASSES": "registry", "build_tool": "registry", "load_tools": "registry",
    "register_tool": "registry", "tool_class": "registry",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
