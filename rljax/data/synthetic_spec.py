"""`synthetic:` dataset specs in `data.train_files` / `data.val_files`.

    synthetic:arithmetic/sft?n=2000&seed=0&digits=2

names a synthetic task (`rljax.data.synthetic`; the tool-use task ``tool_arithmetic`` of
`rljax.data.synthetic_tools`; the code task ``code`` of `rljax.data.synthetic_code`), a row format (sft | preference | rl) and its knobs, e.g.

    synthetic:tool_arithmetic/sft?n=4000&seed=0&max_digits=3&tool_fraction=0.5

Before reading, a run writes each spec once to a JSONL file in its own data folder, so
configs need no data download and runs stay reproducible.
"""

from __future__ import annotations

import hashlib
import os
import re
from urllib.parse import parse_qsl

import yaml

from rljax.data import synthetic_code, synthetic_tools
from rljax.data.synthetic import make_rows, write_rows

# Row makers of the tasks outside `rljax.data.synthetic`.
_MAKERS = {task: module.make_rows for module in (synthetic_tools, synthetic_code) for task in module.TASKS}

_SPEC = re.compile(r"^synthetic:(?P<task>[\w-]+)/(?P<format>\w+)(?:\?(?P<query>.*))?$")


def _knob(text: str) -> object:
    """A knob's value: its YAML reading (numbers, booleans), or the text itself where it is
    not a YAML scalar (a template like ``{spec} Reply with code only.``)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is None or isinstance(value, (str, int, float, bool)) else text


def is_spec(path: str) -> bool:
    return path.startswith("synthetic:")


def materialize(files: list[str], directory: str, split: str = "train") -> list[str]:
    """Replace every `synthetic:` spec by the path of a JSONL file holding its rows."""
    out = []
    for path in files:
        if not is_spec(path):
            out.append(path)
            continue
        match = _SPEC.match(path)
        if not match:
            raise ValueError(f"data file {path!r}: expected synthetic:<task>/<format>?n=...&seed=...")
        knobs = {k: _knob(v) for k, v in parse_qsl(match["query"] or "")}
        n = int(knobs.pop("n", 1000))
        seed = int(knobs.pop("seed", 0))
        digest = hashlib.sha1(path.encode()).hexdigest()[:10]
        target = os.path.join(directory, f"{match['task']}_{match['format']}_{split}_{digest}.jsonl")
        if not os.path.exists(target):
            make = _MAKERS.get(match["task"], make_rows)
            rows = make(match["format"], n, seed=seed, task=match["task"], split=split, **knobs)
            tmp = f"{target}.{os.getpid()}.tmp.jsonl"  # processes on one host may race
            write_rows(rows, tmp)
            os.replace(tmp, target)
        out.append(target)
    return out
