"""`rljax config show CONFIG [key.sub=value ...]` and `rljax config docs`.

`show` prints the config a run reads (the config class picked as `rljax train` picks it,
the file and the overrides applied, every value checked) as YAML with each key's comment
beside it: one listing of every key, its value and what it does. An optional section that
is off (`agent: null`) is followed by its keys, commented out, with their defaults. The
output loads back as the same config.

`docs` prints the config reference, `docs/config.md`: every section of both run configs,
each key with its type, default and comment. Both read the field comments from the
source (`rljax.config.field_comments`), so the code is the one place a key is described;
`tests/test_config_docs.py` keeps the committed reference equal to `config_docs()`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin

HELP = "Show the resolved config with every key's comment (show), or print the config reference (docs)."

COMMENT_COLUMN = 48  # `show` aligns comments at this column (longer lines: two spaces after)


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("show", help="print the resolved config as YAML, each key with its comment",
                          description="Print the resolved config as YAML, each key with its comment.")
    show.add_argument("config", help="YAML config file (see configs/)")
    show.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-5 trainer.total_steps=50")
    docs = sub.add_parser("docs", help="print the config reference (docs/config.md) in Markdown",
                          description="Print the config reference (docs/config.md) in Markdown.")
    for p in (show, docs):  # `rljax config show ... --debug` as well as `rljax config --debug show ...`
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")


def main(args) -> int:
    if args.action == "docs":
        print(config_docs(), end="")
        return 0
    from rljax.commands.run_kinds import config_class
    from rljax.config import load_config

    cfg = load_config(config_class(args.config, args.overrides), args.config, args.overrides)
    print(show_yaml(cfg), end="")
    return 0


# ---- shared: what a field is -----------------------------------------------------------------

def _comment(f: dataclasses.Field, comments: dict[str, str]) -> str:
    """The field's comment, with its alias when it has one."""
    from rljax.config import ALIAS

    text = comments.get(f.name, "")
    if ALIAS in f.metadata:
        text = f"{text} (alias: {f.metadata[ALIAS]})".strip()
    return text


def _section_class(tp: Any) -> type | None:
    """The dataclass a field holds (`X` or `X | None`), else None."""
    from rljax.config import section_type

    return section_type(tp)


def _value(cfg: Any, f: dataclasses.Field) -> Any:
    """The field's value in `cfg`; with no `cfg`, its default (MISSING when it has none)."""
    if cfg is not None:
        return getattr(cfg, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _flow(value: Any) -> str:
    """`value` as one line of YAML (flow style)."""
    import yaml

    if isinstance(value, str) and (not value.isprintable() or value != value.strip()):
        return json.dumps(value)  # a YAML double-quoted scalar
    text = yaml.safe_dump([value], default_flow_style=True, width=float("inf"), sort_keys=False).strip()
    return text[1:-1]


# ---- rljax config show -------------------------------------------------------------------------

def _yaml_rows(cfg: Any, cls: type, indent: str, commented: bool) -> list[tuple[str, str]]:
    """(line, comment) for every field of section `cls` with the values of `cfg` (None:
    the defaults), commented out when `commented`."""
    from rljax.config import field_comments

    comments = field_comments(cls)
    hints = typing.get_type_hints(cls)
    rows: list[tuple[str, str]] = []
    mark = "# " if commented else ""
    for f in dataclasses.fields(cls):
        value = _value(cfg, f)
        comment = _comment(f, comments)
        section = _section_class(hints[f.name])
        if section is not None and value is not None:
            rows.append((f"{indent}{mark}{f.name}:", comment))
            rows += _yaml_rows(None if value is dataclasses.MISSING else value, section, indent + "  ", commented)
        elif section is not None:  # an optional section that is off: its keys, commented out
            rows.append((f"{indent}{mark}{f.name}: null", comment))
            rows += _yaml_rows(None, section, indent + "  ", True)
        else:
            text = "(required)" if value is dataclasses.MISSING else _flow(value)
            rows.append((f"{indent}{mark}{f.name}: {text}", comment))
    return rows


def show_yaml(cfg: Any) -> str:
    """The config `cfg` as YAML, every key with its comment beside it (loads back as `cfg`)."""
    lines = []
    for line, comment in _yaml_rows(cfg, type(cfg), "", False):
        if comment:
            line = f"{line.ljust(COMMENT_COLUMN - 2)}  # {comment}"
        lines.append(line)
    return "\n".join(lines) + "\n"


# ---- rljax config docs -------------------------------------------------------------------------

def _bounds_text(bounds) -> str:
    from rljax.config import number_text

    low = (f"[{number_text(bounds.ge)}" if bounds.ge is not None else
           f"({number_text(bounds.gt)}" if bounds.gt is not None else None)
    high = (f"{number_text(bounds.le)}]" if bounds.le is not None else
            f"{number_text(bounds.lt)})" if bounds.lt is not None else None)
    if low and high:
        return f"in {low}, {high}"
    if low:
        return (">= " if low[0] == "[" else "> ") + low[1:]
    if high:
        return ("<= " if high[-1] == "]" else "< ") + high[:-1]
    return ""


def type_text(tp: Any) -> str:
    """A field's type as the reference shows it: `int >= 1`, `sft | preference | rl`,
    `list[str]`, `float in [0, 1] | null`."""
    from rljax.config import Bounds

    origin = get_origin(tp)
    if origin is Annotated:
        base, *extras = get_args(tp)
        bounds = next((e for e in extras if isinstance(e, Bounds)), None)
        text = type_text(base)
        return f"{text} {_bounds_text(bounds)}" if bounds is not None else text
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_text(a) for a in get_args(tp))
    if origin is Literal:
        return " | ".join(str(a) for a in get_args(tp))
    if origin in (list, tuple):
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return "[" + ", ".join(type_text(a) for a in args) + "]"
        return f"list[{type_text(args[0]) if args else 'any'}]"
    if origin is dict or tp is dict:
        return "mapping"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _summary(cls: type) -> str:
    """The first paragraph of the class docstring, on one line ("" for a generated one)."""
    import inspect

    doc = inspect.cleandoc(cls.__doc__ or "")
    if not doc or doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def _doc_sections(cfg: Any, cls: type, key: str, note: str, out: list[str]) -> None:
    """A heading and a table for section `cls` at dotted `key` (`cfg`: its default value,
    None for the defaults of `cls`; `note`: the comment of the field holding it), then its
    sub-sections."""
    from rljax.config import field_comments

    comments = field_comments(cls)
    hints = typing.get_type_hints(cls, include_extras=True)
    plain_hints = typing.get_type_hints(cls)
    out += [f"### `{key}`", ""]
    for text in (note, _summary(cls)):
        if text:
            out += [text, ""]
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    subsections = []
    for f in dataclasses.fields(cls):
        section = _section_class(plain_hints[f.name])
        value = _value(cfg, f)
        comment = _comment(f, comments)
        if section is not None:
            off = value is None
            subsections.append((None if off or value is dataclasses.MISSING else value, section, f"{key}.{f.name}",
                                "Null (off) by default." if off else ""))
            kind, default = ("section \\| null", "null") if off else ("section", "its keys below")
        else:
            default = "(required)" if value is dataclasses.MISSING else f"`{_cell(_flow(value))}`"
            kind = f"`{_cell(type_text(hints[f.name]))}`"
        out.append(f"| `{key}.{f.name}` | {kind} | {default} | {_cell(comment)} |")
    out.append("")
    for value, section, sub_key, sub_note in subsections:
        _doc_sections(value, section, sub_key, sub_note, out)


def config_docs() -> str:
    """docs/config.md: every key of both run configs (see the module docstring)."""
    from rljax.config import field_comments
    from rljax.rl.config import RLConfig
    from rljax.train.run_config import RunConfig

    out = [
        "# Config reference",
        "",
        "Every key of the two run configs, with its type, default and description. Generated from",
        "the config dataclasses and their field comments by `rljax config docs > docs/config.md`;",
        "`tests/test_config_docs.py` fails when this file and the code differ.",
        "",
        "`rljax config show CONFIG [key.sub=value ...]` prints a config as a run reads it, each key",
        "with its description. `trainer.algorithm` picks the kind: `sft`, `rm` and `dpo` read the",
        "supervised config, the RL algorithms the RL config. Types: `int >= 1` and `float in [0, 1]`",
        "are checked ranges, `a | b` a closed set of words, `null` an unset optional value. An alias",
        "is a second name of a key; a config keeps and saves the key's own name.",
        "",
    ]
    for title, root in (("Supervised runs (`trainer.algorithm`: sft, rm, dpo)", RunConfig),
                        ("RL runs (`trainer.algorithm`: grpo, ppo, dapo, ...)", RLConfig)):
        out += [f"## {title}", ""]
        summary = _summary(root)
        if summary:
            out += [summary, ""]
        instance = root()
        comments = field_comments(root)
        hints = typing.get_type_hints(root)
        for f in dataclasses.fields(root):
            value = getattr(instance, f.name)
            note = f"`{f.name}`: {comments[f.name]}" + (" (null by default)" if value is None else "")
            _doc_sections(value, _section_class(hints[f.name]), f.name, note, out)
    return "\n".join(out).rstrip("\n") + "\n"
