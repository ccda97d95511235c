"""The accelerator benchmarks (`rljax bench train|mismatch|step`) and `launch/gpu_bench.sh`.

The script's full (GPU) mode is checked by a dry run (the shapes the issue asks for);
its `--quick` mode is run for real, bench by bench with the script's own arguments, in
this process (one JAX start for all, on the 8-device CPU mesh), and every JSON it
writes is read back. (The sampler's bench, which the script also runs, is tested with
the sampler.)
"""

import json
import os
import shlex
import subprocess

import numpy as np
import pytest

from rljax import cli
from rljax.bench import mismatch, step, train
from rljax.models import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "launch", "gpu_bench.sh")


def dry_run(*flags: str) -> list[list[str]]:
    out = subprocess.run(["bash", SCRIPT, "--dry-run", *flags], cwd=ROOT, check=True, capture_output=True,
                         text=True, env={**os.environ, "OUT": "OUTDIR"}).stdout
    return [shlex.split(line) for line in out.splitlines() if line.strip()]


def bench_args(commands: list[list[str]], name: str) -> list[str]:
    """The arguments after `rljax.cli bench NAME` of the one command running that bench."""
    (cmd,) = [c for c in commands if "bench" in c and c[c.index("bench") + 1] == name]
    return cmd[cmd.index("bench") + 1 :]


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_script_parses():
    subprocess.run(["bash", "-n", SCRIPT], check=True)


def test_full_mode_runs_the_issue_shapes():
    commands = dry_run()
    assert commands[0][-1] == "tests/models/test_attention_backends.py"  # the real kernels first
    t = bench_args(commands, "train")
    assert (option(t, "--model"), option(t, "--seq-len"), option(t, "--dtype"), option(t, "--remat")) == (
        "qwen2.5-1.5b", "4096", "bfloat16", "full")
    assert "--torch" in t and option(t, "--out") == "OUTDIR/train.json"
    s = bench_args(commands, "sampler")
    assert (option(s, "--preset"), option(s, "--batch-sizes"), option(s, "--prompt-len"),
            option(s, "--new-tokens")) == ("qwen2.5-0.5b", "64,256", "128", "128")
    assert option(bench_args(commands, "mismatch"), "--dtypes") == "bfloat16"
    assert option(bench_args(commands, "step"), "--model") == "qwen2.5-0.5b"
    assert "--torch" not in bench_args(dry_run("--no-torch"), "train")
    assert not any("pytest" in c for c in dry_run("--no-tests"))


@pytest.fixture(scope="module")
def quick_commands():
    commands = dry_run("--quick")
    assert not any("pytest" in c for c in commands)
    return commands


def run_quick(commands, name: str, tmp_path) -> list[dict]:
    """Run bench `name` with the script's --quick arguments, in this process."""
    import torch

    threads = torch.get_num_threads()
    args = bench_args(commands, name)
    assert "tiny" in args
    args[args.index("--out") + 1] = str(tmp_path / f"{name}.json")
    try:
        assert cli.main(["bench", *args]) == 0
    finally:
        torch.set_num_threads(threads)
    return json.load(open(tmp_path / f"{name}.json"))["rows"]


@pytest.mark.slow
def test_quick_train(quick_commands, tmp_path):
    ours, theirs = run_quick(quick_commands, "train", tmp_path)
    assert ours["system"] == "rljax" and theirs["system"] == "torch"
    assert ours["tok_s"] > 0 and np.isfinite(ours["loss"]) and theirs["ratio"] > 0
    assert ours["attention"] == "xla"  # auto on CPU


@pytest.mark.slow
def test_quick_mismatch(quick_commands, tmp_path):
    (row,) = run_quick(quick_commands, "mismatch", tmp_path)
    assert row["attention"] == "auto->xla" and row["tokens"] == 2 * 2 * 8
    assert 0 <= row["mean_abs"] <= row["max_abs"] < 0.1
    assert row["rollout_vs_fp32_max"] < 0.1 and row["trainer_vs_fp32_max"] < 0.1


@pytest.mark.slow
def test_quick_step(quick_commands, tmp_path):
    (row,) = run_quick(quick_commands, "step", tmp_path)
    for key in ("gen", "ref", "update_actor", "step"):
        assert row[key] > 0, key
    assert row["old_log_prob"] is None  # one update per step: the update gives the old log-probs
    assert row["step"] >= row["gen"] + row["update_actor"]
    assert row["rows"] == 8


# ---- pieces ------------------------------------------------------------------------------


def test_presets_and_config_json(tmp_path):
    qwen15 = train.model_config("qwen2.5-1.5b")
    assert 1.4e9 < qwen15.num_params() < 1.6e9 and qwen15.head_dim == 128 and qwen15.tie_word_embeddings
    assert 7.0e9 < train.model_config("qwen2.5-7b").num_params() < 7.7e9
    path = tmp_path / "config.json"
    path.write_text(json.dumps(qwen15.to_hf_dict()))
    assert train.model_config(str(path)) == qwen15.replace(initializer_range=qwen15.initializer_range)
    assert train.model_config(str(tmp_path)).hidden_size == 1536  # a folder holding config.json
    with pytest.raises(SystemExit, match="not a preset"):
        train.model_config("qwen9-100b")


def test_flops_formula_states_flops_per_token():
    config = ModelConfig(model_type="qwen2", vocab_size=100, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4)
    n = config.num_params(include_embedding=False) + 100 * 16
    assert config.flops_per_token(64) == 3 * (2 * n + 2 * 2 * 64 * 4 * 4)
    assert f"{config.flops_per_token(64):.4g}" in train.flops_formula(config, 64)


def test_make_batch_packs_segments():
    b = train.make_batch(2, 12, 50, segments=3)
    np.testing.assert_array_equal(b["segment_ids"][0], [1] * 4 + [2] * 4 + [3] * 4)
    np.testing.assert_array_equal(b["positions"][1], [0, 1, 2, 3] * 3)
    np.testing.assert_array_equal(b["loss_mask"][0], [0, 1, 1, 1] * 3)
    assert b["input_ids"].max() < 50


def test_rollout_rows_align_logprobs_with_ids():
    from rljax.rollout import Completion

    c = [Completion(0, 0, [5, 6, 7], [8, 9], [-1.0, -2.0], "length"), Completion(0, 1, [5], [4], [-3.0], "length")]
    ids, mask, response, logprobs = mismatch.rollout_rows(c)
    assert ids.shape == (2, 16)
    np.testing.assert_array_equal(ids[0, :6], [5, 6, 7, 8, 9, 0])
    np.testing.assert_array_equal(response[0, :6], [0, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(logprobs[0, :6], [0, 0, 0, -1, -2, 0])
    np.testing.assert_array_equal(mask[1, :3], [1, 1, 0])
    assert logprobs[1, 1] == -3.0


def test_step_config_is_a_grpo_run_with_a_reference(tmp_path):
    # the reward is scored in a worker process in every mode (inline, it would wait on the trainer's main thread)
    args = cli.build_parser().parse_args(["bench", "step", "--model", "tiny", "--prompts", "4", "--n", "2"])
    cfg = step.build_config(args, str(tmp_path))
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.actor.use_kl_loss and cfg.reward.mode == "process"
    assert cfg.data.batch_size == 4 and cfg.rollout.n == 2 and cfg.rollout.max_num_seqs == 8
    assert cfg.data.train_files[0].startswith("synthetic:arithmetic/rl?n=")
    assert cfg.model.hf_config["hidden_size"] == train.PRESETS["tiny"]["hidden_size"]


@pytest.mark.slow
def test_bench_agent_scripted_and_with_a_model(tmp_path):
    """`rljax bench agent`: the scripted comparison, then the real-model mode on a tiny
    random policy exported with the char tokenizer (it may or may not call the tool)."""
    from flax import nnx

    from rljax.cli import main
    from rljax.data.tokenizer import build_char_tokenizer
    from rljax.models import ModelConfig, save_hf
    from rljax.models.transformer import Decoder

    out = tmp_path / "agent.json"
    assert main(["bench", "agent", "--episodes", "8", "--sampler-latency", "0.02", "--tool-latency", "0.02",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "scripted" and result["speedup"] > 2  # 8 overlapping episodes vs one at a time

    tok = build_char_tokenizer()
    cfg = ModelConfig.from_hf_dict(dict(model_type="qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, vocab_size=len(tok),
                                        eos_token_id=tok.eos_token_id, tie_word_embeddings=True))
    save_hf(Decoder(cfg, rngs=nnx.Rngs(0)), str(tmp_path / "policy"), tokenizer=tok)
    assert main(["bench", "agent", "--model", str(tmp_path / "policy"), "--episodes", "4", "--max-tokens", "16",
                 "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "model" and result["num_episodes"] == 4
    for mode in ("concurrent", "sequential"):
        assert result[f"{mode}_episodes_per_s"] > 0 and 0.0 <= result[f"{mode}_tool_use_rate"] <= 1.0


@pytest.mark.slow
def test_bench_rollout_replicas_do_an_eighth_of_the_work(tmp_path):
    """`rljax bench rollout` at a tiny size: 8 replicas of one device sample the tokens of
    the sampler on the training mesh, each device generating 1/8 of them with 1/8 of the
    KV bytes (the same total pages)."""
    out = tmp_path / "rollout.json"
    assert cli.main(["bench", "rollout", "--prompts", "8", "--n", "2", "--prompt-len", "8", "--max-tokens", "8",
                     "--tp", "1", "--out", str(out)]) == 0
    mesh, replicas = json.loads(out.read_text())["rows"]
    assert (mesh["tp"], replicas["replicas"], replicas["tp"]) == (0, 8, 1)
    assert mesh["same_tokens"] is None and replicas["same_tokens"] is True  # the mesh sampler is the reference
    assert mesh["tokens_per_device"] == 8 * 2 * 8 == 8 * replicas["tokens_per_device"]
    assert mesh["kv_bytes_per_device"] == 8 * replicas["kv_bytes_per_device"]
    assert replicas["handoff_s"] > 0 and replicas["handoff_bytes_per_device"] > 0
    assert 0 < replicas["decode_mflops_per_device"] < mesh["decode_mflops_per_device"]
    assert replicas["decode_collectives"] == 0 < mesh["decode_collectives"]  # a replica of one device talks to none


def test_routing_differs_counts_tokens_whose_expert_set_changed():
    recorded = np.array([[[[0, 1]], [[2, 3]], [[4, 5]], [[-1, -1]]]])  # [1, 4, L=1, k=2]
    own = np.array([[[[1, 0]], [[2, 4]], [[4, 5]], [[6, 7]]]])  # order within the set ignored
    np.testing.assert_array_equal(mismatch.routing_differs(recorded, own), [False, True, False])


@pytest.mark.slow
def test_mismatch_reports_routing_replay_on_a_moe(tmp_path):
    out = tmp_path / "mismatch.json"
    assert cli.main(["bench", "mismatch", "--model", "tiny-moe", "--dtypes", "float32", "--attention", "xla",
                     "--init-std", "0.2", "--seeds", "2", "--prompts", "2", "--n", "2", "--prompt-len", "8",
                     "--new-tokens", "8", "--out", str(out)]) == 0
    report = json.load(open(out))
    rows = report["rows"]
    assert [r["seed"] for r in rows] == [0, 1] and all(r["tokens"] == 2 * 2 * 8 for r in rows)
    for r in rows:  # float32 on both sides: the same routing, and replaying it changes nothing
        assert r["routing_differs_pct"] == 0.0
        assert r["replay_max_abs"] < 1e-4 and r["max_abs"] < 1e-4
    (summary,) = report["summary"]
    assert summary["seeds"] == 2 and " +- " in summary["replay_max_abs"]


def _saved_tiny_model(tmp_path):
    """A one-layer llama with the char tokenizer, saved as a Hugging Face folder."""
    from rljax.data.tokenizer import build_char_tokenizer
    from rljax.models import init_model, save_hf
    from tests.tiny_models import CHAR_VOCAB

    folder = tmp_path / "tiny-hf"
    config = ModelConfig(model_type="llama", vocab_size=CHAR_VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         tie_word_embeddings=True)
    save_hf(init_model(config), str(folder), tokenizer=build_char_tokenizer())
    return folder


@pytest.mark.slow
def test_step_on_saved_weights_without_kl(tmp_path):
    """`--path`: the weights and tokenizer of a saved model folder; `--kl-coef 0`: no
    reference forward; one update per batch: no old log-prob forward either."""
    folder = _saved_tiny_model(tmp_path)
    out = tmp_path / "step.json"
    assert cli.main(["bench", "step", "--path", str(folder), "--kl-coef", "0", "--prompts", "4", "--n", "2",
                     "--response-length", "8", "--max-prompt-length", "64", "--dtype", "float32", "--steps", "1",
                     "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["model"] == "tiny-hf" and row["rows"] == 8
    assert row["old_log_prob"] is None and row["ref"] is None
    assert row["gen"] > 0 and row["update_actor"] > 0 and row["peak_GiB"] > 0


@pytest.mark.slow
def test_step_side_by_side_with_trl(tmp_path):
    """`--trl`: TRL's GRPOTrainer runs the same work on the same saved weights in its own
    process; both rows, the table and the ratios are written."""
    folder = _saved_tiny_model(tmp_path)
    out = tmp_path / "step.json"
    assert cli.main(["bench", "step", "--path", str(folder), "--kl-coef", "0", "--prompts", "4", "--n", "2",
                     "--response-length", "8", "--max-prompt-length", "64", "--dtype", "float32", "--steps", "2",
                     "--trl", "--out", str(out)]) == 0
    trl = json.loads(out.read_text())["trl"]
    assert len(trl["rows"]) == 2  # one per optimizer step of 8 completions
    for row in trl["rows"]:
        assert row["gen"] > 0 and row["update"] > 0 and row["step"] >= row["gen"] + row["update"] - 1e-6
        assert row["peak_GiB"] > 0
    ours, theirs = trl["table"]
    assert (ours["system"], theirs["system"]) == ("rljax", "trl")
    assert trl["step_trl_over_rljax"] == pytest.approx(theirs["step"] / ours["step"])


def test_trl_needs_real_weights(capsys):
    assert cli.main(["bench", "step", "--trl", "--steps", "1"]) == 1
    assert "--trl runs TRL on real weights next to the sync step: give --path" in capsys.readouterr().err
