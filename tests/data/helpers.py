"""Small helpers shared by the data tests."""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def write_jsonl(path: os.PathLike | str, rows: list[Any], raw_lines: dict[int, str] | None = None) -> str:
    """Write rows as JSON lines; `raw_lines[i]` replaces line i (0-based) verbatim."""
    lines = [json.dumps(r) for r in rows]
    for i, text in (raw_lines or {}).items():
        lines.insert(i, text)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def write_parquet(path: os.PathLike | str, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def sft_row(q: str, a: str) -> dict:
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
