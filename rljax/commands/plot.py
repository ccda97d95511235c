"""`rljax plot RUN_DIR [--out DIR]`: PNG charts of a run's `metrics.jsonl`.

One PNG per metric group that the run logged (reward, KL, entropy, response length, clip
fraction, loss, validation), and ``overview.png`` with all of them; absent metrics are
skipped. Needs matplotlib (``pip install rljax[plot]``).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import sys
from typing import Any

HELP = "Plot a run's metrics.jsonl (reward, KL, entropy, length, clip fraction, loss, validation) as PNGs."

# group name -> (title, y-axis label with its unit, metric names or glob patterns)
GROUPS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "reward": ("Reward", "mean score per response", ("critic/score/mean", "critic/rewards/mean")),
    "kl": ("KL", "nats per token", ("actor/ppo_kl", "actor/kl_loss")),
    "entropy": ("Entropy", "nats per token", ("actor/entropy",)),
    "response_length": ("Response length", "tokens", ("response_length/mean",)),
    "clipfrac": ("Clip fraction", "fraction of tokens", ("actor/pg_clipfrac",)),
    "loss": ("Loss", "loss (nats per token for SFT)", ("train/loss", "actor/loss", "critic/loss")),
    "validation": ("Validation (val-core)", "held-out accuracy", ("val-core/*",)),
}
SMOOTHING = 0.8  # weight of the past in the plotted moving average (TensorBoard's slider)


def smooth(values: list[float], weight: float = SMOOTHING) -> list[float]:
    """Debiased exponential moving average, as TensorBoard smooths: with
    m_i = w m_{i-1} + (1 - w) x_i, m_0 = 0, the plotted value is m_i / (1 - w^(i+1)),
    so the first point is x_0 and no start-up bias pulls the line towards 0."""
    out, m = [], 0.0
    for i, x in enumerate(values):
        m = weight * m + (1.0 - weight) * x
        out.append(m / (1.0 - weight ** (i + 1)))
    return out


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", help="run directory containing metrics.jsonl")
    parser.add_argument("--out", default=None, help="output directory (default: RUN_DIR/plots)")


def read_metrics(path: str) -> dict[str, tuple[list[float], list[float]]]:
    """metrics.jsonl -> {metric: (steps, values)}; non-finite values, non-numeric fields
    and a torn last line (a run still writing) are skipped."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if n == len(lines):
                break
            raise ValueError(f"{path}:{n}: not JSON ({e})") from e
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(f"{path}:{n}: expected an object with a 'step' key")
        step = float(row["step"])
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                steps, values = series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return series


def group_series(series: dict[str, Any]) -> dict[str, list[str]]:
    """group -> present metric names (in declaration order; globs sorted)."""
    present: dict[str, list[str]] = {}
    for group, (_, _, patterns) in GROUPS.items():
        names: list[str] = []
        for pattern in patterns:
            matches = sorted(k for k in series if fnmatch.fnmatchcase(k, pattern))
            names += [m for m in matches if m not in names]
        if names:
            present[group] = names
    return present


def _import_pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("rljax plot needs matplotlib: pip install rljax[plot]  (or pip install matplotlib)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw(ax, group: str, names: list[str], series) -> None:
    """Each metric's raw points, faint, under its smoothed line (same colour)."""
    title, ylabel, _ = GROUPS[group]
    for name in names:
        steps, values = series[name]
        raw = ax.plot(steps, values, linewidth=0.8, alpha=0.3, marker="o" if len(steps) < 20 else None,
                      markersize=3)[0]
        ax.plot(steps, smooth(values), color=raw.get_color(), linewidth=1.6, label=name)
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")


def plot_run(run_dir: str, out_dir: str | None = None) -> list[str]:
    """Write the PNGs for `run_dir`; returns their paths (overview last)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir!r} (log with trainer.logger including 'jsonl')")
    series = read_metrics(path)
    groups = group_series(series)
    if not groups:
        raise ValueError(f"{path} has none of the plotted metrics ({', '.join(p for _, ps in GROUPS.values() for p in ps)})")
    plt = _import_pyplot()
    out_dir = out_dir or os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    written: list[str] = []
    for group, names in groups.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        _draw(ax, group, names, series)
        fig.tight_layout()
        written.append(os.path.join(out_dir, f"{group}.png"))
        fig.savefig(written[-1], dpi=100)
        plt.close(fig)
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.6 * rows), squeeze=False)
    for ax, (group, names) in zip(axes.flat, groups.items()):
        _draw(ax, group, names, series)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    fig.tight_layout()
    written.append(os.path.join(out_dir, "overview.png"))
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    return written


def main(args) -> int:
    try:
        paths = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"rljax plot: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(f"wrote {p}")
    return 0
