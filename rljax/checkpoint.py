"""Checkpoints with orbax: train state (params, optimizer, step, RNG), the data iterator's
state and run metadata, every `save_freq` steps and at the end; the last K kept; saves
are asynchronous (training goes on while the previous step is written).

Layout: `<run_dir>/checkpoints/<step>/{state,data,meta}`. A step directory appears only
once orbax has finished writing it, so a run killed mid-save resumes from the previous
complete one.

Failures name the checkpoint, in one line (`CheckpointError`):

* a save that fails (disk full, ...) raises at that save (or, when asynchronous, at the
  next save or when the run ends), saying which step was lost and that the previous one
  is intact; its partial `<step>.orbax-checkpoint-tmp*` directory is removed at the next
  start;
* every step directory gets a manifest, `checksums.json` (size and blake2b digest of each
  of its files), once orbax has finished the step (a synchronous save: at once; an
  asynchronous one: from a thread, as soon as orbax renames the step's directory into
  place); it is written last, atomically, by process 0; `wait` and the next save wait
  for it. `verify_step` compares a step with its manifest: a
  changed, truncated or missing file makes the step damaged; a step without a manifest
  (written by an older rljax, or killed between orbax's finish and the manifest) is
  unverified: used, with one warning line;
* `resume` restores the newest checkpoint that verifies and reads back; a damaged one
  (a file that differs from its checksum, a missing or truncated file) is named, set
  aside as `<step>.damaged` and the previous one used (`trainer.resume_fallback`), or the
  run stops with that line; process 0 verifies and every process follows its verdict;
* `close_after` ends a run that stopped on an exception or Ctrl-C: the save in flight
  is finished (a second Ctrl-C abandons it) and one line says which checkpoint a rerun
  resumes from.

Orbax logs the tracebacks of its background threads' failures; here their one-line
messages stay and the tracebacks go (the `CheckpointError` carries the cause).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import threading
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from rljax.distributed import is_coordinator

TMP_MARK = ".orbax-checkpoint-tmp"


class RunError(RuntimeError):
    """An error that stops a run, whose one-line message already says where its
    checkpoints stand (no further notice is printed)."""


class CheckpointError(RunError):
    """A checkpoint that cannot be written or read back; the message names it."""


def abstract_like(tree):
    """ShapeDtypeStructs carrying each array's sharding: the restore target."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class _NoOrbaxTracebacks(logging.Filter):
    """Keep orbax's error lines, drop the tracebacks attached to them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and f"{os.sep}orbax{os.sep}" in (record.pathname or ""):
            record.exc_info = None
            record.exc_text = None
        return True


def _quiet_orbax_tracebacks() -> None:
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _NoOrbaxTracebacks) for f in logger.filters):
        logger.addFilter(_NoOrbaxTracebacks())


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _cause(error: BaseException) -> str:
    """The innermost OS error of an exception chain (`[Errno 28] No space left on
    device`), else the exception itself, in one short line."""
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return f"[Errno {e.errno}] {e.strerror or os.strerror(e.errno)}"
        e = e.__cause__ or e.__context__
    return _one_line(f"{type(error).__name__}: {error}")


def finalized_steps(directory: str) -> list[int]:
    """Steps whose directory orbax has finished (renamed from its temporary name)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


MANIFEST = "checksums.json"
_CHUNK = 1 << 22


def _digest(path: str) -> str:
    """blake2b (32-byte digest) of a file's bytes, hex."""
    h = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _step_files(step_dir: str) -> list[str]:
    """Every file under a step directory but the manifest, as sorted relative paths."""
    found = []
    for root, _, names in os.walk(step_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), step_dir)
            if rel != MANIFEST and not rel.startswith(MANIFEST + "."):
                found.append(rel)
    return sorted(found)


def write_manifest(step_dir: str) -> None:
    """Write `<step_dir>/checksums.json`: {"files": {relative path: {"size", "blake2b"}}},
    through a temporary file renamed into place (its presence means complete) and synced."""
    files = {rel: {"size": os.path.getsize(os.path.join(step_dir, rel)),
                   "blake2b": _digest(os.path.join(step_dir, rel))} for rel in _step_files(step_dir)}
    tmp = os.path.join(step_dir, f"{MANIFEST}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"hash": "blake2b-256", "files": files}, f, indent=0, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(step_dir, MANIFEST))
    fd = os.open(step_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# verdicts of `check_step`: (kind, index of the first bad file in the manifest's sorted list)
INTACT, UNVERIFIED, BAD_MANIFEST, MISSING, SIZE, CHANGED = range(6)


def _manifest_files(step_dir: str) -> dict:
    with open(os.path.join(step_dir, MANIFEST)) as f:
        files = json.load(f)["files"]
    if not isinstance(files, dict):
        raise ValueError("files is not a mapping")
    return files


def check_step(step_dir: str) -> tuple[int, int]:
    """(verdict, index of the first bad file in the manifest's sorted file list, else -1):
    every file the manifest lists must exist with its size and digest."""
    if not os.path.exists(os.path.join(step_dir, MANIFEST)):
        return UNVERIFIED, -1
    try:
        files = _manifest_files(step_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return BAD_MANIFEST, -1
    for i, rel in enumerate(sorted(files)):
        path = os.path.join(step_dir, rel)
        try:
            if not os.path.isfile(path):
                return MISSING, i
            if os.path.getsize(path) != files[rel]["size"]:
                return SIZE, i
            if _digest(path) != files[rel]["blake2b"]:
                return CHANGED, i
        except (OSError, KeyError, TypeError):
            return BAD_MANIFEST, -1
    return INTACT, -1


def describe_check(step_dir: str, verdict: tuple[int, int]) -> str:
    """What `check_step`'s verdict says, e.g. `state/d/1a2b differs from its checksum`."""
    kind, index = verdict
    if kind == UNVERIFIED:
        return f"no {MANIFEST}"
    if kind == BAD_MANIFEST:
        return f"{MANIFEST} unreadable or not matching its files"
    try:
        files = _manifest_files(step_dir)
        rel = sorted(files)[index]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return f"{MANIFEST} unreadable"
    if kind == MISSING:
        return f"{rel} missing"
    if kind == SIZE:
        size = os.path.getsize(os.path.join(step_dir, rel)) if os.path.exists(os.path.join(step_dir, rel)) else 0
        return f"{rel} is {size} bytes, {files[rel]['size']} when saved"
    return f"{rel} differs from its checksum"


def agreed_check(step_dir: str) -> tuple[int, int]:
    """`check_step` on process 0, the same verdict on every process (broadcast), so every
    process restores the same step."""
    verdict = check_step(step_dir) if is_coordinator() else (INTACT, -1)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        verdict = tuple(int(v) for v in multihost_utils.broadcast_one_to_all(np.asarray(verdict, np.int32)))
    return verdict


def _unverified_note(path: str) -> str:
    return (f"warning: checkpoint {path} has no {MANIFEST} (written by an older rljax, or stopped before it was "
            "sealed): it is used unverified")


def verify_step(directory: str, step: int) -> None:
    """Before reading checkpoint `step` of `directory` outside a resume (`rljax export`,
    `rljax eval`): a CheckpointError in one line listing the steps there if there is no
    such step, or naming it and its first bad file if it is damaged; one warning line
    (process 0) if it has no manifest."""
    path = os.path.join(directory, str(step))
    steps = finalized_steps(directory)
    if step not in steps:
        there = f"the steps there: {', '.join(map(str, steps))}" if steps else "there is no checkpoint there"
        raise CheckpointError(f"{directory}: no checkpoint of step {step}; {there}")
    verdict = agreed_check(path)
    if verdict[0] == UNVERIFIED:
        if is_coordinator():
            print(_unverified_note(path), file=sys.stderr, flush=True)
    elif verdict[0] != INTACT:
        good = next((s for s in reversed(finalized_steps(directory))
                     if s != step and check_step(os.path.join(directory, str(s)))[0] == INTACT), None)
        other = (f"the newest intact one is {os.path.join(directory, str(good))} (--step {good})" if good is not None
                 else "no other checkpoint there verifies")
        raise CheckpointError(f"checkpoint {path} is damaged ({describe_check(path, verdict)}); {other}")


class Checkpointer:
    def __init__(self, directory: str, max_to_keep: int | None = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        _quiet_orbax_tracebacks()
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self.async_save = async_save
        self._pending: int | None = None  # step of the last save, until it is known complete and sealed
        self._failed = False
        self._sealer: tuple[threading.Thread, threading.Event] | None = None  # writes the pending manifest
        self._seal_error: CheckpointError | None = None

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _save_error(self, step: int | None, error: BaseException) -> CheckpointError:
        """The one-line error of a save that failed: which step, why, which is intact."""
        if self._pending is not None and not os.path.isdir(self.path(self._pending)):
            step = self._pending  # an asynchronous save that failed in the background
        self._failed, self._pending = True, None
        try:
            self._join_sealer()
        except CheckpointError:
            pass
        earlier = [s for s in finalized_steps(self.directory) if step is None or s < step]
        cause = _cause(error)
        kept = (f"the previous checkpoint, {self.path(earlier[-1])}, is intact" if earlier
                else "no earlier checkpoint exists")
        fix = "free space" if "[Errno 28]" in cause else "fix the cause"
        return CheckpointError(f"checkpoint {step} could not be written to {self.directory} ({cause}); {kept}: "
                               f"{fix} and rerun the same command to resume")

    def _seal(self, step: int | None) -> None:
        """Write the manifest of finished step `step` (process 0; nothing if orbax did not
        save it or removed it)."""
        if step is None or not is_coordinator() or not os.path.isdir(self.path(step)):
            return
        try:
            write_manifest(self.path(step))
        except FileNotFoundError:
            pass  # removed meanwhile (max_to_keep)
        except OSError as e:
            raise CheckpointError(f"checkpoint {self.path(step)} was written but its {MANIFEST} could not be "
                                  f"({_cause(e)}): it resumes unverified; fix the cause and rerun the same "
                                  "command") from e

    def _start_sealer(self, step: int) -> None:
        """Process 0, asynchronous save: a thread that writes the manifest of `step` as soon
        as orbax has renamed its directory into place (its files are final then), so a run
        killed later resumes from a verified step. `_join_sealer` ends it."""
        if not is_coordinator():
            return
        done = threading.Event()  # set once orbax has finished (or failed) the save

        def run():
            while True:
                if os.path.isdir(self.path(step)):
                    try:
                        self._seal(step)
                    except CheckpointError as e:
                        self._seal_error = e
                    return
                if done.wait(0.2):
                    if os.path.isdir(self.path(step)):
                        continue  # finished between the two checks
                    return

        self._sealer = (threading.Thread(target=run, name=f"rljax-seal-{step}", daemon=True), done)
        self._sealer[0].start()

    def _join_sealer(self) -> None:
        """Wait for the manifest thread (orbax's save has ended); raise its error."""
        if self._sealer is None:
            return
        thread, done = self._sealer
        done.set()
        thread.join()
        self._sealer = None
        error, self._seal_error = self._seal_error, None
        if error is not None:
            raise error

    def save(self, step: int, state, data_state: dict, meta: dict) -> None:
        if self._pending is not None and not self._failed:
            self.wait()  # the previous asynchronous save: finished and sealed first
        try:
            saved = self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    data=ocp.args.JsonSave(data_state),
                    meta=ocp.args.JsonSave(meta),
                ),
            )
        except Exception as e:
            raise self._save_error(step, e) from e
        if saved is False:
            return
        self._pending = step
        if self.async_save:
            self._start_sealer(step)
        else:  # finished already
            self._pending = None
            self._seal(step)

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
        """Block until the save in flight is written; a failed one raises CheckpointError."""
        if self._failed:
            return
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise self._save_error(None, e) from e
        self._pending = None
        self._join_sealer()

    def close(self) -> None:
        """Finish the save in flight and release orbax. A Ctrl-C while waiting abandons
        the save (its partial directory is removed at the next start)."""
        try:
            self.wait()
        except KeyboardInterrupt:
            raise  # closing orbax would wait for the save again
        except BaseException:
            self._close_manager()
            raise
        self._close_manager()

    def _close_manager(self) -> None:
        try:
            self._manager.close()
        except Exception:
            if not self._failed:  # after a failed save, orbax raises that failure again here
                raise


def _interrupted_save_note(checkpointer: Checkpointer) -> str:
    pending = checkpointer._pending
    return (f"; the save of checkpoint {pending} was abandoned (its partial directory is removed at the next start)"
            if pending is not None and not os.path.isdir(checkpointer.path(pending)) else "")


def close_after(checkpointer: Checkpointer, error: BaseException | None, step: int) -> None:
    """Close `checkpointer` at the end of a run, finishing the save in flight.

    `error`: the exception (or KeyboardInterrupt) that ended the run, None if it
    finished. After one, a second Ctrl-C while waiting abandons the save, a failing save
    does not hide the first error, and process 0 prints one line: where the run stopped
    and which checkpoint the same command resumes from. Without one, a failed save
    raises its CheckpointError."""
    abandoned = ""
    save_failure = None
    try:
        checkpointer.close()
    except KeyboardInterrupt:
        if error is None:
            raise
        abandoned = _interrupted_save_note(checkpointer)
    except CheckpointError as e:
        if error is None:
            raise
        save_failure = e
    if error is None or isinstance(error, RunError) or not is_coordinator():
        return
    how = "interrupted" if isinstance(error, KeyboardInterrupt) else f"stopped by {type(error).__name__}"
    if save_failure is not None:
        where = str(save_failure)
    else:
        done = finalized_steps(checkpointer.directory)
        where = (f"checkpoint {checkpointer.path(done[-1])} is complete: rerun the same command to resume from it"
                 if done else "no checkpoint was written: a rerun starts over")
    print(f"{how} at step {step}: {where}{abandoned}", file=sys.stderr, flush=True)
    error.rljax_reported = True  # the CLI prints nothing more for it


class ShapeMismatchError(CheckpointError):
    """A checkpoint whose parameters do not have the shapes of the model it is read into."""


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def check_param_shapes(directory: str, step: int, abstract_params: nnx.State, at: tuple[str, ...]) -> None:
    """Raise `ShapeMismatchError` (one line) when the parameters stored under `at` in
    checkpoint `step` differ from `abstract_params` (the model they are read into): the
    first parameter that differs with the model's and the checkpoint's shapes (or that
    one of them lacks), and how many differ."""
    path = os.path.join(directory, str(step))
    try:
        stored = ocp.PyTreeCheckpointHandler().metadata(epath.Path(path) / "state")
    except Exception:  # noqa: BLE001 - unreadable metadata: the restore itself says what is wrong
        return
    stored = getattr(stored, "tree", stored)
    for key in at:
        if not isinstance(stored, dict) or key not in stored:
            raise ShapeMismatchError(f"checkpoint {path} holds no {'/'.join(at)}: not a checkpoint of this kind of run")
        stored = stored[key]
    found = {_path_name(p)[:-len("/value")]: tuple(leaf.shape)
             for p, leaf in jax.tree_util.tree_leaves_with_path(stored) if hasattr(leaf, "shape")}
    expected = {_path_name(p): tuple(leaf.shape)
                for p, leaf in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(abstract_params))}
    differ = [(name, expected.get(name), found.get(name)) for name in sorted(set(expected) | set(found))
              if expected.get(name) != found.get(name)]
    if not differ:
        return
    name, want, got = differ[0]
    what = (f"is not in the checkpoint (the model has it, shape {want})" if got is None else
            f"is not in the model (the checkpoint has it, shape {got})" if want is None else
            f"has shape {got} in the checkpoint, the model expects {want}")
    raise ShapeMismatchError(f"checkpoint {path}: parameter {'/'.join(at)}/{name} {what}; {len(differ)} of "
                             f"{len(expected)} parameters differ: the model config is not the one the run trained")


def restore_params(directory: str, step: int, abstract_params: nnx.State, at: tuple[str, ...]) -> nnx.State:
    """Only the parameters stored under `at` in a checkpoint's train state (e.g.
    ``("actor", "params")`` of an RL run), in `abstract_params`' shapes, dtypes and
    shardings: an orbax partial restore, so optimizer state (and a critic) stay on disk."""

    def leaf(x):  # how nnx.State leaves are stored: {"value": array}
        return {"value": x}

    check_param_shapes(directory, step, abstract_params, at)
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
    must exist. (`resume` restores it, skipping a damaged one.)"""
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


@dataclass
class Resumed:
    """A restored checkpoint: `state` in the target's shardings, the data iterator's state,
    the run metadata, and where it came from."""

    state: Any
    data_state: dict
    meta: dict
    directory: str
    step: int

    @property
    def path(self) -> str:
        return os.path.join(self.directory, str(self.step))


class _Unverifiable(Exception):
    """A step whose files do not match its manifest (the message says which)."""


_DAMAGE_MARKS = ("OUT_OF_RANGE", "DATA_LOSS", "NOT_FOUND", "Unexpected end", "truncated", "corrupt", "No such file")


def _damage(path: str, error: BaseException) -> tuple[str, bool]:
    """(what is wrong with the checkpoint at `path`, whether it is surely damaged): a
    missing part, a truncated JSON file, an array file that reads short; otherwise the
    innermost read error (which may as well be a config that no longer matches)."""
    for rel in ("state", "data", "meta", "state/_METADATA", "data/metadata", "meta/metadata"):
        if not os.path.exists(os.path.join(path, rel)):
            return f"{rel} missing", True
    for rel in ("state/_METADATA", "data/metadata", "meta/metadata", "_CHECKPOINT_METADATA"):
        if os.path.exists(os.path.join(path, rel)):
            try:
                with open(os.path.join(path, rel)) as f:
                    json.load(f)
            except (ValueError, UnicodeDecodeError):
                return f"{rel} truncated or not JSON", True
    seen, inner = set(), error  # the innermost error: tensorstore's "Error reading <array> ...", not orbax's wrapper
    while (inner.__cause__ or inner.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        inner = inner.__cause__ or inner.__context__
    text = f"{type(inner).__name__}: {inner}"
    surely = isinstance(inner, (FileNotFoundError, EOFError)) or any(m in text for m in _DAMAGE_MARKS)
    return ("unreadable: " if surely else "") + _one_line(text, 240), surely


def _describe(path: str, damage: tuple[str, bool]) -> str:
    reason, surely = damage
    return f"checkpoint {path} is damaged ({reason})" if surely else f"checkpoint {path} cannot be restored ({reason})"


def _set_aside(directory: str, step: int) -> str:
    """Rename a damaged step directory to `<step>.damaged[-k]` (orbax no longer sees a
    step there, so the resumed run can write that step again); -> the new path."""
    base = os.path.join(directory, f"{step}.damaged")
    target, k = base, 1
    while os.path.exists(target):
        target, k = f"{base}-{k}", k + 1
    os.rename(os.path.join(directory, str(step)), target)
    return target


def _remove_partial_saves(directory: str) -> None:
    """Remove the `<step>.orbax-checkpoint-tmp*` directories of saves an earlier attempt
    of this run did not finish (killed, disk full, a second Ctrl-C)."""
    if not is_coordinator() or not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if re.fullmatch(r"\d+" + re.escape(TMP_MARK) + r".*", name):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _report_fallback(source: Checkpointer, own: Checkpointer, failed: list, step: int) -> None:
    """The newer checkpoints in `failed` did not restore but `step` did: set them aside
    (in the run's own directory) and say so in one line."""
    if not failed:
        return
    moved = []
    if source is own and is_coordinator():
        moved = [_set_aside(own.directory, bad) for bad, _ in failed]
    if source is own:
        own._manager.reload()
    if is_coordinator():
        what = "; ".join(_describe(source.path(bad), damage) for bad, damage in failed)
        aside = f"; set aside as {', '.join(moved)}" if moved else ""
        print(f"{what}; resuming from the previous one, {source.path(step)}{aside}", file=sys.stderr, flush=True)


def resume(mode: str, own: Checkpointer, abstract_state, fallback: bool = True) -> Resumed | None:
    """Restore where `trainer.resume_mode` says a run starts from (see `resume_source`);
    None to start from scratch. Both kinds of run (supervised, RL) resume through here.

    The newest checkpoint that verifies against its manifest (`check_step`, decided on
    process 0 for every process) and reads back wins; one without a manifest is used
    with a warning line. One that does not (a file that differs from its checksum, a
    missing or truncated file, missing metadata) is named in one line with its first bad
    file; with `fallback`
    (trainer.resume_fallback) the earlier ones are tried and, once one restores, the
    newer ones are set aside as `<step>.damaged` in the run's own directory (so the run
    can write those steps again). Without `fallback`, when the path names one step, or
    when no checkpoint restores (then nothing is moved: a changed config, more likely),
    a `CheckpointError` names the checkpoint and why. Partial saves an earlier attempt
    left (`<step>.orbax-checkpoint-tmp*`) are removed first."""
    if mode == "disable":
        return None
    _remove_partial_saves(own.directory)
    if mode == "auto":
        source, steps, named = own, sorted(own.all_steps(), reverse=True), False
        if not steps:
            return None
    else:
        directory, step = resolve_checkpoint(mode)
        source = own if directory == own.directory else Checkpointer(directory, max_to_keep=None, async_save=False)
        named = step is not None
        steps = [step] if named else sorted(source.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"trainer.resume_mode={mode!r}: no checkpoint there")
    failed: list[tuple[int, tuple[str, bool]]] = []  # newer checkpoints that did not restore
    try:
        for step in steps:
            verdict = agreed_check(source.path(step))
            try:
                if verdict[0] not in (INTACT, UNVERIFIED):
                    raise _Unverifiable(describe_check(source.path(step), verdict))
                state, data_state, meta = source.restore(step, abstract_state)
                if not isinstance(meta, dict) or meta.get("step", step) != step or not isinstance(data_state, dict):
                    raise ValueError(f"meta/metadata does not describe step {step}")
            except Exception as e:
                failed.append((step, (str(e), True) if isinstance(e, _Unverifiable) else _damage(source.path(step), e)))
                first = _describe(source.path(step), failed[-1][1])
                if named:
                    raise CheckpointError(f"{first}; trainer.resume_mode names this checkpoint: name another step "
                                          "or run directory") from None
                if not fallback:
                    older = [s for s in steps if s < step]
                    instead = (f"set it true to resume from the previous checkpoint, {source.path(older[0])}, or "
                               "remove this one" if older else "remove it to start over")
                    raise CheckpointError(f"{first}; trainer.resume_fallback=false: {instead}") from None
                continue
            _report_fallback(source, own, failed, step)
            if verdict[0] == UNVERIFIED and is_coordinator():
                print(_unverified_note(source.path(step)), file=sys.stderr, flush=True)
            return Resumed(state, data_state, meta, source.directory, step)
        latest = _describe(source.path(failed[0][0]), failed[0][1])
        if len(failed) == 1:
            raise CheckpointError(f"{latest} and no earlier checkpoint exists: remove it (or set "
                                  "trainer.resume_mode=disable) to start over")
        mismatch = "" if any(surely for _, (_, surely) in failed) else (
            " (do the model, optimizer or trainer settings differ from the run that wrote them?)")
        raise CheckpointError(f"{latest}; none of the {len(failed) - 1} earlier checkpoints restores either"
                              f"{mismatch}; nothing was moved")
    finally:
        if source is not own:
            source.close()
