"""Tool registry and the YAML tool declaration format.

A tools YAML file lists tools; each entry picks an implementation either by registered
``name`` or by import path ``class`` (``"package.module:ClassName"`` or
``"package.module.ClassName"``), passes it ``options`` (keyword arguments of the class), and
optionally gives the OpenAI function ``schema`` the model sees (built-ins have a default)::

    tools:
      - name: calculator
      - name: python
        options: {timeout_s: 5, memory_mb: 256}
      - name: sandbox_fusion       # remote SandboxFusion server (verl's option names)
        options: {sandbox_fusion_url: "http://localhost:8080"}
        schema: {type: function, function: {name: run_code, description: Run code remotely.,
                 parameters: {type: object, properties: {code: {type: string}}, required: [code]}}}
      - class: my_project.tools:WeatherTool
        schema:
          type: function
          function:
            name: get_weather
            description: Current weather for a city.
            parameters:
              type: object
              properties: {city: {type: string}}
              required: [city]

Unknown keys (in an entry or in ``options``) raise `ValueError` naming the key. Two tools with
the same function name raise too. Register your own implementation with
``@register_tool("name")`` on a `Tool` subclass.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rljax.agent.tools.base import Tool

T = TypeVar("T", bound=type[Tool])
# registered name -> class; the built-ins as import paths, imported when first used (the
# python tool pulls in the OS sandbox)
TOOL_CLASSES: dict[str, type[Tool] | str] = {
    "calculator": "rljax.agent.tools.calculator:CalculatorTool",
    "python": "rljax.agent.tools.python_sandbox:PythonSandboxTool",
    "code_interpreter": "rljax.agent.tools.python_sandbox:PythonSandboxTool",
    "sandbox_fusion": "rljax.agent.tools.sandbox_fusion:SandboxFusionTool",
}
_ENTRY_KEYS = {"name", "class", "options", "schema"}


def register_tool(*names: str) -> Callable[[T], T]:
    """Class decorator: register a `Tool` subclass under one or more names."""

    def deco(cls: T) -> T:
        for n in names:
            if n in TOOL_CLASSES and tool_class(n) is not cls:
                raise ValueError(f"tool {n!r} is already registered as {tool_class(n)!r}")
            TOOL_CLASSES[n] = cls
        return cls

    return deco


def tool_class(name: str) -> type[Tool]:
    """The class registered as `name` (a built-in is imported here, once)."""
    cls = TOOL_CLASSES[name]
    if isinstance(cls, str):
        cls = TOOL_CLASSES[name] = import_object(cls)
    return cls


def import_object(path: str) -> Any:
    """Import ``"pkg.mod:Name"`` or ``"pkg.mod.Name"``."""
    if ":" in path:
        module, _, attr = path.partition(":")
    else:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise ValueError(f"not an import path: {path!r} (use 'package.module:Name')")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def check_options(cls: type, options: Mapping[str, Any], where: str) -> None:
    """Raise `ValueError` naming any option that ``cls.__init__`` does not accept."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n in params if n not in ("self", "schema")]
    for key in options:
        if key not in valid:
            raise ValueError(f"{where}: unknown option {key!r} for {cls.__name__} (valid: {valid})")


def build_tool(entry: Mapping[str, Any], where: str = "tools[0]") -> Tool:
    """Instantiate one tool from a YAML entry (see module docstring)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: a tool entry must be a mapping, got {entry!r}")
    for key in entry:
        if key not in _ENTRY_KEYS:
            raise ValueError(f"{where}: unknown key {key!r} (valid: {sorted(_ENTRY_KEYS)})")
    if ("name" in entry) == ("class" in entry):
        raise ValueError(f"{where}: give exactly one of 'name' (registered) or 'class' (import path)")
    if "name" in entry:
        if entry["name"] not in TOOL_CLASSES:
            raise ValueError(f"{where}: unknown tool {entry['name']!r}; registered: {sorted(TOOL_CLASSES)}")
        cls = tool_class(entry["name"])
    else:
        cls = import_object(entry["class"])
        if not (inspect.isclass(cls) and issubclass(cls, Tool)):
            raise ValueError(f"{where}: {entry['class']!r} is not a Tool subclass")
    options = dict(entry.get("options") or {})
    check_options(cls, options, where)
    return cls(schema=entry.get("schema"), **options)


def load_tools(source: str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Tool]:
    """Tools by function name, from a YAML path, a parsed ``{"tools": [...]}`` or a list."""
    data: Any = source
    if isinstance(source, (str, Path)):
        with open(source) as f:
            data = yaml.safe_load(f) or {}
    if isinstance(data, Mapping):
        extra = set(data) - {"tools"}
        if extra:
            raise ValueError(f"tools config: unknown key {sorted(extra)[0]!r} (valid: ['tools'])")
        data = data.get("tools") or []
    tools: dict[str, Tool] = {}
    for i, entry in enumerate(data):
        tool = build_tool(entry, f"tools[{i}]")
        if tool.name in tools:
            raise ValueError(f"tools[{i}]: duplicate tool name {tool.name!r}")
        tools[tool.name] = tool
    return tools
