"""Typed, nested dataclass configs: YAML in, dotted command-line overrides, strict keys.

    cfg = load_config(RunConfig, "configs/sft_tiny.yaml", ["optim.lr=1e-5", "trainer.total_steps=50"])

An unknown or mistyped key is a `ConfigError` that names the full dotted key and suggests
the closest valid one; a value of the wrong type names the key, the expected type and the
value. `config_to_dict` gives back plain YAML-able data (saved with every run).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

import yaml


class ConfigError(ValueError):
    """A config file or override that does not fit the config schema."""


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(valid))}"


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and where lossless, convert) `value` to the annotated type `tp`."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key}: expected one of {list(get_args(tp))}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping (section {tp.__name__}), got {value!r}")
        return from_dict(tp, value, prefix=key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads "1e-5" as a string
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def from_dict(cls, data: dict, prefix: str = ""):
    """Build dataclass `cls` from nested dicts, rejecting unknown keys."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            raise ConfigError(f"unknown config key {dotted!r}{_suggest(key, list(fields))}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field without a value
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def _set_dotted(tree: dict, dotted: str, value: Any, cls) -> None:
    """Set `a.b.c=value` in the raw dict, checking each key against the schema."""
    parts = dotted.split(".")
    node, schema = tree, cls
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        if schema is None or not dataclasses.is_dataclass(schema):
            # free-form mapping (e.g. a dict field): accept any key
            if i == len(parts) - 1:
                node[part] = value
            else:
                node = node.setdefault(part, {})
            continue
        names = {f.name: f for f in dataclasses.fields(schema)}
        if part not in names:
            raise ConfigError(f"unknown config key {here!r}{_suggest(part, list(names))}")
        if i == len(parts) - 1:
            node[part] = value
            return
        field_tp = typing.get_type_hints(schema)[part]
        sub = node.get(part)
        if not isinstance(sub, dict):
            sub = {}
            node[part] = sub
        node, schema = sub, (field_tp if dataclasses.is_dataclass(field_tp) else None)


def apply_overrides(raw: dict, overrides: list[str], cls) -> dict:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        key, text = item.split("=", 1)
        _set_dotted(raw, key.strip(), yaml.safe_load(text) if text else "", cls)
    return raw


def load_config(cls, path: str | None = None, overrides: list[str] | None = None):
    raw: dict = {}
    if path:
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    raw = apply_overrides(raw, overrides or [], cls)
    return from_dict(cls, raw)


def save_config(cfg, path: str) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
