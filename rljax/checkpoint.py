"""Checkpoints with orbax: train state (params, optimizer, step, RNG), the data iterator's
state and run metadata, every `save_freq` steps and at the end; the last K kept; saves
are asynchronous (training goes on while the previous step is written).

Layout: `<run_dir>/checkpoints/<step>/{state,data,meta}`. A step directory appears only
once orbax has finished writing it, so a run killed mid-save resumes from the previous
complete one.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp
from flax import nnx


def abstract_like(tree):
    """ShapeDtypeStructs carrying each array's sharding: the restore target."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class Checkpointer:
    def __init__(self, directory: str, max_to_keep: int | None = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state, data_state: dict, meta: dict) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=ocp.args.JsonSave(data_state),
                meta=ocp.args.JsonSave(meta),
            ),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, step: int, abstract_state):
        """-> (state, data_state, meta) of `step`; arrays land in the shardings that
        `abstract_state` carries."""
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data=ocp.args.JsonRestore(),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return restored.state, restored.data, restored.meta

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def restore_params(directory: str, step: int, abstract_params: nnx.State, at: tuple[str, ...]) -> nnx.State:
    """Only the parameters stored under `at` in a checkpoint's train state (e.g.
    ``("actor", "params")`` of an RL run), in `abstract_params`' shapes, dtypes and
    shardings: an orbax partial restore, so optimizer state (and a critic) stay on disk."""

    def leaf(x):  # how nnx.State leaves are stored: {"value": array}
        return {"value": x}

    target = jax.tree.map(leaf, nnx.to_pure_dict(abstract_params))
    for key in reversed(at):
        target = {key: target}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    manager = ocp.CheckpointManager(directory, item_handlers={"state": ocp.PyTreeCheckpointHandler()})
    try:
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)))
    finally:
        manager.close()
    tree = restored.state
    for key in at:
        tree = tree[key]
    params = jax.tree.map(lambda x: x, abstract_params)
    nnx.replace_by_pure_dict(params, jax.tree.map(lambda d: d["value"], tree, is_leaf=lambda d: "value" in d))
    return params


def resolve_checkpoint(path: str) -> tuple[str, int | None]:
    """Accept a run dir, its `checkpoints` dir, or one step dir; return
    (checkpoints dir, step or None for the latest)."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, "checkpoints")):
        return os.path.join(path, "checkpoints"), None
    base = os.path.basename(path)
    if base.isdigit() and os.path.isdir(os.path.join(path, "state")):
        return os.path.dirname(path), int(base)
    if os.path.isdir(path):
        return path, None
    raise FileNotFoundError(f"{path}: not a run directory, checkpoints directory or checkpoint step")


def resume_source(mode: str, own: Checkpointer) -> tuple[Checkpointer, int] | None:
    """Where `trainer.resume_mode` says a run starts from, for every kind of run:
    `disable` -> None; `auto` -> the run's own latest checkpoint (None if it has none);
    a path (a run dir, its `checkpoints` dir or one step dir) -> that checkpoint, which
    must exist."""
    if mode == "disable":
        return None
    if mode == "auto":
        step = own.latest_step()
        return None if step is None else (own, step)
    directory, step = resolve_checkpoint(mode)
    source = Checkpointer(directory, max_to_keep=None, async_save=False)
    step = step if step is not None else source.latest_step()
    if step is None:
        raise FileNotFoundError(f"trainer.resume_mode={mode!r}: no checkpoint there")
    return source, step
