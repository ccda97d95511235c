"""`rljax export` and the checkpoint readers of `rljax eval` fail in one line: a step
that is not there (listing the steps that are), a checkpoint whose parameter shapes
differ from the model (the parameter, the checkpoint's and the model's shapes), an
`--out` folder that cannot be written (the folder and why)."""

import errno
import os
import re
import shutil

import pytest
import yaml

from rljax import cli
from rljax.checkpoint import CheckpointError, ShapeMismatchError, check_param_shapes, verify_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "sft_tiny.yaml")
SMALL = ["trainer.logger=[jsonl]", "data.batch_size=16", "trainer.micro_batch_size=0", "trainer.total_steps=2",
         "trainer.save_freq=1", "trainer.test_freq=0", "data.val_files=[]", "trainer.async_save=false"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> str:
    """A finished 2-step SFT run with checkpoints 1 and 2."""
    from rljax.config import load_config
    from rljax.train.loop import train
    from rljax.train.run_config import RunConfig

    root = tmp_path_factory.mktemp("run")
    train(load_config(RunConfig, CONFIG, [f"trainer.default_local_dir={root}", *SMALL]))
    return str(root / "sft_tiny")


def errors(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.slow
def test_a_step_that_is_not_there_lists_the_steps_that_are(run_dir, tmp_path, capsys):
    assert cli.main(["export", run_dir, "--out", str(tmp_path / "out"), "--step", "77"]) == 1
    err = errors(capsys)
    assert err[0] == f"rljax: error: {run_dir}/checkpoints: no checkpoint of step 77; the steps there: 1, 2", err
    assert len(err) == 2 and not os.listdir(tmp_path / "out")
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 3; there is no checkpoint there$"):
        verify_step(str(tmp_path), 3)


@pytest.mark.slow
def test_export_of_a_checkpoint_whose_shapes_differ_from_the_model_names_the_parameter(run_dir, tmp_path, capsys):
    """config.yaml edited after training (intermediate_size 128 -> 96): the export names the
    first parameter whose shape differs, with both shapes."""
    changed = str(tmp_path / "sft_tiny")
    shutil.copytree(run_dir, changed)
    path = os.path.join(changed, "config.yaml")
    with open(path) as f:
        raw = yaml.safe_load(f)
    raw["model"]["hf_config"]["intermediate_size"] = 96
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    assert cli.main(["export", changed, "--out", str(tmp_path / "out")]) == 1
    err = errors(capsys)
    assert re.fullmatch(rf"rljax: error: checkpoint {changed}/checkpoints/2: parameter params/layers/(down|gate|up)_proj "
                        r"has shape \((2, 128, 64|2, 64, 128)\) in the checkpoint, the model expects "
                        r"\((2, 96, 64|2, 64, 96)\); 3 of \d+ parameters differ: the model config is not the one "
                        r"the run trained", err[0]), err


@pytest.mark.slow
def test_the_shape_check_names_missing_and_extra_parameters(run_dir):
    """The eval / RL-export reader (`restore_params`) checks shapes the same way: a model
    with a parameter the checkpoint lacks, or without one it has."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, names):
            for name in names:
                setattr(self, name, nnx.Param(jnp.zeros((102, 64))))

    directory = os.path.join(run_dir, "checkpoints")
    abstract = nnx.state(nnx.eval_shape(lambda: Model(["embed", "extra"])), nnx.Param)
    with pytest.raises(ShapeMismatchError, match=r"checkpoints/2: parameter params/extra is not in the checkpoint "
                                                  r"\(the model has it, shape \(102, 64\)\); "):
        check_param_shapes(directory, 2, abstract, ("params",))
    with pytest.raises(ShapeMismatchError, match=r"holds no actor/params: not a checkpoint of this kind of run"):
        check_param_shapes(directory, 2, abstract, ("actor", "params"))
    assert jax.tree.leaves(abstract)


@pytest.mark.parametrize("error, why", [(errno.EROFS, "Read-only file system"), (errno.EACCES, "Permission denied")])
def test_an_out_folder_that_cannot_be_written_is_one_line_naming_it_and_why(tmp_path, monkeypatch, error, why):
    """Checked before anything is read (a root user writes through permissions, so the
    refusal is simulated at the write)."""
    from rljax.commands import export

    out = str(tmp_path / "ro")
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).startswith(out):
            raise OSError(error, os.strerror(error), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(SystemExit) as info:
        export.check_out(out, overwrite=False)
    assert str(info.value) == f"rljax export: --out {out} cannot be written: {why}"
    monkeypatch.undo()
    assert os.listdir(out) == []  # nothing left behind


def test_an_out_folder_whose_parent_is_a_file_is_one_line(tmp_path):
    from rljax.commands import export

    (tmp_path / "file").write_text("x")
    out = str(tmp_path / "file" / "out")
    with pytest.raises(SystemExit, match=rf"^rljax export: --out {re.escape(out)} cannot be written: Not a directory$"):
        export.check_out(out, overwrite=False)
