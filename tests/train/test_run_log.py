"""An error that stops a run prints one line on the console and one line naming the
run's `log.txt`, where its traceback goes: a full disk at a save is the example."""

import errno
import os

import pytest

from rljax import cli
from rljax.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "sft_tiny.yaml")
SMALL = ["trainer.logger=[jsonl]", "data.batch_size=16", "trainer.micro_batch_size=0", "trainer.total_steps=2",
         "trainer.save_freq=1", "trainer.test_freq=0", "data.val_files=[]"]


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_traceback_is_in_the_run_log(tmp_path, monkeypatch, capsys):
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jch

    real = jch.JsonCheckpointHandler._save_fn

    async def disk_full(self, x, directory):
        if os.path.basename(os.path.dirname(str(directory))).split(".")[0] == "2":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
        return await real(self, x, directory)

    monkeypatch.setattr(jch.JsonCheckpointHandler, "_save_fn", disk_full)
    assert cli.main(["train", CONFIG, f"trainer.default_local_dir={tmp_path}", *SMALL]) == 1
    run_dir = os.path.join(str(tmp_path), "sft_tiny")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("rljax: error: ") and "No space left on device" in err[0], err
    assert f"{run_dir}/checkpoints/1" in err[0] and "intact" in err[0], err
    assert err[1] == f"rljax: the traceback is in {run_dir}/log.txt"
    with open(os.path.join(run_dir, "log.txt")) as f:
        log = f.read()
    assert "Traceback (most recent call last)" in log and "No space left on device" in log
    assert Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).all_steps() == [1]


def test_an_error_before_any_run_says_how_to_see_its_traceback(capsys):
    assert cli.main(["train", CONFIG, "data.num_threads=100000"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "rljax: error: data.num_threads: must be <= 1024, got 100000",
        "rljax: (--debug or RLJAX_DEBUG=1 shows the traceback)"]
