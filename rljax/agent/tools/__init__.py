"""Tools for the agent loop: the `Tool` interface, built-ins, and the YAML registry."""

from rljax.agent.tools.base import ERROR_KINDS, Tool, ToolResult
from rljax.agent.tools.calculator import CalculatorTool
from rljax.agent.tools.python_sandbox import PythonSandboxTool
from rljax.agent.tools.registry import TOOL_CLASSES, build_tool, load_tools, register_tool

__all__ = [
    "ERROR_KINDS", "Tool", "ToolResult", "CalculatorTool", "PythonSandboxTool",
    "TOOL_CLASSES", "build_tool", "load_tools", "register_tool",
]
