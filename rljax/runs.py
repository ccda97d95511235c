"""What every run does besides training: one scaffold for the supervised loop
(`rljax.train.loop`) and the RL trainer (`rljax.rl.trainer`).

A run lives in `<trainer.default_local_dir>/<trainer.experiment_name>/`:

    .lock            held by the process that owns the run (`RunLock`)
    config.yaml      the resolved config (synthetic data specs replaced by their files)
    config.step-N.yaml   the config of steps 1..N, kept when a resume at N changed it
    tokenizer/       the run's tokenizer
    data/            synthetic data sets, materialised once
    checkpoints/     <step>/{state,data,meta} (`rljax.checkpoint`)
    metrics.jsonl, tensorboard/   (`rljax.tracking`)
    log.txt          the traceback of each error that stopped the run (the console: one line)

`Run` owns those chores in order: config checked, folder made and locked by process 0
(one owner per folder: a second one fails at once naming the first), data materialised,
the requested config compared with the saved one when the folder has a checkpoint to
resume (a change is refused, naming each key, unless allowed: `resume_changes`), config
and tokenizer written by process 0, checkpointer and tracker opened; then `resume` (per
`trainer.resume_mode`: auto | disable | a path; an allowed change is recorded at the
step resumed from), `save`, and `close` (finish the save in flight, close the tracker
and whatever the loop registered, release the folder; first error wins). A loop keeps
only its own work: building models, stepping, metrics.

Preemption (`Preemption`): a SIGTERM to any process of a run makes every process stop
after one step they agree on; the loop saves that step and raises `Preempted`, which
`rljax` turns into exit status 75, the launchers' "resume" (docs/runs.md, "Preemption").

The scaffold sits below both loops and imports neither: which loop a config runs is
decided above them (`rljax.commands.run_kinds`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import threading
from typing import Any, Callable, Iterator

import jax
import yaml

from rljax.checkpoint import Checkpointer, Resumed, RunError, close_after
from rljax.checkpoint import resume as restore_latest
from rljax.checkpoint import finalized_steps
from rljax.config import ConfigError, config_to_dict, load_config, save_config, validate
from rljax.data.synthetic_spec import materialize
from rljax.data.tokenizer import load_tokenizer
from rljax.distributed import is_coordinator, print0
from rljax.hostsync import any_process
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


# ---- one owner per run folder ---------------------------------------------------------------
#
# The owner holds an open descriptor of `<run>/.lock` with `fcntl.flock(LOCK_EX)` for the
# life of the run and writes who it is into the file (host, pid, start time in UTC). The
# kernel drops the lock when that descriptor is closed, which also happens when the
# process dies in any way (kill -9 included), so a lock is never stale: the file stays,
# but nobody holds it. A second owner (another process, or another `RunLock` in the same
# process: `flock` locks belong to the open file, not the process) fails at once with
# `RunLockedError`, one line naming the folder and the owner's record. On a network
# filesystem the guarantee is the filesystem's (docs/runs.md, "One owner per run folder"):
# Linux NFS clients emulate `flock` with NFS byte-range locks (local to one client under a
# `local_lock=` mount option); GCS FUSE does not support file locks.

LOCK_FILE = ".lock"
LOG_FILE = "log.txt"  # the traceback of each error that stopped the run (`rljax.cli` writes it)


class RunLockedError(RuntimeError):
    """The run folder already has an owner (the message names it)."""


def _owner_record() -> str:
    since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"host {socket.gethostname()}, pid {os.getpid()}, since {since}"


class RunLock:
    """The exclusive lock of one run folder, taken at construction (`RunLockedError` if
    another owner holds it), released by `release` (or by the process ending)."""

    def __init__(self, directory: str):
        self._fd: int | None = None
        self.path = os.path.join(directory, LOCK_FILE)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunLockedError(f"{directory}: the run folder is in use by {self._owner()} "
                                 f"(one process owns a run folder; lock file {self.path})") from None
        self._fd = fd
        record = _owner_record().encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record + b"\n", 0)
        os.fsync(fd)

    def _owner(self) -> str:
        """The holder's record, as it wrote it."""
        try:
            with open(self.path) as f:
                text = " ".join(f.read().split())
        except OSError:
            text = ""
        return text or "another process (which has not yet written its host and pid)"

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the folder up (the file stays; closing the descriptor drops the lock)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __del__(self):  # a run dropped without `close` (an error before its loop began) frees the folder
        self.release()


# ---- preemption -----------------------------------------------------------------------------
#
# A preemption notice is a SIGTERM (spot and preemptible TPU VMs get about 30 s before the
# machine goes, GKE pods `terminationGracePeriodSeconds`, 30 s by default). It may reach one
# process of a multi-process run only, and a checkpoint needs all of them, so the processes
# first agree on one step to stop after. Where `jax.distributed` runs its preemption
# service (the default for a multi-process run), the service catches SIGTERM and agrees on
# the step (`multihost_utils.reached_preemption_sync_point`: the largest step any process
# has reported, plus one). Otherwise (one process, or the service turned off with
# `jax_enable_preemption_service=false`) a Python handler notes the signal and every
# process shares its note at each step boundary (`rljax.hostsync.any_process`).


class Preempted(RunError):
    """The run stopped after a preemption notice (SIGTERM), at a step every process agreed
    on, with that step's checkpoint complete; the message names it."""


def _jax_preemption_service() -> bool:
    """Whether `jax.distributed` runs a preemption sync manager in this process."""
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover - a jax without it
        return False
    state = distributed.global_state
    return getattr(state, "client", None) is not None and getattr(state, "preemption_sync_manager", None) is not None


class Preemption:
    """Notices SIGTERM from construction to `close` and tells, at each step, whether every
    process stops after it. `agreed(step)` must be called by every process after every step,
    in order (it is a collective, or the preemption service's step count)."""

    def __init__(self):
        self.noticed = False  # this process received SIGTERM (the Python handler's note)
        self._service = _jax_preemption_service()
        self._previous = None
        self._installed = False
        # signal handlers belong to the main thread; a run started elsewhere keeps SIGTERM's default
        if not self._service and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True

    def _on_sigterm(self, signum, frame) -> None:
        if not self.noticed:  # os.write: no buffered stream is touched inside a handler
            os.write(2, b"rljax: SIGTERM: the run stops and saves after the step every process agrees on\n")
        self.noticed = True

    def agreed(self, step: int) -> bool:
        """True on every process at the step they stop after (the same on all of them)."""
        if self._service:
            from jax.experimental import multihost_utils

            return bool(multihost_utils.reached_preemption_sync_point(step))
        return any_process(self.noticed)

    def close(self) -> None:
        """Give SIGTERM its earlier handler back."""
        if self._installed:
            self._installed = False
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)


# keys a resume may change without a word: where the run folder is (a moved or copied run), and how the run
# is logged, saved, resumed and guarded, not what it trains
FREE_KEYS = ("trainer.default_local_dir", "trainer.experiment_name", "trainer.logger", "trainer.resume_mode",
             "trainer.resume_fallback", "trainer.async_save", "trainer.max_consecutive_skipped_steps")
# keys a resume may change with one line and a record but without --allow-config-change: extending a run
ANNOUNCED_KEYS = ("trainer.total_steps",)

_CHANGE_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("rljax_config_change_allowed", default=False)


class ConfigChangeError(ConfigError):
    """A resume asked for a config other than the one the run was made with."""


@contextlib.contextmanager
def config_change_allowed(allowed: bool = True) -> Iterator[None]:
    """Runs made inside take `allow_config_change=allowed` unless they pass it
    (`rljax train --allow-config-change`)."""
    token = _CHANGE_ALLOWED.set(allowed)
    try:
        yield
    finally:
        _CHANGE_ALLOWED.reset(token)


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (a YAML round trip's spelling)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> {dotted key: leaf}; a sequence is one leaf."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: _plain(tree)}


def config_changes(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old value, new value)} for every leaf that differs between two config
    mappings (`config_to_dict`), in the new config's order; a key only one side has is
    None on the other."""
    a, b = _flatten(old), _flatten(new)
    keys = list(b) + [k for k in a if k not in b]
    return {k: (a.get(k), b.get(k)) for k in keys if k not in a or k not in b or a[k] != b[k]}


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """`key: old -> new` for each change, joined with "; " (values as JSON)."""
    return "; ".join(f"{k}: {json.dumps(old)} -> {json.dumps(new)}" for k, (old, new) in changes.items())


def write_config(cfg: Any, path: str) -> None:
    """`config.yaml` replaced in one step (a reader sees the old file or the new one)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    save_config(cfg, tmp)
    os.replace(tmp, path)


def _moved(saved: dict, directory: str) -> dict:
    """`saved` (a run's config mapping) with the paths inside the folder it was saved in
    (its synthetic data files) moved under `directory`, where the run is now."""
    t = saved.get("trainer") or {}
    was = os.path.join(str(t.get("default_local_dir", "")), str(t.get("experiment_name", "")))
    if os.path.abspath(was) == os.path.abspath(directory):
        return saved

    def move(value):
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        if isinstance(value, list):
            return [move(v) for v in value]
        if isinstance(value, str) and value.startswith(was + os.sep):
            return os.path.join(directory, value[len(was) + 1:])
        return value

    return move(saved)


def resume_changes(directory: str, cfg: Any, allowed: bool) -> dict[str, tuple[Any, Any]] | None:
    """What a resume of the run in `directory` changes: None for a run that starts from
    scratch (`trainer.resume_mode=disable`, or no checkpoint in the folder) or resumes
    with the saved config (`FREE_KEYS` aside); else {key: (saved, requested)}. A change
    other than `ANNOUNCED_KEYS` without `allowed`, and `trainer.total_steps` below the
    latest checkpoint, are a `ConfigError` naming each changed key."""
    if cfg.trainer.resume_mode == "disable":
        return None
    path = os.path.join(directory, "config.yaml")
    steps = finalized_steps(os.path.join(directory, "checkpoints"))
    if not steps or not os.path.exists(path):
        return None
    latest = steps[-1]
    try:  # the saved config through the same loader, so equal values compare equal whatever their spelling
        saved = config_to_dict(load_config(type(cfg), path))
    except ConfigError as e:
        if not allowed:
            raise ConfigChangeError(f"{path}: the run's saved config does not load ({e}); --allow-config-change "
                                    "resumes with the requested one (the saved file is kept)") from None
        saved = saved_config(directory)
    changes = {k: v for k, v in config_changes(_moved(saved, directory), config_to_dict(cfg)).items()
               if k not in FREE_KEYS}
    if not changes:
        return None
    total = cfg.trainer.total_steps
    if "trainer.total_steps" in changes and total < latest:
        raise ConfigError(f"trainer.total_steps={total}: the run in {directory} has a checkpoint at step {latest}; "
                          f"set at least {latest} to resume it")
    if set(changes) - set(ANNOUNCED_KEYS) and not allowed:
        raise ConfigChangeError(
            f"{directory}: resuming at step {latest} with a config other than the run's: {describe_changes(changes)}. "
            "Run with the saved config (config.yaml), or pass --allow-config-change (Run(allow_config_change=True)) "
            "to continue under the new one (the change is recorded)")
    return changes


class Run:
    """The scaffold of one run (module docstring). `config` is the config with its data
    files materialised; the RL warm-up may replace it (the checkpoints' metadata records
    the config the run trains with)."""

    def __init__(self, cfg: Any, allow_config_change: bool | None = None):
        validate(cfg, jax.device_count())  # every config problem, as one line, before any work
        self.directory = run_dir_of(cfg)
        os.makedirs(self.directory, exist_ok=True)
        # process 0 owns the folder (the others trust it): taken before anything else is written
        self._lock = RunLock(self.directory) if is_coordinator() else None
        try:
            self._open(cfg, _CHANGE_ALLOWED.get() if allow_config_change is None else allow_config_change)
        except BaseException:
            self._release()
            raise
        self.preemption = Preemption()  # a SIGTERM from here on stops the run at an agreed, saved step

    def _open(self, cfg: Any, allow_config_change: bool) -> None:
        data_dir = os.path.join(self.directory, "data")
        self.config = dataclasses.replace(cfg, data=dataclasses.replace(
            cfg.data, train_files=materialize(cfg.data.train_files, data_dir, "train"),
            val_files=materialize(cfg.data.val_files, data_dir, "val")))
        # a resume compares this config with the saved one: a change is refused here, before any model is built
        self._change = resume_changes(self.directory, self.config, allow_config_change)
        self._requested = self.config  # what config.yaml records (the RL warm-up may replace `config`)
        self.tokenizer = load_tokenizer(cfg.model)
        if is_coordinator():
            if self._change is None:  # a new run, or a resume with the same config
                write_config(self.config, os.path.join(self.directory, "config.yaml"))
            self.tokenizer.save_pretrained(os.path.join(self.directory, "tokenizer"))
        t = cfg.trainer
        self.checkpointer = Checkpointer(os.path.join(self.directory, "checkpoints"), t.max_to_keep, t.async_save)
        self.tracker = Tracker(self.directory, t.logger, t.total_steps)
        self._closers: list[Callable[[], None]] = []

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()

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
        if self._change is not None:
            self._record_change(0 if found is None else found.step)
        if found is not None:
            data.set_state(found.data_state)
            if found.step >= t.total_steps:
                print0(f"{self.directory}: finished at step {found.step} (trainer.total_steps={t.total_steps}); "
                       "nothing to train")
            else:
                print0(f"resumed from {found.path}")
        return found

    def _record_change(self, step: int) -> None:
        """The run continues at `step` under a changed config: the saved config is kept as
        `config.step-<step>.yaml` (unless a config of the steps up to `step` is already
        kept there), `config.yaml` becomes this config, and `metrics.jsonl` gets a
        `config_change` event at `step`."""
        changes, self._change = self._change, None
        if not is_coordinator():
            return
        path = os.path.join(self.directory, "config.yaml")
        kept = os.path.join(self.directory, f"config.step-{step}.yaml")
        if not os.path.exists(kept):
            shutil.copyfile(path, kept)
        write_config(self._requested, path)
        event = {"step": step, "event": "config_change", "changed": {k: [old, new] for k, (old, new) in changes.items()}}
        with open(os.path.join(self.directory, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(event) + "\n")
        print0(f"config changed at step {step}: {describe_changes(changes)} (the earlier config is "
               f"{os.path.basename(kept)})")

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

    def preempted(self, step: int) -> bool:
        """Whether the run stops after `step` because a process received SIGTERM (the same
        answer on every process). The loop calls it once after each step, on every process,
        and then saves `step` and raises `preemption_stop(step)`; never at the last step
        (the run ends there anyway)."""
        agreed = self.preemption.agreed(step)
        return agreed and step < self.config.trainer.total_steps

    def preemption_stop(self, step: int) -> Preempted:
        """The `Preempted` error to raise once `step` is saved: it waits for the save to be
        written (a failed save raises its `CheckpointError` instead) and names the latest
        checkpoint."""
        self.checkpointer.wait()
        saved = self.checkpointer.latest_step()  # `step` itself unless its update was skipped as non-finite
        where = (f"checkpoint {self.checkpointer.path(saved)} is complete" if saved is not None
                 else "no checkpoint was written")
        return Preempted(f"preempted at step {step} (SIGTERM): {where}; the same command resumes from it")

    def on_close(self, close: Callable[[], None]) -> None:
        """Release `close` at the end of the run (after the checkpointer and the tracker)."""
        self._closers.append(close)

    def close(self, error: BaseException | None, step: int) -> None:
        """Finish the save in flight (`rljax.checkpoint.close_after`: `error` is what ended
        the run, `step` the step it names), close the tracker and every `on_close`; each
        is closed even if another fails, and the first failure is raised unless `error`
        already ends the run."""
        if error is None:  # where the outputs are, and what to run next
            self.tracker.finish(step)
        first = None
        for close in (lambda: close_after(self.checkpointer, error, step), self.tracker.close, *self._closers,
                      self.preemption.close, self._release):  # the folder is given up last
            try:
                close()
            except BaseException as e:  # noqa: PERF203
                first = first or e
        ending = error if error is not None else first
        if ending is not None and is_coordinator():  # the CLI writes its traceback there (one line on the console)
            ending.rljax_log = os.path.join(self.directory, LOG_FILE)
        if first is not None and error is None:
            raise first
