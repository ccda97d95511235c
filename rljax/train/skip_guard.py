"""Stopping a run whose updates fail: non-finite losses or gradients skip an update on
device (`train/skipped_steps` counts them, the weights stay), and `SkipGuard` stops the
run once too many in a row were skipped, or once the weights themselves became
non-finite. A step with a skipped update is never checkpointed (a save due then waits
for the next step whose updates all applied: `save_now`), and a run that skipped any
update ends non-zero even when it reached its last step (`finish`). Shared by the
supervised and the RL loop; the error names what to try and the last good checkpoint:
the newest one whose files match their checksums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rljax.checkpoint import INTACT, Checkpointer, RunError, check_step, finalized_steps


class NonFiniteError(RunError):
    """Training produced non-finite values it cannot recover from; the message says
    what to try and which checkpoint holds the last good weights."""


@jax.jit
def params_finite(params) -> jax.Array:
    """True when every parameter is finite: one fused reduction on device."""
    leaves = jax.tree.leaves(params)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else jnp.bool_(True)


class SkipGuard:
    """Stops a run whose updates keep being skipped as non-finite (`train/skipped_steps`
    counts them on device; the step keeps the old weights), and one whose weights became
    non-finite through an update that was not skipped. Shared by the supervised and the
    RL loop; the error says what to try and which checkpoint is the last good one.

    `limit`: trainer.max_consecutive_skipped_steps (0: never stop); `lr_key`/`lr`: the
    learning rate to name; `skipped`: the skipped-step count the run starts with."""

    HINT = ("try a lower {lr_key} (now {lr:g}), check the data for empty or broken rows (a zero loss "
            "denominator, inf/nan inputs), and with bf16 use model.compute_dtype=float32 (overflow)")

    def __init__(self, limit: int, lr_key: str, lr: float, checkpointer: Checkpointer, skipped: int = 0):
        self.limit, self.lr_key, self.lr, self.checkpointer = limit, lr_key, lr, checkpointer
        self.skipped_total = skipped
        self.consecutive = 0
        self.last_skipped = 0  # updates skipped in the newest step counted
        self.skipped_at: list[int] = []  # the steps of this run with a skipped update
        self.owed = False  # a save fell due at a step with a skipped update: the next applied step saves

    def _last_good(self) -> str:
        try:
            self.checkpointer.wait()  # a save in flight holds finite weights (checked before it)
        except RunError:
            pass
        done = finalized_steps(self.checkpointer.directory)
        for step in reversed(done):  # newest first: verified against its checksums
            if check_step(self.checkpointer.path(step))[0] == INTACT:
                return f"the last good checkpoint is {self.checkpointer.path(step)}"
        return (f"no checkpoint in {self.checkpointer.directory} verifies against its checksums" if done
                else "no checkpoint was written")

    def count(self, step: int, skipped: int, attempted: int = 1, metrics: dict | None = None) -> None:
        """`skipped` of the `attempted` optimizer steps of training step `step` (one for
        supervised training, the mini-batch updates of an RL step) were skipped; raise
        once `limit` in a row were (a step with some updates through ends the streak)."""
        self.consecutive = self.consecutive + attempted if attempted and skipped >= attempted else 0
        self.last_skipped = skipped
        if skipped:
            self.skipped_at.append(step)
        if not self.limit or self.consecutive < self.limit:
            return
        metrics = metrics or {}
        watched = ("train/loss", "train/grad_norm", "actor/loss", "actor/grad_norm")
        seen = ", ".join(f"{k}={metrics[k]:.4g}" for k in watched if k in metrics)
        raise NonFiniteError(
            f"{self.consecutive} consecutive optimizer steps were skipped, up to step {step}: loss or gradient not "
            f"finite{f' ({seen})' if seen else ''}; stopped (trainer.max_consecutive_skipped_steps={self.limit}): "
            + self.HINT.format(lr_key=self.lr_key, lr=self.lr) + f"; {self._last_good()}")

    def check(self, step: int, metrics: dict) -> None:
        """A supervised step's host metrics (`train/skipped_steps` is the running total)."""
        self.check_total(step, int(metrics.get("train/skipped_steps", self.skipped_total)), 1, metrics)

    def check_total(self, step: int, total: int, attempted: int, metrics: dict | None = None) -> int:
        """`count` from the state's running total of skipped updates; returns how many of
        this step's `attempted` updates were skipped."""
        skipped, self.skipped_total = total - self.skipped_total, total
        self.count(step, skipped, attempted, metrics)
        return skipped

    def check_params(self, step: int, params, consequence: str, what: str = "parameters") -> None:
        """Raise if `params` hold a non-finite value (an update with finite loss and
        gradient overflowed): `consequence` says what was not done with them."""
        if bool(params_finite(params)):
            return
        raise NonFiniteError(
            f"{what} are not finite after step {step} (an update with finite loss and gradient overflowed); "
            f"{consequence}: " + self.HINT.format(lr_key=self.lr_key, lr=self.lr) + f"; {self._last_good()}")

    def save_now(self, due: bool) -> bool:
        """Whether to checkpoint after the newest step counted: a save is `due` (or owed
        by an earlier step) and none of the step's updates was skipped. A due save at a
        step with a skipped update is owed to the next step whose updates all applied, so
        no checkpoint ever holds a step that was not trained."""
        due = due or self.owed
        self.owed = due and self.last_skipped > 0
        return due and not self.owed

    def finish(self, step: int) -> None:
        """The run reached its last step: raise if any update of this run was skipped (the
        run exits non-zero; the checkpoints hold only applied updates)."""
        if not self.skipped_at:
            return
        steps = self.skipped_at
        listed = ", ".join(map(str, steps[:10])) + (f", ... ({len(steps)} steps)" if len(steps) > 10 else "")
        last = "" if steps[-1] != step else f"; step {step} was not checkpointed"
        raise NonFiniteError(
            f"the run reached step {step}, but updates were skipped as non-finite (loss or gradient) at step "
            f"{listed}{last}: " + self.HINT.format(lr_key=self.lr_key, lr=self.lr) + f"; {self._last_good()}")
