"""OpenAI function schemas: shape checks and a small JSON-schema validator for arguments.

Only the subset of JSON Schema that function declarations use is validated: ``type`` (one
name or a list of names: object, string, number, integer, boolean, array, null), ``required``,
``properties``, ``additionalProperties: false``, ``items``, ``enum``, ``minimum``/``maximum``,
``minLength``/``maxLength``. Other keywords are ignored. No third-party dependency.
"""

from __future__ import annotations

from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list, tuple),
    "null": (type(None),),
}


def check_function_schema(schema: Any) -> dict[str, Any]:
    """Validate ``{"type": "function", "function": {"name", "description", "parameters"}}``.

    Returns the inner ``function`` dict; raises `ValueError` naming what is wrong.
    """
    if not isinstance(schema, dict) or schema.get("type") != "function":
        raise ValueError(f'tool schema must be {{"type": "function", "function": {{...}}}}, got {schema!r}')
    unknown = set(schema) - {"type", "function"}
    if unknown:
        raise ValueError(f"unknown key(s) in tool schema: {sorted(unknown)}")
    fn = schema.get("function")
    if not isinstance(fn, dict):
        raise ValueError("tool schema has no 'function' object")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("tool schema function has no name")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ValueError(f"tool {name!r}: parameters must be a JSON schema of type object")
    return fn


def _type_ok(value: Any, type_name: str) -> bool:
    if type_name not in _TYPES:
        return True  # unknown type names are not enforced
    if isinstance(value, bool) and type_name in ("number", "integer"):
        return False  # JSON booleans are not numbers
    if type_name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[type_name])


def validate(value: Any, schema: dict[str, Any], path: str = "arguments") -> list[str]:
    """All violations of `schema` by `value`, as readable messages (empty when valid)."""
    errors: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_type_ok(value, t) for t in names):
            return [f"{path} must be of type {'/'.join(names)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path} must be one of {schema['enum']!r}, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path} must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path} must be <= {schema['maximum']}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path} must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path} must have at most {schema['maxLength']} characters")
    if isinstance(value, dict):
        props = schema.get("properties", {}) or {}
        for key in schema.get("required", []) or []:
            if key not in value:
                errors.append(f"missing required argument {path}.{key}")
        for key, sub in value.items():
            if key in props:
                errors.extend(validate(sub, props[key], f"{path}.{key}"))
            elif schema.get("additionalProperties") is False:
                errors.append(f"unexpected argument {path}.{key}")
    if isinstance(value, (list, tuple)) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors.extend(validate(item, schema["items"], f"{path}[{i}]"))
    return errors
