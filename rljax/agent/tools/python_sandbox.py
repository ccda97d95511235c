"""A Python code-interpreter tool that runs model-written code in a separate, limited process.

What runs: ``<launcher> <python> -I -S -B -c PREAMBLE CONFIG`` with the code on stdin, spawned
by `asyncio.create_subprocess_exec`, in a new session (its own process group), in a fresh
scratch directory (``tempfile.mkdtemp``; see "Scratch space" below), with an environment of exactly
``PATH=/usr/bin:/bin`` and ``TMPDIR=<scratch>``. Which launcher is decided once per
configuration by a probe that runs a small program under each candidate and keeps the first
one whose isolation the program actually observes; `capabilities()` reports those
observations and the active layers are logged once (a warning when the OS layer or the uid
drop is missing).

Two groups of layers; each layer fails independently of the others.

OS layer (``os_sandbox: auto``, when bubblewrap's ``bwrap`` is installed and works; see
``os_sandbox.py``): fresh mount, pid, network, ipc and uts namespaces; a root with only
``/usr``, the system ``/bin``/``/lib`` entries, the interpreter's own files, ``read_paths``, a
private ``/proc`` and ``/dev``, and the scratch dir (the only writable path: a tmpfs of
``max_scratch_mb``); as root, the
preamble drops to `sandbox_uid`/`sandbox_gid` before any model code runs (this works for an
interpreter under ``/root`` too, since only its files are bound, at their own paths);
``no_new_privs``; a seccomp filter refusing namespace creation, mounts, ``ptrace``, ``bpf``,
``keyctl``, ``io_uring``, ``perf_event_open``, ``userfaultfd``, module loading and the like
(x86_64 and aarch64). These hold against native code too: they are kernel-enforced.

In-process layers (always, bwrap or not):

1. Resource limits, set in a `preexec_fn` between fork and exec: ``RLIMIT_CPU`` (CPU seconds,
   SIGXCPU then SIGKILL), ``RLIMIT_AS`` (address space, so big allocations raise
   ``MemoryError``), ``RLIMIT_NPROC`` (processes of the sandbox's user), ``RLIMIT_FSIZE``
   (largest file it can write), ``RLIMIT_NOFILE``, ``RLIMIT_CORE = 0``.
2. A wall-clock timeout that SIGKILLs the whole process group; a cap on captured output
   (the group is killed when the cap is exceeded).
3. Without bwrap: ``unshare --net`` for an empty network namespace when the probe shows it
   works, and, as root, ``--setuid/--setgid`` to the unprivileged uid if that uid can run the
   interpreter (not for one under ``/root``: then the code runs as root, and the log and
   `capabilities()` say so). ``RLIMIT_NPROC`` only binds a non-root uid.
4. An audit hook (``sys.addaudithook``, installed by the preamble before the code runs) that
   raises ``PermissionError`` on: every ``socket.*`` event; process creation (``os.fork``,
   ``os.exec``, ``os.posix_spawn``, ``os.spawn``, ``os.system``, ``subprocess.Popen``,
   ``pty.spawn``); creating a sub-interpreter (``cpython.PyInterpreterState_New``: a new
   interpreter would start without the hook) and importing the sub-interpreter modules;
   signals (``os.kill``, ``os.killpg``, ``signal.pthread_kill``); ``ctypes`` and importing
   ``ctypes``/``_ctypes``/``_posixsubprocess``/the ``_test*`` modules; loading an extension
   module from outside the standard library; ``code.__new__`` (hand-made code objects);
   ``resource.setrlimit``/``prlimit``; ``gc`` object walks and rebinding function
   code/defaults; writing, creating, removing, renaming, linking or chmod-ing a path outside
   the scratch directory; reading or listing a path outside the scratch directory, the
   interpreter's standard library, ``read_paths``, ``/usr/share/zoneinfo``, ``/dev/null``-like
   devices and the process's own ``/proc`` entry; ``os.open`` of a directory outside the
   scratch dir; creating more than ``max_scratch_files`` new files, directories and links in
   one call (opening an existing file for writing creates nothing). A relative path is checked against the working directory *and* every open
   directory fd, because the audit event does not say which ``dir_fd`` a ``*at()`` call uses.
5. ``-I -S``: isolated mode (no ``PYTHON*`` variables, no user site, no script dir on
   ``sys.path``) and no ``site``: only the standard library is importable.

Scratch space, per call. Under the OS layer the scratch dir is a tmpfs of ``max_scratch_mb``
(bubblewrap's ``--size`` before ``--tmpfs``) in the sandbox's own mount namespace: all files
of the call together hold at most that many bytes (more fails with ``ENOSPC`` inside the
call), and the tmpfs vanishes with the sandbox's last process; the host directory of the
same name stays empty. Its inode count is the kernel's default for a tmpfs (half the RAM's
pages), so files without content are bounded by the audit hook's count (below) and by the
wall clock. Without the OS layer the scratch dir is a host directory; what bounds it is
``RLIMIT_FSIZE`` per file (kernel-enforced) and ``max_scratch_files`` creations of files,
directories and links per call (the audit hook: a tripwire, off with the hook), so at most
``max_scratch_files * max_file_size_mb`` bytes with the hook, and only the wall clock
without it. Either way the host directory is removed after the call by
``os_sandbox.remove_tree`` in a worker thread: fd-relative, iterative, following no link,
entering no other filesystem, opening closed directories by chmod through an ``O_PATH`` fd,
so depth, names and modes cannot defeat it; what it cannot remove is logged as an error.

What holds without the OS layer: the in-process layers are a CPython-level tripwire, not a
security boundary. Native code (a memory-corruption bug, crafted bytecode through
``marshal``) bypasses an audit hook; path checks race with threads that swap symlinks
between check and use; ``os.stat``/``os.path.exists`` of any path are not audited. The code
may run as root (see 3). It is a guard against the mistakes and accidents of RL policies
(infinite loops, fork loops, memory blow-ups, stray writes and reads, chatty output, the
network), not against an adversary. With the OS layer the filesystem, process, network and
uid boundaries are the kernel's; remaining risk is a kernel bug reachable through the
allowed system calls. For hostile workloads add a VM or gVisor, or use the remote
`SandboxFusionTool` (``sandbox_fusion.py``).

`preexec_fn` note: it runs Python code between fork and exec, which CPython documents as
unsafe in processes with threads (a lock held by another thread at fork time can deadlock
the child). The function used here only calls ``resource.setrlimit`` on a module imported at
load time, which needs no locks; if that ever deadlocks, the wall-clock timeout still kills
the child.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from rljax.agent.tools.base import PerLoopSemaphore, Tool, ToolResult
from rljax.agent.tools.os_sandbox import (
    bwrap_argv, find_bwrap, interpreter_files, remove_tree, seccomp_filter, seccomp_pipe,
)
from rljax.agent.tools.sandbox_preamble import PREAMBLE, PROBE_CODE

logger = logging.getLogger(__name__)

@dataclass
class SandboxRun:
    """Outcome of one execution."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    output_truncated: bool = False
    pid: int | None = None  # of the process started (bwrap's, under the OS layer)

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


@dataclass(frozen=True)
class _Launch:
    """How to start the interpreter, decided once per configuration by `_probe`."""

    prefix: tuple[str, ...]  # e.g. ("unshare", "--net", "--"); unused for bwrap
    drop_uid: int | None  # uid the code runs as when privileges are dropped
    drop_gid: int | None
    network_namespace: bool
    preexec_setuid: bool  # drop in preexec_fn (when unshare is not usable)
    bwrap: str | None = None  # the OS layer: bubblewrap's path
    seccomp: bool = False  # (bwrap) with the seccomp filter
    preamble_drop: bool = False  # (bwrap as root) the preamble drops to drop_uid/drop_gid
    user_namespace: bool = False  # (bwrap as another user) explicit user namespace


@dataclass(frozen=True)
class _Probed:
    """The launch chosen, what the code observed under it, and why other layers are off."""

    launch: _Launch
    observed: dict[str, Any]
    pid_namespace: bool
    interpreter: str  # what is executed (the real interpreter under bwrap)
    binds: tuple[str, ...]  # read-only paths bound under bwrap
    notes: tuple[str, ...]  # reasons layers are inactive


_PROBE_CACHE: dict[tuple[Any, ...], _Probed] = {}
_CANARIES = ("/etc", "/home", "/root", "/var", "/opt", "/srv", "/mnt")


def _limits_preexec(limits: tuple[tuple[int, int, int], ...], uid: int | None,
                    gid: int | None) -> Any:
    """A preexec_fn setting rlimits (and optionally dropping to uid/gid). Binds everything."""
    setrlimit, setgroups, setgid, setuid = resource.setrlimit, os.setgroups, os.setgid, os.setuid

    def preexec() -> None:
        for which, soft, hard in limits:
            setrlimit(which, (soft, hard))
        if uid is not None and gid is not None:
            setgroups([])
            setgid(gid)
            setuid(uid)

    return preexec


class PythonSandboxTool(Tool):
    """Runs ``{"code": str}`` and returns stdout (+ stderr); see the module docstring.

    Options (all in the tool's YAML ``options``):
        timeout_s: wall-clock limit per call; the process group is killed after it.
        cpu_time_s: RLIMIT_CPU in seconds.
        memory_mb: RLIMIT_AS in MiB.
        max_processes: RLIMIT_NPROC (effective only when the code does not run as root).
        max_file_size_mb: RLIMIT_FSIZE in MiB.
        max_scratch_mb: under bubblewrap, the size in MiB of the scratch tmpfs (all files of
            one call together; tmpfs pages are memory, so at most this much RAM per
            concurrent call).
        max_scratch_files: files, directories and links one call may create (the audit
            hook counts them; a tripwire, see the module docstring).
        max_open_files: RLIMIT_NOFILE.
        max_output_bytes: cap on captured stdout and on stderr (each); more kills the run.
        os_sandbox: "auto" (bubblewrap when ``bwrap`` is installed and works), "required"
            (raise if it does not), or "off" (in-process layers only).
        seccomp: under bubblewrap, also install the seccomp filter (x86_64, aarch64).
        read_paths: extra paths the code may read (bound read-only under bubblewrap).
        network_isolation: "auto" (a network namespace if the probe works), "required"
            (raise if it does not), or "off".
        drop_privileges: when root, run the code as `sandbox_uid`/`sandbox_gid` if possible.
        audit_hook: install the audit hook (turn off only to test the other layers).
        interpreter: the Python to run (default ``sys.executable``).
        max_concurrency: at most this many executions at once per tool instance
            (default: the number of CPUs).
        scratch_root: where scratch directories are created (default: the system temp dir).
    """

    default_schema = {
        "type": "function",
        "function": {
            "name": "python",
            "description": (
                "Run a Python 3 program (standard library only, no network, no files outside "
                "the working directory) and return what it prints."
            ),
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The program to run."}},
                "required": ["code"],
            },
        },
    }

    def __init__(self, schema: dict[str, Any] | None = None, timeout_s: float = 10.0,
                 cpu_time_s: int = 5, memory_mb: int = 512, max_processes: int = 64,
                 max_file_size_mb: int = 16, max_scratch_mb: int = 64,
                 max_scratch_files: int = 4096, max_open_files: int = 64,
                 max_output_bytes: int = 16384, os_sandbox: str = "auto", seccomp: bool = True,
                 read_paths: list[str] | None = None, network_isolation: str = "auto",
                 drop_privileges: bool = True, sandbox_uid: int = 65534, sandbox_gid: int = 65534,
                 audit_hook: bool = True, interpreter: str | None = None,
                 max_concurrency: int | None = None, scratch_root: str | None = None):
        super().__init__(schema)
        if network_isolation not in ("auto", "required", "off"):
            raise ValueError(f"network_isolation must be auto|required|off, got {network_isolation!r}")
        if os_sandbox not in ("auto", "required", "off"):
            raise ValueError(f"os_sandbox must be auto|required|off, got {os_sandbox!r}")
        self.timeout_s = float(timeout_s)
        self.cpu_time_s = int(cpu_time_s)
        self.memory_mb = int(memory_mb)
        self.max_processes = int(max_processes)
        self.max_file_size_mb = int(max_file_size_mb)
        self.max_scratch_mb = int(max_scratch_mb)
        self.max_scratch_files = int(max_scratch_files)
        self.max_open_files = int(max_open_files)
        self.max_output_bytes = int(max_output_bytes)
        for key in ("timeout_s", "cpu_time_s", "memory_mb", "max_processes", "max_file_size_mb",
                    "max_scratch_mb", "max_scratch_files", "max_open_files", "max_output_bytes"):
            if not getattr(self, key) > 0:
                raise ValueError(f"python sandbox option {key} must be > 0, got {getattr(self, key)!r}")
        self.os_sandbox = os_sandbox
        self.seccomp = bool(seccomp)
        self.read_paths = tuple(os.path.realpath(p) for p in (read_paths or ()))
        self.network_isolation = network_isolation
        self.drop_privileges = bool(drop_privileges)
        self.sandbox_uid, self.sandbox_gid = int(sandbox_uid), int(sandbox_gid)
        self.audit_hook = bool(audit_hook)
        self.interpreter = interpreter or sys.executable
        self.scratch_root = scratch_root
        self._semaphore = PerLoopSemaphore(max_concurrency or os.cpu_count() or 1)
        self._probe_lock = PerLoopSemaphore(1)
        self._probed: _Probed | None = None

    # -- the tool interface ---------------------------------------------------------------
    async def call(self, arguments: dict[str, Any], state: Any) -> ToolResult:
        run = await self.run(arguments["code"])
        return self.format_result(run)

    def format_result(self, run: SandboxRun) -> ToolResult:
        """Turn a run into what the model sees; timeouts/CPU kills are ``timeout`` errors."""
        text = run.stdout
        if run.stderr:
            text += ("" if not text or text.endswith("\n") else "\n") + run.stderr
        if run.output_truncated:
            text += f"\n[output truncated at {self.max_output_bytes} bytes]"
        error = None
        if run.timed_out:
            text += f"\nError: execution timed out after {self.timeout_s:g} s"
            error = "timeout"
        elif run.signal_name == "SIGXCPU" and not run.output_truncated:
            text += f"\nError: CPU time limit exceeded ({self.cpu_time_s} s)"
            error = "timeout"
        elif run.signal_name == "SIGKILL" and not run.output_truncated:
            # RLIMIT_CPU's hard limit (one second after SIGXCPU) or the kernel's OOM killer.
            text += f"\nError: killed (CPU time limit of {self.cpu_time_s} s or memory limit)"
            error = "timeout"
        elif run.signal_name is not None and not run.output_truncated:
            text += f"\n[process killed by {run.signal_name}]"
        return ToolResult(text.strip("\n") or "(no output)", error=error)

    # -- running --------------------------------------------------------------------------
    async def launch_config(self) -> _Launch:
        """Decide (once) how to start the interpreter: which isolation layers work here."""
        return (await self._probe_once()).launch

    async def _probe_once(self) -> _Probed:
        if self._probed is None:
            async with self._probe_lock.get():
                if self._probed is None:
                    self._probed = await self._probe()
        return self._probed

    def _candidates(self, bwrap: str | None) -> list[_Launch]:
        root = os.geteuid() == 0
        uid, gid = self.sandbox_uid, self.sandbox_gid
        drop = root and self.drop_privileges
        net = self.network_isolation != "off"
        out: list[_Launch] = []
        if bwrap and self.os_sandbox != "off":
            for sec in ([True, False] if self.seccomp and seccomp_filter() is not None else [False]):
                if root:
                    if drop:
                        out.append(_Launch((), uid, gid, net, False, bwrap, sec, preamble_drop=True))
                    out.append(_Launch((), None, None, net, False, bwrap, sec))
                else:
                    out.append(_Launch((), None, None, net, False, bwrap, sec, user_namespace=True))
                    out.append(_Launch((), None, None, net, False, bwrap, sec))
        if self.os_sandbox == "required":
            return out
        unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
        if unshare and net:
            if root:
                if drop:
                    out.append(_Launch((unshare, "--net", "--setuid", str(uid), "--setgid", str(gid), "--"),
                                       uid, gid, True, False))
                out.append(_Launch((unshare, "--net", "--"), None, None, True, False))
            else:
                out.append(_Launch((unshare, "--user", "--map-current-user", "--net", "--"),
                                   None, None, True, False))
        if self.network_isolation != "required":
            if drop:
                out.append(_Launch((), uid, gid, False, True))
            out.append(_Launch((), None, None, False, False))
        return out

    async def _probe(self) -> _Probed:
        key = (self.interpreter, self.network_isolation, self.drop_privileges, self.sandbox_uid,
               self.sandbox_gid, self.os_sandbox, self.seccomp, self.read_paths, self.audit_hook)
        key += (self.max_scratch_mb,)
        if key in _PROBE_CACHE:
            return _PROBE_CACHE[key]
        notes: list[str] = []
        bwrap = find_bwrap() if self.os_sandbox != "off" else None
        real, binds = self.interpreter, ()
        if self.os_sandbox == "off":
            notes.append("OS sandbox off by configuration (os_sandbox: off)")
        elif bwrap is None:
            notes.append("OS sandbox unavailable: bubblewrap (bwrap) is not installed")
        else:
            try:
                real, bind_list, _ = await asyncio.to_thread(interpreter_files, self.interpreter)
                binds = tuple(bind_list) + self.read_paths
            except (OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
                notes.append(f"OS sandbox unavailable: cannot ask {self.interpreter} for its files ({e})")
                bwrap = None
        # A host directory the sandbox must not see (not on the way to anything bound).
        shown = (*binds, os.path.realpath(self.scratch_root or tempfile.gettempdir()))
        canary = next((c for c in _CANARIES if os.path.isdir(c)
                       and not any(b == c or b.startswith(c + "/") for b in shown)), None)
        code = PROBE_CODE.replace("CANARY", repr(canary))
        chosen: _Probed | None = None
        failures: list[str] = []
        for cand in self._candidates(bwrap):
            interp = real if cand.bwrap else self.interpreter
            run = await self._spawn(code, cand, timeout_s=10.0, interpreter=interp, binds=binds)
            obs = _parse_probe(run)
            if obs is None:
                failures.append(_describe(cand) + ": " + (run.stderr.strip().splitlines() or ["no output"])[-1])
                continue
            if cand.drop_uid is not None and (obs["uid"], obs["gid"]) != (cand.drop_uid, cand.drop_gid):
                failures.append(_describe(cand) + f": runs as uid {obs['uid']}")
                continue
            if cand.seccomp and obs["seccomp"] != "2":
                failures.append(_describe(cand) + ": no seccomp filter in effect")
                continue
            chosen = _Probed(cand, obs, pid_namespace=obs["pid"] != run.pid, interpreter=interp,
                             binds=binds if cand.bwrap else (), notes=tuple(notes + failures))
            break
        if chosen is None:
            raise RuntimeError(
                "python sandbox: no way to start the interpreter "
                f"({self.interpreter}) with os_sandbox={self.os_sandbox!r}, "
                f"network_isolation={self.network_isolation!r}: " + "; ".join(notes + failures)
            )
        _PROBE_CACHE[key] = chosen
        self._log_layers(chosen)
        return chosen

    def _log_layers(self, probed: _Probed) -> None:
        caps = _capabilities(probed, self.audit_hook)
        msg = (f"python sandbox ({self.interpreter}): active layers: {', '.join(caps['layers'])}"
               + (f"; inactive: {'; '.join(probed.notes)}" if probed.notes else ""))
        weak = (caps["os_sandbox"] is None and self.os_sandbox != "off") or (
            os.geteuid() == 0 and self.drop_privileges and not caps["privileges_dropped"])
        (logger.warning if weak else logger.info)(msg)

    async def capabilities(self) -> dict[str, Any]:
        """Which layers are active, as the code observed them at probe time (for logs and tests).

        Keys: ``os_sandbox`` ("bwrap" or None), ``mount_namespace``, ``pid_namespace``,
        ``network_namespace``, ``seccomp``, ``no_new_privs``, ``uid``/``gid`` (what the code
        runs as), ``privileges_dropped`` (a root parent's code does not run as root),
        ``nproc_limit_effective``, ``audit_hook``, ``read_confinement`` ("mount namespace",
        "audit hook" or None), ``layers`` (readable list), ``notes`` (why others are off).
        """
        return _capabilities(await self._probe_once(), self.audit_hook)

    async def run(self, code: str) -> SandboxRun:
        """Execute `code` in the sandbox (see module docstring)."""
        probed = await self._probe_once()
        async with self._semaphore.get():
            return await self._spawn(code, probed.launch, timeout_s=self.timeout_s,
                                     interpreter=probed.interpreter, binds=probed.binds)

    def _limits(self) -> tuple[tuple[int, int, int], ...]:
        mib = 1024 * 1024
        return (
            (resource.RLIMIT_CPU, self.cpu_time_s, self.cpu_time_s + 1),
            (resource.RLIMIT_AS, self.memory_mb * mib, self.memory_mb * mib),
            (resource.RLIMIT_NPROC, self.max_processes, self.max_processes),
            (resource.RLIMIT_FSIZE, self.max_file_size_mb * mib, self.max_file_size_mb * mib),
            (resource.RLIMIT_NOFILE, self.max_open_files, self.max_open_files),
            (resource.RLIMIT_CORE, 0, 0),
        )

    async def _spawn(self, code: str, launch: _Launch, timeout_s: float, interpreter: str,
                     binds: tuple[str, ...] = ()) -> SandboxRun:
        scratch = os.path.realpath(tempfile.mkdtemp(prefix="rljax-sandbox-", dir=self.scratch_root))
        proc: asyncio.subprocess.Process | None = None
        seccomp_fd: int | None = None
        try:
            if launch.drop_uid is not None:
                os.chown(scratch, launch.drop_uid, launch.drop_gid)
            cfg = {"drop": [launch.drop_uid, launch.drop_gid] if launch.preamble_drop else None,
                   "read": list(self.read_paths), "hook": self.audit_hook,
                   "files": self.max_scratch_files}
            tail = [interpreter, "-I", "-S", "-B", "-c", PREAMBLE, json.dumps(cfg)]
            if launch.bwrap:
                if launch.seccomp:
                    program = seccomp_filter()
                    assert program is not None
                    seccomp_fd = seccomp_pipe(program)
                argv = bwrap_argv(launch.bwrap, scratch=scratch, binds=binds,
                                  network=launch.network_namespace, seccomp_fd=seccomp_fd,
                                  user_namespace=launch.user_namespace,
                                  scratch_bytes=self.max_scratch_mb * 1024 * 1024) + tail
            else:
                argv = [*launch.prefix, *tail]
            preexec = _limits_preexec(
                self._limits(),
                launch.drop_uid if launch.preexec_setuid else None,
                launch.drop_gid if launch.preexec_setuid else None,
            )
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=scratch,
                env={"PATH": "/usr/bin:/bin", "TMPDIR": scratch},
                start_new_session=True,
                preexec_fn=preexec,
                pass_fds=(seccomp_fd,) if seccomp_fd is not None else (),
            )
            if seccomp_fd is not None:
                os.close(seccomp_fd)
                seccomp_fd = None
            run = await self._communicate(proc, code.encode("utf-8", "replace"), timeout_s)
            run.pid = proc.pid
            if launch.bwrap and run.returncode is not None and 128 < run.returncode <= 128 + 64:
                run.returncode = 128 - run.returncode  # bwrap reports a signal as 128 + its number
            return run
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
            if proc is not None:
                _kill_group(proc)  # also takes down anything the code left running in its group
                if proc.returncode is None:
                    try:
                        await asyncio.wait_for(proc.wait(), 5.0)
                    except (asyncio.TimeoutError, ProcessLookupError):
                        pass
                # Close the pipes now, on this loop, rather than in a finalizer later.
                transport = getattr(proc, "_transport", None)
                if transport is not None:
                    transport.close()
            await self._remove_scratch(scratch)

    @staticmethod
    async def _remove_scratch(scratch: str) -> None:
        """Remove a call's host scratch directory (empty under bwrap, whose scratch is a tmpfs).

        `remove_tree` runs in a worker thread, so a tree of many files does not stall the event
        loop; a cancellation of the caller does not stop it (the thread finishes the removal).
        """
        work = asyncio.ensure_future(asyncio.to_thread(remove_tree, scratch))
        try:
            left = await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(lambda f: f.cancelled() or f.exception() or _report_left(scratch, f.result()))
            raise
        _report_left(scratch, left)

    async def _communicate(self, proc: asyncio.subprocess.Process, data: bytes,
                           timeout_s: float) -> SandboxRun:
        cap = self.max_output_bytes
        bufs = (bytearray(), bytearray())
        truncated = False

        async def read(stream: asyncio.StreamReader, buf: bytearray) -> None:
            nonlocal truncated
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    return  # EOF: every holder of the pipe has exited
                room = cap - len(buf)
                if len(chunk) > room:
                    truncated = True
                    _kill_group(proc)  # stop a flood now instead of at the timeout
                buf.extend(chunk[:max(room, 0)])

        async def feed() -> None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(data)
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                proc.stdin.close()

        assert proc.stdout is not None and proc.stderr is not None
        work = asyncio.gather(read(proc.stdout, bufs[0]), read(proc.stderr, bufs[1]), feed(), proc.wait())
        timed_out = False
        try:
            done, _ = await asyncio.wait({work}, timeout=timeout_s)
            if not done:
                timed_out = True
                _kill_group(proc)
                # After SIGKILL the pipes reach EOF and the process is reaped promptly.
                await asyncio.wait({work}, timeout=5.0)
        except BaseException:
            _kill_group(proc)
            work.cancel()
            raise
        if not work.done():
            work.cancel()
        elif not work.cancelled() and work.exception() is not None:
            raise work.exception()  # type: ignore[misc]
        return SandboxRun(
            stdout=bytes(bufs[0]).decode("utf-8", "replace"),
            stderr=bytes(bufs[1]).decode("utf-8", "replace"),
            returncode=proc.returncode,
            timed_out=timed_out,
            output_truncated=truncated,
        )


def _parse_probe(run: SandboxRun) -> dict[str, Any] | None:
    if run.returncode != 0:
        return None
    try:
        obs = json.loads(run.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return obs if isinstance(obs, dict) and "uid" in obs else None


def _describe(launch: _Launch) -> str:
    if launch.bwrap:
        return "bwrap" + (" + seccomp" if launch.seccomp else "") + (
            f" as uid {launch.drop_uid}" if launch.drop_uid is not None else "")
    return " ".join(launch.prefix[:-1]) or ("setuid in preexec" if launch.preexec_setuid else "plain")


def _capabilities(probed: _Probed, audit_hook: bool) -> dict[str, Any]:
    launch, obs = probed.launch, probed.observed
    mount_ns = bool(launch.bwrap) and not obs.get("canary_visible", True)
    net_ns = launch.network_namespace and set(obs.get("nets", ["?"])) <= {"lo"}
    seccomp = obs.get("seccomp") == "2"
    uid, gid = int(obs["uid"]), int(obs["gid"])
    dropped = os.geteuid() == 0 and uid != 0
    layers = ["rlimits", "wall-clock kill of the process group"]
    if launch.bwrap:
        ns = [n for n, on in (("mount", mount_ns), ("pid", probed.pid_namespace), ("network", net_ns),
                              ("ipc", True), ("uts", True)) if on]
        layers.append("bwrap (" + ", ".join(ns) + " namespaces)")
    elif net_ns:
        layers.append("network namespace (unshare)")
    if seccomp:
        layers.append("seccomp filter")
    if obs.get("no_new_privs") == "1":
        layers.append("no_new_privs")
    layers.append(f"uid {uid}" + (" (dropped from root)" if dropped else " (root)" if uid == 0 else ""))
    if audit_hook:
        layers.append("audit hook")
    return {
        "os_sandbox": "bwrap" if launch.bwrap else None,
        "mount_namespace": mount_ns,
        "pid_namespace": probed.pid_namespace,
        "network_namespace": net_ns,
        "seccomp": seccomp,
        "no_new_privs": obs.get("no_new_privs") == "1",
        "uid": uid,
        "gid": gid,
        "privileges_dropped": dropped,
        "nproc_limit_effective": uid != 0,
        "audit_hook": audit_hook,
        "read_confinement": "mount namespace" if mount_ns else "audit hook" if audit_hook else None,
        "layers": layers,
        "notes": list(probed.notes),
    }


def _report_left(scratch: str, left: list[str]) -> None:
    if left:
        logger.error("python sandbox: scratch directory %s not fully removed: %s",
                     scratch, "; ".join(left[:5]) + (f"; and {len(left) - 5} more" if len(left) > 5 else ""))


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group the sandbox leads (it was started in a new session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
