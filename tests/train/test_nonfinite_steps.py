"""A step whose loss or gradient is not finite is never applied and never checkpointed,
and the run exits non-zero with one line naming the last good checkpoint, also when the
run reaches its last step (fewer skipped updates in a row than
`trainer.max_consecutive_skipped_steps`)."""

import os

import jax.numpy as jnp
import pytest

from rljax import cli
from rljax.algos.aggregation import AggTerms
from rljax.checkpoint import Checkpointer, RunError
from rljax.train import loop
from rljax.train.skip_guard import NonFiniteError, SkipGuard

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "sft_tiny.yaml")
SMALL = ["trainer.logger=[jsonl]", "data.batch_size=16", "trainer.micro_batch_size=0", "trainer.total_steps=4",
         "trainer.save_freq=1", "trainer.test_freq=0", "data.val_files=[]", "trainer.async_save=false",
         "trainer.max_to_keep=10"]


def nan_at(monkeypatch, steps: set[int]):
    """The supervised step of the given (1-based) steps of this process computes a NaN loss."""
    real = loop.make_train_step

    def make(graphdef, objective, *args, **kwargs):
        def nan_objective(model, batch, frozen, totals, key):
            terms, metrics = objective(model, batch, frozen, totals, key)
            return AggTerms(terms.numerator * jnp.nan, terms.denominator), metrics

        finite, broken, calls = real(graphdef, objective, *args, **kwargs), None, [0]

        def step(state, batch, frozen, base):
            nonlocal broken
            calls[0] += 1
            if calls[0] not in steps:
                return finite(state, batch, frozen, base)
            broken = broken or real(graphdef, nan_objective, *args, **kwargs)
            return broken(state, batch, frozen, base)

        return step

    monkeypatch.setattr(loop, "make_train_step", make)


def train_cli(root, capsys) -> tuple[int, list[str]]:
    code = cli.main(["train", CONFIG, f"trainer.default_local_dir={root}", *SMALL])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.slow
def test_a_run_ending_in_non_finite_steps_exits_non_zero_and_keeps_the_last_finite_checkpoint(
        tmp_path, monkeypatch, capsys):
    """Steps 3 and 4 of 4 have a NaN loss (2 < the default limit of 5 in a row): neither
    is checkpointed, checkpoint 2 is the last, and `rljax train` exits 1 with one line."""
    nan_at(monkeypatch, {3, 4})
    code, err = train_cli(tmp_path, capsys)
    ckpt = os.path.join(str(tmp_path), "sft_tiny", "checkpoints")
    assert code == 1
    assert err[0].startswith("rljax: error: the run reached step 4, but updates were skipped"), err
    assert "step 3, 4" in err[0] and "step 4 was not checkpointed" in err[0] and f"{ckpt}/2" in err[0], err
    log = os.path.join(str(tmp_path), "sft_tiny", "log.txt")
    assert err[1:] == [f"rljax: the traceback is in {log}"], err  # the message, and where the details are
    with open(log) as f:
        assert "Traceback" in f.read()
    assert Checkpointer(ckpt, async_save=False).all_steps() == [1, 2]


@pytest.mark.slow
def test_a_skipped_step_is_not_checkpointed_and_its_save_waits_for_the_next_applied_step(tmp_path, monkeypatch):
    """Step 2 of 4 has a NaN loss: checkpoint 2 is not written (its weights would be step
    1's under step 2's name), 3 and 4 are, and the finished run still ends with an error."""
    nan_at(monkeypatch, {2})
    with pytest.raises(NonFiniteError) as info:
        loop.train(cli_config(tmp_path))
    message = str(info.value)
    assert "\n" not in message and "skipped as non-finite (loss or gradient) at step 2:" in message, message
    assert "optim.lr" in message and "not checkpointed" not in message
    ckpt = os.path.join(str(tmp_path), "sft_tiny", "checkpoints")
    assert Checkpointer(ckpt, async_save=False).all_steps() == [1, 3, 4]


def cli_config(root):
    from rljax.config import load_config
    from rljax.train.run_config import RunConfig

    return load_config(RunConfig, CONFIG, [f"trainer.default_local_dir={root}", *SMALL])


class _NoCheckpoints:
    directory = "/nonexistent/checkpoints"

    def wait(self):
        pass


def test_skip_guard_defers_a_save_due_at_a_skipped_step_and_fails_the_finished_run():
    guard = SkipGuard(5, "optim.lr", 1e-3, _NoCheckpoints())
    guard.check_total(1, 0, 1)
    assert guard.save_now(True)
    guard.check_total(2, 1, 1)  # step 2's update skipped
    assert not guard.save_now(True) and guard.owed
    guard.check_total(3, 2, 2)  # step 3: one of two updates skipped -> still not checkpointed
    assert not guard.save_now(False) and guard.owed
    guard.check_total(4, 2, 1)  # step 4 applied: the owed save is written now
    assert guard.save_now(False) and not guard.owed
    assert not guard.save_now(False)  # nothing due, nothing owed
    with pytest.raises(RunError, match=r"^the run reached step 4, but .* at step 2, 3: .*no checkpoint was written$"):
        guard.finish(4)


def test_a_run_without_skipped_updates_finishes():
    guard = SkipGuard(0, "optim.lr", 1e-3, _NoCheckpoints())
    for step in (1, 2, 3):
        guard.check_total(step, 0, 2)
        assert guard.save_now(step == 3) == (step == 3)
    guard.finish(3)
