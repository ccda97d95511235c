"""`rljax bench moe` at a tiny shape: both passes and implementations timed, the
dispatch agreeing with the dense all-experts reference, the JSON written."""

import json

import pytest

from rljax import cli

pytestmark = pytest.mark.slow


def test_moe_bench_tiny(tmp_path):
    out = tmp_path / "moe.json"
    assert cli.main(["bench", "moe", "--tokens", "64", "--hidden", "16", "--experts", "4", "--expert-width", "8",
                     "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["pass"], r["impl"]) for r in rows] == [("fwd", "dispatch"), ("fwd", "dense"),
                                                      ("fwd+bwd", "dispatch"), ("fwd+bwd", "dense")]
    assert all(r["median_ms"] > 0 and r["max_rel_diff"] < 1e-5 for r in rows)
    assert rows[0]["speedup_x"] > 0 and rows[1]["speedup_x"] == 1.0
