"""How a supervised run fails: an interrupted or crashed run keeps the checkpoint being
written, a full disk fails the save that hit it (the previous checkpoint stays), a
damaged latest checkpoint is skipped on resume (or named), a run whose updates keep being
skipped as non-finite stops, `metrics.jsonl` holds each step once after a resume, and
`rljax export` does not overwrite a folder that holds files.

One tiny 4-step SFT run (checkpoints 2 and 4) is shared; each case copies it."""

import errno
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from rljax.checkpoint import Checkpointer
from rljax.config import load_config
from rljax.train.loop import train
from rljax.train.run_config import RunConfig
from rljax.xla_flags import with_cpu_multi_device_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "sft_tiny.yaml")
SMALL = ["trainer.logger=[jsonl]", "data.batch_size=16", "trainer.micro_batch_size=0", "trainer.total_steps=4",
         "trainer.save_freq=2", "trainer.test_freq=0", "data.val_files=[]", "trainer.async_save=false"]


def config(root, *overrides) -> RunConfig:
    return load_config(RunConfig, CONFIG, [f"trainer.default_local_dir={root}", *SMALL, *overrides])


def steps_logged(run_dir) -> list[int]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f]


def listing(run_dir) -> list[str]:
    return sorted(os.listdir(os.path.join(run_dir, "checkpoints")))


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> str:
    """A finished 4-step run: checkpoints 2 and 4, metrics of steps 1-4."""
    root = tmp_path_factory.mktemp("base")
    train(config(root))
    return str(root / "sft_tiny")


def copy_run(base_run, root) -> str:
    run_dir = os.path.join(str(root), "sft_tiny")
    shutil.copytree(base_run, run_dir)
    return run_dir


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


DAMAGE = {
    "missing state/_METADATA": lambda d: os.remove(f"{d}/state/_METADATA"),
    "truncated state/_METADATA": lambda d: _truncate(f"{d}/state/_METADATA"),
    "truncated array files": lambda d: [_truncate(p) for p in glob.glob(f"{d}/state/ocdbt.process_0/d/*")],
    "missing meta/metadata": lambda d: os.remove(f"{d}/meta/metadata"),
    "missing state/": lambda d: shutil.rmtree(f"{d}/state"),
    "empty step directory": lambda d: [shutil.rmtree(d), os.makedirs(d)],
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_resume_skips_a_damaged_latest_checkpoint(base_run, tmp_path, damage, capsys):
    from rljax.checkpoint import CheckpointError, resume  # noqa: F401  (new API)
    from rljax.train.export import abstract_train_state, load_run_config
    from flax import nnx
    from rljax.parallel import make_mesh
    from rljax.train.setup import build_decoder, load_tokenizer
    from rljax.train.tasks import make_task

    run_dir = copy_run(base_run, tmp_path)
    ckpt = os.path.join(run_dir, "checkpoints")
    DAMAGE[damage](os.path.join(ckpt, "4"))
    cfg = load_run_config(run_dir)
    mesh = make_mesh(cfg.mesh)
    module = nnx.eval_shape(lambda: make_task(cfg, build_decoder(cfg.model, load_tokenizer(cfg.model),
                                                                  weights=False), mesh).module)
    _, abstract = abstract_train_state(module, cfg, mesh)

    # told not to fall back: one line naming the damaged checkpoint, nothing moved
    with pytest.raises(CheckpointError) as info:
        resume("auto", Checkpointer(ckpt, async_save=False), abstract, fallback=False)
    message = str(info.value)
    assert "\n" not in message and f"{ckpt}/4" in message and "damaged" in message, message
    assert "trainer.resume_fallback" in message
    assert "4" in os.listdir(ckpt)

    # by default: the previous good checkpoint, with one line saying why
    found = resume("auto", Checkpointer(ckpt, async_save=False), abstract)
    assert found.step == 2 and found.meta["step"] == 2
    out = capsys.readouterr()
    notes = [line for line in (out.out + out.err).splitlines() if "damaged" in line]
    assert len(notes) == 1 and f"{ckpt}/4" in notes[0] and f"{ckpt}/2" in notes[0], out
    assert "Traceback" not in out.err and "subtree" not in out.err
    # the damaged step is set aside so the resumed run can write step 4 again
    assert Checkpointer(ckpt, async_save=False).all_steps() == [2]
    assert any(name.startswith("4.damaged") for name in os.listdir(ckpt))


@pytest.mark.slow
def test_checkpoints_of_another_config_are_not_called_damaged(base_run, tmp_path):
    """No checkpoint restores into a changed model: nothing is set aside, and the message
    points at the config."""
    import dataclasses

    from flax import nnx

    from rljax.checkpoint import CheckpointError, resume
    from rljax.parallel import make_mesh
    from rljax.train.export import abstract_train_state, load_run_config
    from rljax.train.setup import build_decoder, load_tokenizer
    from rljax.train.tasks import make_task

    run_dir = copy_run(base_run, tmp_path)
    cfg = load_run_config(run_dir)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, hf_config={**cfg.model.hf_config, "intermediate_size": 96}))
    mesh = make_mesh(cfg.mesh)
    module = nnx.eval_shape(lambda: make_task(cfg, build_decoder(cfg.model, load_tokenizer(cfg.model),
                                                                  weights=False), mesh).module)
    _, abstract = abstract_train_state(module, cfg, mesh)
    with pytest.raises(CheckpointError, match="cannot be restored.*settings differ.*nothing was moved"):
        resume("auto", Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False), abstract)
    assert listing(run_dir) == ["2", "4"]


@pytest.mark.slow
def test_damaged_latest_resumes_from_previous_and_logs_each_step_once(base_run, tmp_path, capsys):
    run_dir = copy_run(base_run, tmp_path)
    os.remove(os.path.join(run_dir, "checkpoints", "4", "state", "_METADATA"))
    assert steps_logged(run_dir) == [1, 2, 3, 4]
    train(config(tmp_path))
    out = capsys.readouterr()
    assert "damaged" in out.out + out.err and "resumed from" in out.out
    assert Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).all_steps() == [2, 4]
    assert steps_logged(run_dir) == [1, 2, 3, 4]  # steps 3 and 4 once, from the resumed run


@pytest.mark.slow
def test_damaged_latest_stops_with_one_line_when_fallback_is_off(base_run, tmp_path):
    from rljax.checkpoint import CheckpointError

    run_dir = copy_run(base_run, tmp_path)
    os.remove(os.path.join(run_dir, "checkpoints", "4", "state", "_METADATA"))
    with pytest.raises(CheckpointError, match="checkpoints/4.*damaged") as info:
        train(config(tmp_path, "trainer.resume_fallback=false"))
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_disk_full_fails_that_save_and_keeps_the_previous_checkpoint(base_run, tmp_path, monkeypatch, capsys):
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jch

    run_dir = copy_run(base_run, tmp_path)
    shutil.rmtree(os.path.join(run_dir, "checkpoints", "4"))  # as if killed after step 4, before its save
    real = jch.JsonCheckpointHandler._save_fn

    async def disk_full(self, x, directory):
        if os.path.basename(os.path.dirname(str(directory))).split(".")[0] == "4":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
        return await real(self, x, directory)

    monkeypatch.setattr(jch.JsonCheckpointHandler, "_save_fn", disk_full)
    with pytest.raises(Exception) as info:
        train(config(tmp_path, "trainer.async_save=true"))
    message = str(info.value)
    assert "\n" not in message and "checkpoint 4" in message and "No space left on device" in message, message
    assert f"{run_dir}/checkpoints/2" in message and "intact" in message
    assert Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).all_steps() == [2]
    assert "Traceback" not in capsys.readouterr().err

    monkeypatch.setattr(jch.JsonCheckpointHandler, "_save_fn", real)  # space freed
    train(config(tmp_path, "trainer.async_save=true"))
    assert "resumed from" in capsys.readouterr().out
    assert Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).all_steps() == [2, 4]
    assert [n for n in listing(run_dir) if "tmp" in n] == []
    assert steps_logged(run_dir) == [1, 2, 3, 4]


@pytest.mark.slow
def test_consecutive_skipped_steps_stop_the_run(base_run, tmp_path, monkeypatch):
    """From step 3 every loss is NaN (each update skipped): with
    trainer.max_consecutive_skipped_steps=2 the run stops at step 4, says what to try,
    and checkpoint 2 stays the latest."""
    import jax.numpy as jnp

    from rljax.algos.aggregation import AggTerms
    from rljax.train import loop

    run_dir = copy_run(base_run, tmp_path)
    shutil.rmtree(os.path.join(run_dir, "checkpoints", "4"))
    real_make_task = loop.make_task

    def nan_task(cfg, decoder, mesh):
        task = real_make_task(cfg, decoder, mesh)
        objective = task.objective

        def nan_objective(model, batch, frozen, totals, key):
            terms, metrics = objective(model, batch, frozen, totals, key)
            return AggTerms(terms.numerator * jnp.nan, terms.denominator), metrics

        task.objective = nan_objective
        return task

    monkeypatch.setattr(loop, "make_task", nan_task)
    with pytest.raises(RuntimeError) as info:
        train(config(tmp_path, "trainer.total_steps=8", "trainer.max_consecutive_skipped_steps=2"))
    message = str(info.value)
    assert "\n" not in message and "2 consecutive" in message and "optim.lr" in message, message
    assert "trainer.max_consecutive_skipped_steps" in message and f"{run_dir}/checkpoints/2" in message
    assert Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).all_steps() == [2]


INTERRUPTED_RUN = textwrap.dedent("""
    import asyncio, sys, time
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jch
    from rljax.config import load_config
    from rljax.tracking import Tracker
    from rljax.train import loop
    from rljax.train.run_config import RunConfig
    real_save = jch.JsonCheckpointHandler._save_fn
    async def slow_save(self, x, directory):   # a save still being written when the loop stops
        await asyncio.sleep(4)
        return await real_save(self, x, directory)
    jch.JsonCheckpointHandler._save_fn = slow_save
    real_log = Tracker.log
    def log(self, step, metrics):
        real_log(self, step, metrics)
        if step == 3:
            raise KeyboardInterrupt() if sys.argv[1] == "interrupt" else RuntimeError("boom")
    Tracker.log = log
    try:
        loop.train(load_config(RunConfig, sys.argv[2], sys.argv[3:]))
    except KeyboardInterrupt:   # as the command line does: the loop's message is the only output
        sys.exit(130)
""")


@pytest.mark.slow
def test_interrupt_or_error_finishes_the_save_in_flight(tmp_path):
    procs = {}
    for kind in ("interrupt", "error"):
        overrides = [f"trainer.default_local_dir={tmp_path / kind}", *SMALL, "trainer.async_save=true"]
        procs[kind] = subprocess.Popen([sys.executable, "-c", INTERRUPTED_RUN, kind, CONFIG, *overrides],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": with_cpu_multi_device_flags(
                                           "--xla_force_host_platform_device_count=8")})
    for kind, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        run_dir = str(tmp_path / kind / "sft_tiny")
        assert listing(run_dir) == ["2"], (kind, listing(run_dir), err[-3000:])  # complete, no *.orbax-checkpoint-tmp
        assert Checkpointer(os.path.join(run_dir, "checkpoints"), async_save=False).all_steps() == [2]
        stops = [line for line in err.splitlines() if "checkpoints/2" in line]
        assert len(stops) == 1 and "resume" in stops[0], (kind, err[-3000:])
        assert "event loop" not in err and "Exception in thread" not in err and "Exception ignored" not in err, err
        if kind == "interrupt":
            assert proc.returncode == 130 and "interrupted at step" in stops[0]
            assert "Traceback" not in err, err[-3000:]
        else:
            assert proc.returncode == 1 and "RuntimeError: boom" in err


def test_tracker_drops_replayed_steps_on_resume(tmp_path):
    from rljax.tracking import Tracker

    tracker = Tracker(str(tmp_path), ["jsonl"], total_steps=4)
    for step in (1, 2, 3):
        tracker.log(step, {"train/loss": 1.0 / step})
    tracker.close()
    resumed = Tracker(str(tmp_path), ["jsonl"], total_steps=4)
    resumed.start_at(2)  # resumed from checkpoint 2: step 3 is replayed
    for step in (3, 4):
        resumed.log(step, {"train/loss": 0.5})
    resumed.close()
    assert steps_logged(str(tmp_path)) == [1, 2, 3, 4]
    fresh = Tracker(str(tmp_path), ["jsonl"], total_steps=4)
    fresh.start_at(0)  # a run that starts over rewrites its history
    fresh.log(1, {"train/loss": 2.0})
    fresh.close()
    assert steps_logged(str(tmp_path)) == [1]


@pytest.mark.slow
def test_export_refuses_a_folder_that_holds_files(base_run, tmp_path, capsys):
    from rljax.cli import main

    out = tmp_path / "base_model"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the base model")
    (out / "notes.txt").write_text("keep me")
    assert main(["export", base_run, "--out", str(out)]) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"rljax: error: --out {out} is not empty") and "--overwrite" in first, first
    assert (out / "model.safetensors").read_bytes() == b"the base model" and (out / "notes.txt").exists()
    capsys.readouterr()
    assert main(["export", base_run, "--out", str(tmp_path / "new")]) == 0  # a new folder is fine
    # the step it exported is said, and recorded beside the weights
    assert capsys.readouterr().out.strip() == f"exported step 4 of {base_run} to {tmp_path / 'new'}"
    assert main(["export", base_run, "--out", str(tmp_path / "step2"), "--step", "2"]) == 0
    assert capsys.readouterr().out.strip() == f"exported step 2 of {base_run} to {tmp_path / 'step2'}"
    assert json.loads((tmp_path / "step2" / "rljax_export.json").read_text()) == {"run": base_run, "step": 2}
    assert main(["export", base_run, "--out", str(out), "--overwrite"]) == 0
    assert (out / "config.json").exists() and (out / "model.safetensors").read_bytes() != b"the base model"
