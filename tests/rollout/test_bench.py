"""`rljax bench sampler` runs end to end on tiny shapes and reports what it should."""

import json

import pytest

from rljax.cli import main

pytestmark = pytest.mark.slow


def test_bench_sampler_tiny(tmp_path, capsys):
    out = tmp_path / "sampler.json"
    code = main(["bench", "sampler", "--preset", "tiny", "--batch-sizes", "2", "--prompt-len", "8",
                 "--new-tokens", "4", "--share-n", "2", "--share-prompts", "1", "--share-prompt-len", "20",
                 "--repeats", "1", "--torch-threads", "1", "--rl-prompts", "2", "--rl-n", "2",
                 "--rl-concurrency", "2", "--rl-max-tokens", "6", "--rl-mean-len", "3", "--agent-episodes", "2",
                 "--agent-turns", "2", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["batch"] == 2 and row["rljax_tok_s"] > 0 and row["hf_tok_s"] > 0 and row["ratio"] > 0
    shared, unshared = result["memory"]
    assert shared["prefix_sharing"] and not unshared["prefix_sharing"]
    assert shared["peak_pages"] < unshared["peak_pages"]
    assert result["compiled_programs"] >= 2
    rl, agent = result["workloads"]
    # rl: 2 prompts x 2 samples; agent: 2 episodes x 2 turns; each response ends at a stop id or 6 tokens
    for row, responses in ((rl, 4), (agent, 4)):
        for system in ("dense", "split", "mixed", "hf"):  # dense: split steps on the reference attention
            assert responses <= row[f"{system}_tokens"] <= responses * 6 and row[f"{system}_tok_s"] > 0
        # the same seeded requests: the same work
        assert row["dense_tokens"] == row["split_tokens"] == row["mixed_tokens"]
        assert row["mixed_wait_s"] == 0  # no call left a decode waiting
        assert row["mixed_vs_split"] > 0 and row["mixed_vs_dense"] > 0 and row["mixed_vs_hf"] > 0
    assert (rl["workload"], agent["workload"], agent["turns"]) == ("rl", "agent", 2)
    assert "mixed_tok_s" in capsys.readouterr().out


def test_bench_sampler_no_hf_needs_no_torch(tmp_path, monkeypatch):
    """`--no-hf` (e.g. an accelerator machine without torch) builds the model in rljax and
    never imports torch."""
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch.") or name == "transformers":
            raise ImportError(f"{name} is not available here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    out = tmp_path / "sampler.json"
    assert main(["bench", "sampler", "--preset", "tiny", "--batch-sizes", "2", "--prompt-len", "8",
                 "--new-tokens", "4", "--share-n", "2", "--share-prompts", "1", "--share-prompt-len", "20",
                 "--repeats", "1", "--no-hf", "--rl-prompts", "1", "--rl-n", "2", "--rl-concurrency", "2",
                 "--rl-max-tokens", "4", "--agent-episodes", "0", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["rows"][0]["rljax_tok_s"] > 0 and "hf_tok_s" not in result["rows"][0]
    (rl,) = result["workloads"]
    assert rl["split_tokens"] >= 2 and rl["mixed_tokens"] >= 2 and "hf_tokens" not in rl
