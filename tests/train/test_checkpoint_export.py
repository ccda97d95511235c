"""`rljax export` of a damaged checkpoint step stops with one line naming the step, its
first bad file and the newest intact step, writes nothing, and exports that intact step
when asked: a supervised run and an RL run (each exporter calls `verify_step`)."""

import glob
import os

import pytest

from rljax.cli import main

from .test_checkpoint_checksums import DAMAGE, largest_array_file

pytestmark = pytest.mark.slow


def check_export(run_dir, tmp_path, capsys, damage, newest, previous):
    step_dir = os.path.join(run_dir, "checkpoints", str(newest))
    bad = largest_array_file(step_dir)
    DAMAGE[damage](bad)
    capsys.readouterr()
    out = tmp_path / "hf"
    assert main(["export", run_dir, "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"rljax: error: checkpoint {step_dir} is damaged ({os.path.relpath(bad, step_dir)}"), err
    assert err[0].endswith(f"the newest intact one is {os.path.dirname(step_dir)}/{previous} (--step {previous})")
    assert len(err) == 2 and "--debug" in err[1]
    assert not glob.glob(f"{out}/*.safetensors")
    assert main(["export", run_dir, "--out", str(tmp_path / "older"), "--step", str(previous)]) == 0
    assert glob.glob(f"{tmp_path}/older/*.safetensors")


@pytest.mark.parametrize("damage", ["flipped byte in an array file"])
def test_export_of_a_damaged_supervised_checkpoint(tmp_path, capsys, damage):
    from rljax.train.loop import train

    from .test_reliability import config

    train(config(tmp_path / "run"))
    check_export(str(tmp_path / "run" / "sft_tiny"), tmp_path, capsys, damage, newest=4, previous=2)


def test_export_of_a_damaged_rl_checkpoint(tmp_path, capsys):
    from rljax.config import load_config
    from rljax.rl.config import RLConfig
    from rljax.rl.trainer import RLTrainer

    from tests.rl.test_rl_resume import config_and_overrides

    config, overrides = config_and_overrides(tmp_path, tmp_path / "run")
    cfg = load_config(RLConfig, config, [*overrides, "trainer.total_steps=2", "trainer.save_freq=1"])
    RLTrainer(cfg).fit()
    run_dir = os.path.join(str(tmp_path / "run"), cfg.trainer.experiment_name)
    check_export(run_dir, tmp_path, capsys, "truncated array file", newest=2, previous=1)
