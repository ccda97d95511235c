"""`rljax bench code-reward`: a small batch through the command, every score checked by
the bench itself (right 1.0, wrong and hostile 0.0), the JSON read back."""

import json
import os

import pytest

from rljax.bench.code_reward import make_batch

OS_SANDBOX = "required" if (os.environ.get("CI") or os.environ.get("RLJAX_REQUIRE_BWRAP")) else "auto"


def test_batch_is_half_right_a_quarter_wrong_a_quarter_hostile():
    items, kinds = make_batch(16, 3)
    assert kinds.count("right") == 8 and kinds.count("wrong") == 4
    assert sorted(k for k in kinds if k not in ("right", "wrong")) == sorted(
        ["infinite_loop", "fork_bomb", "memory_hog", "stdout_flood"])
    assert {item["data_source"] for item in items} == {"codecontests"}
    gt = json.loads(items[0]["ground_truth"])
    assert gt["inputs"] == ["0 1\n", "1 3\n", "2 5\n"] and gt["outputs"] == ["1\n", "4\n", "7\n"]


@pytest.mark.slow
def test_bench_code_reward(tmp_path):
    from rljax.cli import main

    out = tmp_path / "code.json"
    assert main(["bench", "code-reward", "--samples", "8", "--tests", "2", "--test-timeout", "0.5",
                 "--sample-timeout", "1.0", "--os-sandbox", OS_SANDBOX, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["misscored"] == [] and result["rows"][0]["samples"] == 8 and result["rows"][0]["samples_per_s"] > 0
    assert [r["batch"] for r in result["rows"][1:]] == ["right", "wrong", "infinite_loop", "fork_bomb", "memory_hog",
                                                        "stdout_flood"]
