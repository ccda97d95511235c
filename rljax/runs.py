"""What every run does besides training: one scaffold for the supervised loop
(`rljax.train.loop`) and the RL trainer (`rljax.rl.trainer`).

A run lives in `<trainer.default_local_dir>/<trainer.experiment_name>/`:

    config.yaml      the resolved config (synthetic data specs replaced by their files)
    tokenizer/       the run's tokenizer
    data/            synthetic data sets, materialised once
    checkpoints/     <step>/{state,data,meta} (`rljax.checkpoint`)
    metrics.jsonl, tensorboard/   (`rljax.tracking`)

`Run` owns those chores in order: config checked, folder made, data materialised,
config and tokenizer written by process 0, checkpointer and tracker opened; then
`resume` (per `trainer.resume_mode`: auto | disable | a path), `save`, and `close`
(finish the save in flight, close the tracker and whatever the loop registered, first
error wins). A loop keeps only its own work: building models, stepping, metrics.

The scaffold sits below both loops and imports neither: which loop a config runs is
decided above them (`rljax.commands.run_kinds`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import jax
import yaml

from rljax.checkpoint import Checkpointer, Resumed, close_after
from rljax.checkpoint import resume as restore_latest
from rljax.config import config_to_dict, save_config, validate
from rljax.data.synthetic_spec import materialize
from rljax.data.tokenizer import load_tokenizer
from rljax.distributed import is_coordinator, print0
from rljax.tracking import Tracker


def run_dir_of(cfg: Any) -> str:
    """`<trainer.default_local_dir>/<trainer.experiment_name>`."""
    return os.path.join(cfg.trainer.default_local_dir, cfg.trainer.experiment_name)


def saved_config(run_dir: str) -> dict:
    """The raw `config.yaml` a run wrote into its folder."""
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run_dir}: no config.yaml beside the checkpoints")
    with open(path) as f:
        return yaml.safe_load(f) or {}


def raw_algorithm(raw: dict) -> str | None:
    """`trainer.algorithm` of a raw config mapping (a YAML file's, or a run folder's
    `config.yaml`), as a string; None when unset."""
    trainer = raw.get("trainer")
    algorithm = trainer.get("algorithm") if isinstance(trainer, dict) else None
    return None if algorithm is None else str(algorithm)


def _due(step: int, every: int, total_steps: int) -> bool:
    """At the last step, and every `every` steps (0: only at the last)."""
    return step == total_steps or bool(every and step % every == 0)


class Run:
    """The scaffold of one run (module docstring). `config` is the config with its data
    files materialised; the RL warm-up may replace it (the checkpoints' metadata records
    the config the run trains with)."""

    def __init__(self, cfg: Any):
        validate(cfg, jax.device_count())  # every config problem, as one line, before any work
        self.directory = run_dir_of(cfg)
        os.makedirs(self.directory, exist_ok=True)
        data_dir = os.path.join(self.directory, "data")
        self.config = dataclasses.replace(cfg, data=dataclasses.replace(
            cfg.data, train_files=materialize(cfg.data.train_files, data_dir, "train"),
            val_files=materialize(cfg.data.val_files, data_dir, "val")))
        self.tokenizer = load_tokenizer(cfg.model)
        if is_coordinator():
            save_config(self.config, os.path.join(self.directory, "config.yaml"))
            self.tokenizer.save_pretrained(os.path.join(self.directory, "tokenizer"))
        t = cfg.trainer
        self.checkpointer = Checkpointer(os.path.join(self.directory, "checkpoints"), t.max_to_keep, t.async_save)
        self.tracker = Tracker(self.directory, t.logger, t.total_steps)
        self._closers: list[Callable[[], None]] = []

    # ---- the run's life ------------------------------------------------------------------

    def resume(self, abstract_state, data) -> Resumed | None:
        """Restore the checkpoint `trainer.resume_mode` names into `abstract_state`'s layout
        (a damaged latest one skipped per `trainer.resume_fallback`: `rljax.checkpoint.resume`)
        and `data`'s position (anything with `set_state`); None to start from scratch. The
        tracker starts after the restored step: metrics an earlier attempt logged later are
        dropped (those steps run again)."""
        t = self.config.trainer
        found = restore_latest(t.resume_mode, self.checkpointer, abstract_state, t.resume_fallback)
        self.tracker.start_at(0 if found is None else found.step)
        if found is not None:
            data.set_state(found.data_state)
            print0(f"resumed from {found.path}")
        return found

    def validation_due(self, step: int) -> bool:
        """Validate after `step`: the run has validation data, and it is the last step or a
        multiple of `trainer.test_freq`."""
        t = self.config.trainer
        return bool(self.config.data.val_files) and _due(step, t.test_freq, t.total_steps)

    def save_due(self, step: int) -> bool:
        """Checkpoint after `step`: the last step, or a multiple of `trainer.save_freq`."""
        t = self.config.trainer
        return _due(step, t.save_freq, t.total_steps)

    def save(self, step: int, state, data_state: dict, **meta) -> None:
        """Checkpoint `state` and the data position after `step`; `meta` (JSON values) goes
        beside the step and the config."""
        self.checkpointer.save(step, state, data_state, {"step": step, **meta, "config": config_to_dict(self.config)})

    def on_close(self, close: Callable[[], None]) -> None:
        """Release `close` at the end of the run (after the checkpointer and the tracker)."""
        self._closers.append(close)

    def close(self, error: BaseException | None, step: int) -> None:
        """Finish the save in flight (`rljax.checkpoint.close_after`: `error` is what ended
        the run, `step` the step it names), close the tracker and every `on_close`; each
        is closed even if another fails, and the first failure is raised unless `error`
        already ends the run."""
        first = None
        for close in (lambda: close_after(self.checkpointer, error, step), self.tracker.close, *self._closers):
            try:
                close()
            except BaseException as e:  # noqa: PERF203
                first = first or e
        if first is not None and error is None:
            raise first
