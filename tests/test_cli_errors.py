"""`rljax` prints a known error (config, data, model, checkpoint, sampler) as one or two
lines naming the problem and exits non-zero; `--debug` or RLJAX_DEBUG=1 shows the
traceback. A config error stops `rljax train` before anything is built."""

import os
import re
import subprocess
import sys
import time

import pytest

from rljax import cli
from rljax.config import ConfigError
from rljax.data.errors import DataError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(REPO, "configs", "quickstart.yaml")
SFT = os.path.join(REPO, "configs", "sft_tiny.yaml")


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a trainer starts: config errors must stop `train` before."""
    import rljax.rl.trainer
    import rljax.train.loop

    def started(cfg):
        raise AssertionError("a trainer started")

    monkeypatch.setattr(rljax.rl.trainer, "train_rl", started)
    monkeypatch.setattr(rljax.train.loop, "train", started)
    monkeypatch.delenv("RLJAX_DEBUG", raising=False)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("argv,message", [
    ([QUICKSTART, "rollout.n=0"], r"^rljax: error: rollout\.n: must be >= 1, got 0$"),
    ([QUICKSTART, "actor.ppo_epochs=0"], r"^rljax: error: actor\.ppo_epochs: must be >= 1"),
    ([QUICKSTART, "actor.loss_agg_mode=mean"], r"^rljax: error: actor\.loss_agg_mode: unknown 'mean'"),
    ([QUICKSTART, "rollout.response_length=0"], r"^rljax: error: rollout\.response_length: must be >= 1"),
    ([QUICKSTART, "data.train_batch_size=20"],
     r"^rljax: error: data\.batch_size=20 is not a multiple of actor\.ppo_mini_batch_size=32"),
    ([QUICKSTART, "trainer.algorithm=grpoo"], r"^rljax: error: trainer\.algorithm: unknown 'grpoo'; did you mean 'grpo'"),
    ([SFT, "trainer.algorithm=grpoo"], r"^rljax: error: trainer\.algorithm: unknown 'grpoo'; did you mean 'grpo'"),
    ([SFT, "optim.lr=-1"], r"^rljax: error: optim\.lr: must be >= 0, got -1"),
    ([SFT, "trainer.save_freq=-1"], r"^rljax: error: trainer\.save_freq: must be >= 0"),
    ([SFT, "optim.lrr=1"], r"^rljax: error: unknown config key 'optim\.lrr'; did you mean 'lr'\?"),
    ([QUICKSTART, "optim.lr=1e-5"],
     r"^rljax: error: unknown config key 'optim\.lr'; did you mean 'actor\.optim\.lr' \(or 'critic\.optim\.lr'\)\?$"),
    ([QUICKSTART, "actor.lr=1e-5"], r"^rljax: error: unknown config key 'actor\.lr'; did you mean 'actor\.optim\.lr'\?$"),
    ([SFT, "lr=1e-5"], r"^rljax: error: unknown config key 'lr'; did you mean 'optim\.lr'\?$"),
    ([QUICKSTART, "mesh.data=3"], r"^rljax: error: mesh: .* devices are not divisible by 3"),
    ([os.path.join(REPO, "configs", "nope.yaml")], r"^rljax: error: .*No such file or directory.*nope\.yaml"),
    # a model of ~800B parameters: the memory plan does not fit this machine, at any micro-batch
    ([QUICKSTART, "model.hf_config.hidden_size=32768", "model.hf_config.intermediate_size=65536",
      "model.hf_config.num_hidden_layers=64", "model.hf_config.num_attention_heads=64",
      "model.hf_config.num_key_value_heads=8", "warmup_sft.enable=false"],
     r"^rljax: error: memory: the plan needs [\d.]+ GiB \(8 device\(s\) x .* free: no micro-batch fits, not even with model\.remat=full"),
])
def test_train_config_errors_are_one_line_before_any_work(no_training, capsys, argv, message):
    start = time.monotonic()
    code, err = run_cli(capsys, "train", *argv)
    assert code == (1 if "nope" in argv[0] else 2)
    lines = err.splitlines()
    assert len(lines) <= 2 and "Traceback" not in err, err
    assert re.match(message, lines[0]), err
    assert time.monotonic() - start < 30


def test_rl_config_without_algorithm_says_so(no_training, capsys, tmp_path):
    cfg = tmp_path / "rl.yaml"
    cfg.write_text("rollout: {n: 4}\nactor: {ppo_epochs: 1}\n")
    code, err = run_cli(capsys, "train", str(cfg))
    assert code == 2 and re.match(r"rljax: error: trainer\.algorithm: not set, .* RL sections \(actor, rollout\)", err)


@pytest.mark.parametrize("argv", [["train"], ["train", "--debug"], ["--debug", "train"], ["config"]])
def test_a_command_without_its_arguments_prints_its_usage(no_training, capsys, argv):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"usage: rljax {argv[-1] if argv[-1] != '--debug' else argv[0]} ")
    assert "positional arguments:" in err and "required" not in err


def test_eval_config_error_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("RLJAX_DEBUG", raising=False)
    code, err = run_cli(capsys, "eval", QUICKSTART, "rollout.val_kwargs.n=0")
    assert code == 2 and err.splitlines()[0] == "rljax: error: rollout.val_kwargs.n: must be >= 1, got 0"


def test_yaml_syntax_error_is_one_line(no_training, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {algorithm: grpo\n  total_steps: [\n")
    code, err = run_cli(capsys, "train", str(bad))
    assert code == 2 and len(err.splitlines()) <= 2 and "Traceback" not in err
    assert "bad.yaml" in err


@pytest.fixture
def failing_command(monkeypatch):
    """`rljax train` replaced by a command that raises the exception under test."""
    import rljax.commands.train as train_command

    box = {}

    def main(args):
        raise box["error"]

    monkeypatch.setattr(train_command, "main", main)
    monkeypatch.delenv("RLJAX_DEBUG", raising=False)
    return box


def raise_from_rljax():
    """A plain ValueError raised by rljax code (here: the optimizer's schedule lookup)."""
    from rljax.train.optim import OptimConfig, make_schedule

    make_schedule(OptimConfig(lr_scheduler_type="nope"), 10)


@pytest.mark.parametrize("error,code,text", [
    (DataError("expected a string", file="train.jsonl", row=3, key="messages[1].content"), 1,
     "train.jsonl: row 3"),
    (ConfigError("rollout.n: must be >= 1, got 0"), 2, "rollout.n"),
    (FileNotFoundError(2, "No such file or directory", "/ckpt/run"), 1, "/ckpt/run"),
])
def test_known_errors_print_one_line(failing_command, capsys, error, code, text):
    failing_command["error"] = error
    got, err = run_cli(capsys, "train", "x.yaml")
    assert got == code and len(err.splitlines()) <= 2 and "Traceback" not in err
    assert err.startswith("rljax: error: ") and text in err.splitlines()[0]


def test_value_error_raised_by_rljax_code_is_one_line(failing_command, capsys):
    try:
        raise_from_rljax()
    except ValueError as e:
        failing_command["error"] = e
    code, err = run_cli(capsys, "train", "x.yaml")
    assert code == 1 and err.splitlines()[0].startswith("rljax: error: optim.lr_scheduler_type")


def test_a_bug_keeps_its_traceback(failing_command):
    failing_command["error"] = ZeroDivisionError("division by zero")
    with pytest.raises(ZeroDivisionError):
        cli.main(["train", "x.yaml"])


def test_debug_flag_and_env_show_the_traceback(failing_command, monkeypatch):
    failing_command["error"] = ConfigError("rollout.n: must be >= 1, got 0")
    with pytest.raises(ConfigError):
        cli.main(["--debug", "train", "x.yaml"])
    with pytest.raises(ConfigError):
        cli.main(["train", "x.yaml", "--debug"])
    monkeypatch.setenv("RLJAX_DEBUG", "1")
    with pytest.raises(ConfigError):
        cli.main(["train", "x.yaml"])


@pytest.mark.slow
def test_console_script_exit_status_and_stderr():
    """The real entry point, in a fresh process: one line, status 2, within seconds."""
    env = {k: v for k, v in os.environ.items() if k != "RLJAX_DEBUG"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rljax.cli", "train", QUICKSTART, "rollout.n=0"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[0] == "rljax: error: rollout.n: must be >= 1, got 0"
    assert len(proc.stderr.strip().splitlines()) <= 2 and "Traceback" not in proc.stderr
    assert time.monotonic() - start < 60


def test_ctrl_c_is_one_line(capsys, monkeypatch):
    """A run that already said where it stopped (`checkpoint.close_after`) is not followed
    by a second line; an interrupt from elsewhere gets `rljax: interrupted`. Exit 130."""
    import rljax.rl.trainer

    monkeypatch.delenv("RLJAX_DEBUG", raising=False)
    for reported in (True, False):
        def interrupted(cfg, reported=reported):
            error = KeyboardInterrupt()
            if reported:
                print("interrupted at step 4: checkpoint .../2 is complete", file=sys.stderr)
                error.rljax_reported = True
            raise error

        monkeypatch.setattr(rljax.rl.trainer, "train_rl", interrupted)
        code, err = run_cli(capsys, "train", QUICKSTART)
        assert code == 130
        assert err.splitlines() == (["interrupted at step 4: checkpoint .../2 is complete"] if reported
                                    else ["rljax: interrupted"])


@pytest.mark.parametrize("model,message", [
    ("/nonexistent-model-dir", r"^rljax: error: --model /nonexistent-model-dir: no such model folder$"),
    ("{tmp}", r"^rljax: error: --model {tmp}: not a Hugging Face model folder \(no config\.json\)"),
    ("{tmp}/file", r"^rljax: error: --model {tmp}/file: not a folder"),
])
def test_generate_names_the_model_folder(capsys, tmp_path, monkeypatch, model, message):
    monkeypatch.delenv("RLJAX_DEBUG", raising=False)
    (tmp_path / "file").write_text("x")
    (tmp_path / "tokenizer.json").write_text("{}")  # a tokenizer alone is not a model
    code, err = run_cli(capsys, "generate", "--model", model.format(tmp=tmp_path), "--prompt", "hi")
    assert code != 0
    assert re.match(message.format(tmp=re.escape(str(tmp_path))), err.splitlines()[0]), err


def test_generate_takes_a_gguf_file_as_the_model(tmp_path):
    from rljax.commands.generate import check_model_folder

    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    check_model_folder(str(tmp_path / "model.gguf"))  # weights, config and tokenizer in one file: no folder needed
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        check_model_folder(str(tmp_path / "other.gguf"))
