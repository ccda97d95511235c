import json
import math
import os

import pytest

from rljax.cli import main as cli_main
from rljax.commands.plot import group_series, plot_run, read_metrics

pytest.importorskip("matplotlib")


def write_run(run_dir, steps=30, torn_tail=False):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            row = {
                "step": s,
                "critic/score/mean": 1 - math.exp(-s / 10),
                "actor/ppo_kl": 0.001 * s,
                "actor/kl_loss": 0.002 * s,
                "actor/entropy": 2.0 * math.exp(-s / 20),
                "response_length/mean": 100 + 3 * s,
                "actor/pg_clipfrac": 0.05 + 0.01 * math.sin(s),
                "timing_s/gen": 1.0,
            }
            if s % 10 == 0:
                row["val-core/openai/gsm8k/acc/mean@4"] = s / 40
                row["val-core/synthetic/reverse/acc/mean@1"] = s / 60
            if s == 3:
                row["actor/entropy"] = float("nan")
            f.write(json.dumps(row) + "\n")
        if torn_tail:
            f.write('{"step": 31, "critic/sc')


def test_plot_writes_pngs(tmp_path):
    run = str(tmp_path / "run")
    write_run(run, torn_tail=True)
    paths = plot_run(run)
    names = sorted(os.path.basename(p) for p in paths)
    assert names == sorted(["reward.png", "kl.png", "entropy.png", "response_length.png", "clipfrac.png",
                            "validation.png", "overview.png"])  # no train/loss logged: no loss.png
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(p) > 5000
    assert os.path.dirname(paths[0]) == os.path.join(run, "plots")


def test_read_and_group(tmp_path):
    run = str(tmp_path / "r")
    write_run(run, steps=12)
    series = read_metrics(os.path.join(run, "metrics.jsonl"))
    assert len(series["actor/entropy"][0]) == 11  # the NaN is skipped
    groups = group_series(series)
    assert groups["kl"] == ["actor/ppo_kl", "actor/kl_loss"]
    assert groups["validation"] == ["val-core/openai/gsm8k/acc/mean@4", "val-core/synthetic/reverse/acc/mean@1"]
    assert "loss" not in groups


def test_cli(tmp_path, capsys):
    run = str(tmp_path / "sft")
    os.makedirs(run)
    with open(os.path.join(run, "metrics.jsonl"), "w") as f:
        for s in range(5):
            f.write(json.dumps({"step": s, "train/loss": 3.0 / (s + 1)}) + "\n")
    out = str(tmp_path / "charts")
    assert cli_main(["plot", run, "--out", out]) == 0
    assert sorted(os.listdir(out)) == ["loss.png", "overview.png"]
    assert cli_main(["plot", str(tmp_path / "missing")]) == 1
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    import sys

    run = str(tmp_path / "r")
    write_run(run, steps=3)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(RuntimeError, match=r"pip install rljax\[plot\]"):
        plot_run(run)
    assert cli_main(["plot", run]) == 1
    assert "rljax[plot]" in capsys.readouterr().err


def test_smoothing_is_tensorboards_debiased_moving_average():
    from rljax.commands.plot import smooth

    # w = 0.5: m = 0.5, 1.25, 2.625 over debias 0.5, 0.75, 0.875 (hand-computed)
    assert smooth([1.0, 2.0, 4.0], weight=0.5) == pytest.approx([1.0, 5 / 3, 3.0])
    assert smooth([3.0] * 5) == pytest.approx([3.0] * 5)  # a constant stays itself: no bias toward 0
    assert smooth([]) == []


def test_each_plot_has_axis_labels_and_a_smoothed_line_over_the_raw_points(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rljax.commands.plot import _draw, smooth

    run = str(tmp_path / "run")
    write_run(run)
    series = read_metrics(os.path.join(run, "metrics.jsonl"))
    fig, ax = plt.subplots()
    _draw(ax, "kl", ["actor/ppo_kl", "actor/kl_loss"], series)
    assert ax.get_xlabel() == "training step" and ax.get_ylabel() == "nats per token"
    lines = ax.get_lines()
    assert len(lines) == 4  # raw and smoothed, per metric
    raw, smoothed = lines[0], lines[1]
    assert list(raw.get_ydata()) == series["actor/ppo_kl"][1] and raw.get_alpha() < 1
    assert list(smoothed.get_ydata()) == pytest.approx(smooth(series["actor/ppo_kl"][1]))
    assert smoothed.get_label() == "actor/ppo_kl" and smoothed.get_color() == raw.get_color()
    plt.close(fig)
