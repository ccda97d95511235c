"""Shared output for benchmarks: one printed table plus a JSON file."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time


def environment() -> dict:
    import jax

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": commit,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))


def write_json(path: str, name: str, rows: list[dict], extra: dict | None = None) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"bench": name, "env": environment(), "rows": rows, **(extra or {})}, f, indent=2)
    print(f"wrote {path}")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
