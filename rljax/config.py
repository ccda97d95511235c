"""Typed, nested dataclass configs: YAML in, dotted command-line overrides, strict keys.

    cfg = load_config(RunConfig, "configs/sft_tiny.yaml", ["optim.lr=1e-5", "trainer.total_steps=50"])

An unknown or mistyped key is a `ConfigError` that names the full dotted key and suggests
the full keys that end with it (`optim.lr` of an RL config: `actor.optim.lr`), else the
closest valid name; a value of the wrong type names the key, the expected type and the
value. `config_to_dict` gives back plain YAML-able data (saved with every run).

Values are checked at load time too (`check_config`, run by `load_config`):

- a numeric field annotated with `Bounds` (`lr: NonNegFloat`, `rollout.n: PositiveInt`, ...)
  must lie in its range (every count and size has an upper limit too: `Rows`, `Tokens`,
  `Threads`, ...), every float field must be finite, no string may hold a NUL
  character, a field naming a file or folder (`PATH_FIELD`) fits Linux's path limits, and
  a `Literal` field must hold one of its words (checked again here for a config built in
  code);
- a section may define `check(self)`, raising `FieldError(field, message)` (the walker adds
  the section's dotted path) or a `ConfigError` whose message already names the full key,
  for what one field's type cannot say: registry names, sizes that must divide, fields
  that only make sense together.

`validate(cfg, num_devices)` is `check_config` plus what needs the machine (the root
config's `check_run(num_devices)`: mesh shape and batch sizes against the data-parallel
size, the checkpoint to resume from). Trainers call it first, before building anything.

A YAML section that sets only some of its keys keeps the defaults of the field it fills
(RLConfig's `trainer.algorithm` is `grpo`, not TrainerConfig's `sft`); a root config
class's `defaults_for(data)` may replace its defaults (RLConfig: the preset of
`trainer.algorithm`, under every key the file and the overrides set). An optional section
(`agent: AgentConfig | None`) is null by default and built when the YAML sets it.
`load_section(cls, data, key)` builds and checks one section on its own (the agent's
config given as a mapping). A section that code builds for itself (the sampler's, the
agent's) runs `check_config(self)` in its `__post_init__`: a bad value fails at
construction too, and `from_dict` adds the section's dotted path to the message.

An alias is a second name of a field, declared in the field's metadata
(`field(default=8, metadata=alias("train_batch_size"))`) and resolved by `from_dict`:
the config holds, and saves, the field's own name only. The same value under both names
is accepted; two different values are a `ConfigError` naming both keys. An override
(`apply_overrides`) under either name replaces the value the file gave under either name.

Every field carries a comment, on its line or on the comment lines right above it;
`field_comments(cls)` reads them from the source (`rljax config show`, `docs/config.md`).

A closed set of words is a `Literal` field (`reward.mode: Literal["process", "inline"]`):
a typo is "key: expected one of [...], got ..." at load. A set that code can extend (a
registry of losses, estimators) is a `str` checked in the section's `check` with
`check_registry`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import io
import keyword
import math
import re
import textwrap
import tokenize
import types
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml


class ConfigError(ValueError):
    """A config file or override that does not fit the config schema."""


class FieldError(ConfigError):
    """Raised by a section's `check()` about one of its fields, named relative to the
    section (`lr`, `policy_loss.loss_mode`); `check_config` prefixes the section's path."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The range of a numeric config field, attached with `typing.Annotated`
    (`Annotated[int, Bounds(ge=1)]`); checked by `check_config`, None values skipped."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def violation(self, value: float) -> str | None:
        """What is wrong with `value` ("must be >= 1"), or None when it is in range."""
        for bound, holds, text in ((self.ge, lambda b: value >= b, ">="), (self.gt, lambda b: value > b, ">"),
                                   (self.le, lambda b: value <= b, "<="), (self.lt, lambda b: value < b, "<")):
            if bound is not None and not holds(bound):
                return f"must be {text} {number_text(bound)}"
        return None


def number_text(value: float) -> str:
    """A number as a message shows it: a whole number in full (4294967296), others by `:g`."""
    if isinstance(value, int) or (math.isfinite(value) and float(value).is_integer() and abs(value) < 1e16):
        return str(int(value))
    return f"{value:g}"


PositiveInt = Annotated[int, Bounds(ge=1)]
NonNegInt = Annotated[int, Bounds(ge=0)]
PositiveFloat = Annotated[float, Bounds(gt=0)]
NonNegFloat = Annotated[float, Bounds(ge=0)]
UnitFloat = Annotated[float, Bounds(ge=0, le=1)]  # a fraction or probability in [0, 1]
OpenUnitFloat = Annotated[float, Bounds(gt=0, le=1)]  # (0, 1]

# Counts and sizes with upper limits: far above any real run, low enough that a value with
# a few digits too many is refused at load instead of exhausting memory, threads or time.
INT32_MAX = 2**31 - 1
Seed = Annotated[int, Bounds(ge=0, lt=2**32)]  # a seed: an unsigned 32-bit integer
Steps = Annotated[int, Bounds(ge=1, le=INT32_MAX)]  # a count of steps: the step counters are int32
NonNegSteps = Annotated[int, Bounds(ge=0, le=INT32_MAX)]  # steps, or 0 (off)
Tokens = Annotated[int, Bounds(ge=1, le=2**22)]  # a length in tokens (4M: above any context window)
NonNegTokens = Annotated[int, Bounds(ge=0, le=2**22)]  # tokens, or 0 (derived / off)
Rows = Annotated[int, Bounds(ge=1, le=2**20)]  # rows, prompts or sequences in one batch (1M)
NonNegRows = Annotated[int, Bounds(ge=0, le=2**20)]  # rows, or 0 (derived / the whole batch)
Threads = Annotated[int, Bounds(ge=1, le=1024)]  # threads or processes of one host: more than any host's cores
NonNegThreads = Annotated[int, Bounds(ge=0, le=1024)]  # threads, or 0 (none: the caller's thread)
Pages = Annotated[int, Bounds(ge=0, le=2**24)]  # KV-cache pages (16M), or 0 (sized from memory)
Devices = Annotated[int, Bounds(ge=0, le=65536)]  # a count of devices (the largest pods: ~10^4), or 0 (derived)
Repeats = Annotated[int, Bounds(ge=1, le=10000)]  # epochs, turns, retries: a small count


ALIAS = "alias"  # the field-metadata key naming a field's second name


def alias(name: str) -> dict[str, str]:
    """Field metadata giving the field a second name that YAML and overrides may use
    (`field(default=8, metadata=alias("train_batch_size"))`); see the module docstring."""
    return {ALIAS: name}


def aliases(cls) -> dict[str, str]:
    """alias -> field name, for the fields of dataclass `cls` that have one."""
    return {f.metadata[ALIAS]: f.name for f in dataclasses.fields(cls) if ALIAS in f.metadata}


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(valid))}"


def dotted_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree of dataclass `cls`, sections and leaves, in
    field order (`actor`, `actor.optim`, `actor.optim.lr`, ...)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        keys.append(key)
        section = section_type(hints[f.name])
        if section is not None:
            keys.extend(dotted_keys(section, key))
    return keys


def _unknown_key(tree, tree_prefix: str, prefix: str, rest: str, valid: list[str]) -> ConfigError:
    """The error for an unknown key: `rest` (the unknown part and what follows it, dotted)
    in section `prefix` of the config tree of dataclass `tree` (whose own keys sit under
    `tree_prefix`). Keys of the tree that end with `rest` are the suggestion (`optim.lr` ->
    `actor.optim.lr`), those inside section `prefix` first; else the section's closest name."""
    key = f"{prefix}.{rest}" if prefix else rest
    keys = [f"{tree_prefix}.{k}" if tree_prefix else k for k in dotted_keys(tree)]
    elsewhere = [k for k in keys if k.endswith("." + rest)]
    inside = [k for k in elsewhere if k.startswith(prefix + ".")] if prefix else []
    elsewhere = inside or elsewhere
    if elsewhere:
        others = f" (or {', '.join(repr(k) for k in elsewhere[1:])})" if elsewhere[1:] else ""
        hint = f"; did you mean {elsewhere[0]!r}{others}?"
    else:
        hint = _suggest(rest.split(".")[0], valid)
    return ConfigError(f"unknown config key {key!r}{hint}")


def check_name(name: str, valid, what: str = "", listing: str | None = None) -> str | None:
    """The complaint about `name` when it is not in `valid` (a registry), with the closest
    valid name and `listing` (default: "valid: " and every name); None when it is known.
    For `FieldError` / `ConfigError`."""
    if name in valid:
        return None
    names = sorted(valid)
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what + ' ' if what else ''}{name!r}{hint} ({listing or 'valid: ' + ', '.join(names)})"


def check_registry(key: str, name: str, registry) -> None:
    """A `ConfigError` naming `key` when `name` is not in `registry` (`check_name`'s message)."""
    problem = check_name(name, registry)
    if problem:
        raise ConfigError(f"{key}: {problem}")


def section_type(tp: Any) -> Any:
    """The dataclass a field holds (`X` or `X | None`), else None."""
    if get_origin(tp) in (Union, types.UnionType):
        options = [option for option in get_args(tp) if option is not type(None)]
        tp = options[0] if len(options) == 1 else None
    return tp if dataclasses.is_dataclass(tp) else None


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and where lossless, convert) `value` to the annotated type `tp`."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        options = [option for option in get_args(tp) if option is not type(None)]
        if value is None and len(options) < len(get_args(tp)):
            return None
        if len(options) == 1:  # `X | None`: X's own error, which says more than the union's
            return _coerce(value, options[0], key)
        for option in options:
            try:
                return _coerce(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in get_args(tp):
            close = difflib.get_close_matches(str(value), [str(v) for v in get_args(tp)], n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}: expected one of {list(get_args(tp))}, got {value!r}{hint}")
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


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _resolve_aliases(cls, data: dict, prefix: str) -> dict:
    """`data` with every alias key renamed to its field's name; both names with different
    values is a `ConfigError` naming both (a null under one name yields to the other)."""
    names = aliases(cls)
    if not names or not isinstance(data, dict) or not names.keys() & data.keys():
        return data
    out = dict(data)
    for other, name in names.items():
        if other not in out:
            continue
        value = out.pop(other)
        if name in out and out[name] != value and value is not None and out[name] is not None:
            key = f"{prefix}.{name}" if prefix else name
            other_key = f"{prefix}.{other}" if prefix else other
            raise ConfigError(f"{key}={out[name]!r} and {other_key}={value!r}: two names of one setting with "
                              f"different values; set one")
        if out.get(name) is None:
            out[name] = value
    return out


def written(name: str) -> str:
    """A field's name as config files write it: a Python keyword's field (`async_`) without
    its trailing underscore."""
    return name[:-1] if keyword.iskeyword(name[:-1]) else name


def from_dict(cls, data: dict, prefix: str = "", base: Any = None):
    """Build dataclass `cls` from nested dicts, rejecting unknown keys and resolving aliases.
    Keys absent from `data` take their value from `base` (an instance of `cls`) when given;
    a nested section starts from its field's default (`RLConfig.trainer` is
    `TrainerConfig(algorithm="grpo")`). A root config class (no `prefix`) may define the
    classmethod `defaults_for(data)`: without a `base`, its result (when not None) is the
    base (`RLConfig`'s `trainer.algorithm` presets, `rljax.rl.presets`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or cls.__name__}: expected a mapping (section {cls.__name__}), got {data!r}")
    defaults_for = getattr(cls, "defaults_for", None)
    if base is None and not prefix and callable(defaults_for):
        base = defaults_for(data)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    data = _resolve_aliases(cls, data, prefix)
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{written(key)}" if prefix else written(key)
        if key not in fields:
            raise _unknown_key(cls, prefix, prefix, key, list(fields))
        tp = hints[key]
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            default = getattr(base, key) if base is not None else _field_default(fields[key])
            kwargs[key] = from_dict(tp, value, dotted, default if isinstance(default, tp) else None)
        else:
            kwargs[key] = _coerce(value, tp, dotted)
    if base is not None:
        for name in fields:
            kwargs.setdefault(name, getattr(base, name))
    try:
        return cls(**kwargs)
    except FieldError as e:  # a section that checks itself at construction
        raise FieldError(f"{prefix}.{e.key}" if prefix else e.key, e.message) from None
    except TypeError as e:  # a required field without a value
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def load_section(cls, data: dict | None, key: str):
    """One section built from its mapping (`from_dict`) and checked (`check_config`), with
    errors naming `key` (its dotted path in the run config, e.g. "agent")."""
    cfg = from_dict(cls, data or {}, prefix=key)
    check_config(cfg, key)
    return cfg


# fields that name a file or folder (by their name's ending), held to the OS's limits
PATH_FIELD = re.compile(r"(path|dir|_file|_files|tokenizer|experiment_name)$")
PATH_MAX, NAME_MAX = 4096, 255  # Linux: bytes in a path, in one of its components


def path_problem(path: str) -> str | None:
    """Why `path` cannot name a file on Linux (too long, or a component too long), or None."""
    if len(path.encode()) > PATH_MAX:
        return f"is {len(path.encode())} bytes long, over the {PATH_MAX} a path may have"
    longest = max(path.split("/"), key=lambda part: len(part.encode()))
    if len(longest.encode()) > NAME_MAX:
        return f"has a name of {len(longest.encode())} bytes ({longest[:20]}...), over the {NAME_MAX} a file name may have"
    return None


def _check_value(value: Any, tp: Any, key: str) -> None:
    """Bounds (from `Annotated`), Literal membership and finiteness of one field's value."""
    bounds = None
    if get_origin(tp) is Annotated:
        tp, *extras = get_args(tp)
        bounds = next((e for e in extras if isinstance(e, Bounds)), None)
    if get_origin(tp) in (Union, types.UnionType):
        if value is None:
            return
        options = [option for option in get_args(tp) if option is not type(None)]
        for option in options:  # a Literal of a union with other types is checked at load only
            if len(options) == 1 or get_origin(option) is not Literal:
                _check_value(value, option, key)
        return
    for text in (value if isinstance(value, (list, tuple)) else [value]):
        if isinstance(text, str) and "\x00" in text:  # no file name or word holds one
            raise FieldError(key, f"contains a NUL character: {text!r}")
        if isinstance(text, str) and PATH_FIELD.search(key.rpartition(".")[2]):
            problem = path_problem(text)
            if problem:
                raise FieldError(key, problem)
    if get_origin(tp) is Literal:
        if value not in get_args(tp):
            raise FieldError(key, f"expected one of {list(get_args(tp))}, got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise FieldError(key, f"must be a finite number, got {value}")
    if bounds is not None:
        problem = bounds.violation(value)
        if problem:
            raise FieldError(key, f"{problem}, got {number_text(value)}")


def check_config(cfg: Any, prefix: str = "") -> None:
    """Check every field of the config tree `cfg` (see the module docstring); the first
    problem is a `ConfigError` naming its full dotted key (a `FieldError` when the problem
    is one field's)."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    for f in dataclasses.fields(cfg):
        key = f"{prefix}.{written(f.name)}" if prefix else written(f.name)
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_config(value, key)
        else:
            _check_value(value, hints[f.name], key)
    check = getattr(cfg, "check", None)
    if callable(check):
        try:
            check()
        except FieldError as e:
            if prefix:
                raise FieldError(f"{prefix}.{e.key}", e.message) from None
            raise


def validate(cfg: Any, num_devices: int | None = None) -> None:
    """`check_config(cfg)`, then the root's `check_run(num_devices)`: the checkpoint to
    resume from and, given the device count, mesh shape and batch sizes against the
    data-parallel size. Call it before building anything: every problem is a one-line
    `ConfigError` naming the key."""
    check_config(cfg)
    check_run = getattr(cfg, "check_run", None)
    if callable(check_run):
        check_run(num_devices)


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def _set_dotted(tree: dict, dotted: str, value: Any, cls) -> None:
    """Set `a.b.c=value` in the raw dict, checking each key against the schema."""
    parts = dotted.split(".")
    node, schema = tree, cls
    for i, part in enumerate(parts):
        if schema is None or not dataclasses.is_dataclass(schema):
            # free-form mapping (e.g. a dict field): accept any key
            if i == len(parts) - 1:
                node[part] = value
            else:
                node = node.setdefault(part, {})
            continue
        names = {f.name: f for f in dataclasses.fields(schema)}
        second_names = aliases(schema)
        part = second_names.get(part, part)  # an alias sets its field, whichever name the file used
        for other in [other for other, name in second_names.items() if name == part]:
            node.pop(other, None)
        if part not in names:
            raise _unknown_key(cls, "", ".".join(parts[:i]), ".".join(parts[i:]), list(names))
        if i == len(parts) - 1:
            node[part] = value
            return
        sub = node.get(part)
        if not isinstance(sub, dict):
            sub = {}
            node[part] = sub
        node, schema = sub, section_type(typing.get_type_hints(schema)[part])


def apply_overrides(raw: dict, overrides: list[str], cls) -> dict:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        key, text = item.split("=", 1)
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({getattr(e, 'problem', e)})") from None
        _set_dotted(raw, key.strip(), value, cls)
    return raw


def read_yaml(path: str) -> dict:
    """The top-level mapping of a YAML config file; a syntax error is a one-line `ConfigError`."""
    with open(path) as f:
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return raw


def load_config(cls, path: str | None = None, overrides: list[str] | None = None):
    """Read `path`, apply dotted `overrides`, build `cls` and check every value (`check_config`)."""
    raw: dict = read_yaml(path) if path else {}
    raw = apply_overrides(raw, overrides or [], cls)
    cfg = from_dict(cls, raw)
    check_config(cfg)
    return cfg


_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def _own_field_comments(cls) -> dict[str, str]:
    """field name -> comment, for the fields `cls` itself declares (its source read with
    `ast` for where each field is and `tokenize` for the comments)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a class made at run time)
        return {}
    comments: dict[int, str] = {}  # line -> comment text
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
        elif token.type not in _NOT_CODE:
            code_lines.update(range(token.start[0], token.end[0] + 1))
    out = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        text = [comments[line] for line in range(node.lineno, node.end_lineno + 1) if line in comments]
        if not text:  # the comment lines right above
            line = node.lineno - 1
            while line in comments and line not in code_lines:
                text.insert(0, comments[line])
                line -= 1
        out[node.target.id] = " ".join(text)
    return out


def field_comments(cls) -> dict[str, str]:
    """field name -> its comment in the source of dataclass `cls` (or of the dataclass
    that declares it): the comment on the field's line(s), else the comment lines right
    above it; "" for a field without one."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            found.update(_own_field_comments(klass))
    return {f.name: found.get(f.name, "") for f in dataclasses.fields(cls)}


def save_config(cfg, path: str) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
