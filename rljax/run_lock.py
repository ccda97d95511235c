"""One owner per run folder: an exclusive `flock` on `<run>/.lock`.

The owner holds an open descriptor of `.lock` with `fcntl.flock(LOCK_EX)` for the life of
the run and writes who it is into the file (host, pid, start time in UTC). The kernel
drops the lock when that descriptor is closed, which also happens when the process dies
in any way (kill -9 included), so a lock is never stale: the file may stay behind, but
nobody holds it. A second owner (another process, or another `RunLock` in the same
process: `flock` locks belong to the open file, not the process) fails at once with
`RunLockedError`, one line naming the folder and the owner's record.

On a network filesystem the guarantee is the filesystem's: on Linux NFS clients `flock`
is emulated with NFS byte-range locks (held across clients on NFSv4 and on NFSv3 with a
lock manager; a `local_lock=` mount option makes it local to one client), and on GCS
FUSE (`gcsfuse`) file locks are not supported: the lock then only excludes owners on the
same host (docs/runs.md, "One owner per run folder").
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import socket

LOCK_FILE = ".lock"


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
