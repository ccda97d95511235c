"""A Python code-interpreter tool that runs model-written code in a separate, limited process.

What runs: ``[unshare --net [--setuid U --setgid G] --] <python> -I -S -B -c PREAMBLE`` with the
code on stdin, spawned by `asyncio.create_subprocess_exec`, in a new session (its own process
group), in a fresh scratch directory (``tempfile.mkdtemp``, removed afterwards), with an
environment of exactly ``PATH=/usr/bin:/bin``.

Layers (each one fails independently of the others):

1. Resource limits, set in a `preexec_fn` between fork and exec: ``RLIMIT_CPU`` (CPU seconds,
   SIGXCPU then SIGKILL), ``RLIMIT_AS`` (address space, so big allocations raise
   ``MemoryError``), ``RLIMIT_NPROC`` (processes of the sandbox's user), ``RLIMIT_FSIZE``
   (largest file it can write), ``RLIMIT_NOFILE``, ``RLIMIT_CORE = 0``.
2. A wall-clock timeout that SIGKILLs the whole process group; a cap on captured output
   (the group is killed when the cap is exceeded).
3. Network: ``unshare --net`` gives the process an empty network namespace (no interface up,
   not even loopback) when the probe at first use shows it works (as root; or through a user
   namespace for other users). Privileges: as root, ``--setuid/--setgid`` drop to an
   unprivileged uid (default 65534 "nobody") if that uid can run the interpreter - only then
   is ``RLIMIT_NPROC`` effective, because the kernel does not apply it to root.
4. An audit hook (``sys.addaudithook``, installed by the preamble before the code runs) that
   raises ``PermissionError`` on: every ``socket.*`` event; process creation (``os.fork``,
   ``os.exec``, ``os.posix_spawn``, ``os.spawn``, ``os.system``, ``subprocess.Popen``,
   ``pty.spawn``); signals (``os.kill``, ``os.killpg``, ``signal.pthread_kill``); ``ctypes``
   and importing ``ctypes``/``_ctypes``/``_posixsubprocess``; ``resource.setrlimit`` /
   ``prlimit``; ``gc`` object walks and rebinding function code/defaults; opening a file for
   writing, or creating/removing/renaming/linking/chmod-ing a path (or a sqlite database),
   outside the scratch directory; ``os.open`` of a directory outside it (which would give a
   ``dir_fd`` for ``*at()`` calls that escape the path checks); reading ``/proc/<pid>/...``
   of any other process.
5. ``-I -S``: isolated mode (no ``PYTHON*`` variables, no user site, no script dir on
   ``sys.path``) and no ``site``: only the standard library is importable.

What this does NOT guarantee: it is not a security boundary against a determined attacker.
An audit hook is a CPython-level tripwire; native code (an extension module reachable from
the standard library, a memory-corruption bug in the interpreter) bypasses it, and there are
known Python-level escapes for audit hooks in general. Without the privilege drop the code
runs as the parent's user and can read every file that user can read (only writes are
checked, by path, with the usual check-then-use race). RLIMIT_NPROC counts all processes of
the sandbox uid (so size it above the number of concurrent sandboxes) and is ignored for
root. It is a guard against the mistakes and accidents of RL policies (infinite loops, fork
loops, memory blow-ups, stray writes, chatty output, attempts to use the network), not
against an adversary. For untrusted code run it inside a VM or gVisor/nsjail container.

`preexec_fn` note: it runs Python code between fork and exec, which CPython documents as
unsafe in processes with threads (a lock held by another thread at fork time can deadlock
the child). The function used here only calls ``resource.setrlimit`` on a module imported at
load time, which needs no locks; if that ever deadlocks, the wall-clock timeout still kills
the child.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from rljax.agent.tools.base import PerLoopSemaphore, Tool, ToolResult

# The preamble runs first in the sandboxed interpreter: it installs the audit hook and then
# executes the code read from stdin. Everything the hook uses is bound as a default argument
# so that rebinding module globals or builtins from the untrusted code does not affect it.
PREAMBLE = r'''
import sys, os, traceback
def _install(scratch):
    def hook(event, args, _scratch=scratch, _pid=os.getpid(), _any=any, _len=len,
             _realpath=os.path.realpath, _isdir=os.path.isdir, _join=os.path.join, _getcwd=os.getcwd,
             _fsdecode=os.fsdecode, _fspath=os.fspath, _isinstance=isinstance, _int=int,
             _str=str, _bytes=bytes, _sep=os.sep, _PermissionError=PermissionError,
             _WRITE_FLAGS=os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC,
             _PATH_EVENTS=frozenset({
                 "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link",
                 "os.chmod", "os.chown", "os.truncate", "os.utime", "os.setxattr",
                 "os.removexattr", "os.chflags", "os.lchflags", "os.mkfifo", "os.mknod",
                 "shutil.rmtree", "shutil.copyfile", "shutil.copymode", "shutil.copystat",
                 "shutil.chown", "shutil.move", "shutil.make_archive", "shutil.unpack_archive",
                 "sqlite3.connect"}),
             _DENY=frozenset({
                 "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                 "os.startfile", "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg",
                 "signal.pthread_kill", "resource.setrlimit", "resource.prlimit",
                 "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.addaudithook",
                 "os.chroot", "webbrowser.open"}),
             _DENY_PREFIX=("ctypes.", "winreg."),
             _DENY_IMPORT=frozenset({"ctypes", "_ctypes", "_posixsubprocess"}),
             _DENY_ATTR=frozenset({"__code__", "__globals__", "__closure__", "__defaults__",
                                    "__kwdefaults__"})):
        def inside(p):
            if _isinstance(p, _int):
                return True  # an already open file descriptor
            try:
                p = _fsdecode(_fspath(p))
            except TypeError:
                return True  # not a path (e.g. None)
            full = _realpath(_join(_getcwd(), p))
            return full == _scratch or full.startswith(_scratch + _sep)
        def deny(what):
            raise _PermissionError("sandbox: " + what + " is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and _any(c in mode for c in "wax+")) or \
                (_isinstance(flags, _int) and (flags & _WRITE_FLAGS))
            if writing and not inside(path):
                deny("writing outside the scratch directory")
            if mode is None and not inside(path) and _isdir(path):
                # os.open of a directory would give a dir_fd for *at() calls that escape
                # the path checks below.
                deny("opening a directory outside the scratch directory")
            if not _isinstance(path, _int):
                try:
                    full = _realpath(_join(_getcwd(), _fsdecode(_fspath(path))))
                except TypeError:
                    full = ""
                parts = full.split(_sep)
                if _len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and \
                        parts[2] != _str(_pid):
                    deny("reading another process's /proc entry")
        elif event in _PATH_EVENTS:
            for a in args:
                if _isinstance(a, (_str, _bytes)) and not inside(a):
                    deny(event + " outside the scratch directory")
        elif event.startswith("socket."):
            deny("network access (" + event + ")")
        elif event in _DENY or event.startswith(_DENY_PREFIX):
            deny(event)
        elif event == "import" and args[0] in _DENY_IMPORT:
            deny("importing " + args[0])
        elif event == "object.__setattr__" and _len(args) > 1 and args[1] in _DENY_ATTR:
            deny("rebinding " + args[1])
    sys.addaudithook(hook)
_install(os.path.realpath(os.getcwd()))
del _install
_src = sys.stdin.read()
sys.stdin.close()
_globals = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    exec(compile(_src, "<code>", "exec"), _globals)
except SystemExit:
    raise
except BaseException as _e:
    # Print the traceback without the preamble's own frames (file "<string>").
    _frames = [f for f in traceback.extract_tb(_e.__traceback__) if f.filename != "<string>"]
    sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_list(_frames))
                     + "".join(traceback.format_exception_only(type(_e), _e)))
    sys.stderr.flush()
    os._exit(1)
'''


@dataclass
class SandboxRun:
    """Outcome of one execution."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    output_truncated: bool = False

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

    prefix: tuple[str, ...]  # e.g. ("unshare", "--net", "--")
    drop_uid: int | None  # uid the code runs as when privileges are dropped
    drop_gid: int | None
    network_namespace: bool
    preexec_setuid: bool  # drop in preexec_fn (when unshare is not usable)


_PROBE_CACHE: dict[tuple[Any, ...], _Launch] = {}


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
        max_processes: RLIMIT_NPROC (effective only when not running as root).
        max_file_size_mb: RLIMIT_FSIZE in MiB.
        max_open_files: RLIMIT_NOFILE.
        max_output_bytes: cap on captured stdout and on stderr (each); more kills the run.
        network_isolation: "auto" (use ``unshare --net`` if the probe works), "required"
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
                 max_file_size_mb: int = 16, max_open_files: int = 64,
                 max_output_bytes: int = 16384, network_isolation: str = "auto",
                 drop_privileges: bool = True, sandbox_uid: int = 65534, sandbox_gid: int = 65534,
                 audit_hook: bool = True, interpreter: str | None = None,
                 max_concurrency: int | None = None, scratch_root: str | None = None):
        super().__init__(schema)
        if network_isolation not in ("auto", "required", "off"):
            raise ValueError(f"network_isolation must be auto|required|off, got {network_isolation!r}")
        self.timeout_s = float(timeout_s)
        self.cpu_time_s = int(cpu_time_s)
        self.memory_mb = int(memory_mb)
        self.max_processes = int(max_processes)
        self.max_file_size_mb = int(max_file_size_mb)
        self.max_open_files = int(max_open_files)
        self.max_output_bytes = int(max_output_bytes)
        self.network_isolation = network_isolation
        self.drop_privileges = bool(drop_privileges)
        self.sandbox_uid, self.sandbox_gid = int(sandbox_uid), int(sandbox_gid)
        self.audit_hook = bool(audit_hook)
        self.interpreter = interpreter or sys.executable
        self.scratch_root = scratch_root
        self._semaphore = PerLoopSemaphore(max_concurrency or os.cpu_count() or 1)
        self._probe_lock = PerLoopSemaphore(1)
        self._launch: _Launch | None = None

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
        if self._launch is None:
            async with self._probe_lock.get():
                if self._launch is None:
                    self._launch = await self._probe()
        return self._launch

    async def _probe(self) -> _Launch:
        key = (self.interpreter, self.network_isolation, self.drop_privileges,
               self.sandbox_uid, self.sandbox_gid)
        if key in _PROBE_CACHE:
            return _PROBE_CACHE[key]
        root = os.geteuid() == 0
        unshare = shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")
        uid, gid = self.sandbox_uid, self.sandbox_gid
        candidates: list[_Launch] = []
        if unshare and self.network_isolation != "off":
            if root:
                if self.drop_privileges:
                    candidates.append(_Launch((unshare, "--net", "--setuid", str(uid),
                                               "--setgid", str(gid), "--"), uid, gid, True, False))
                candidates.append(_Launch((unshare, "--net", "--"), None, None, True, False))
            else:
                candidates.append(_Launch((unshare, "--user", "--map-current-user", "--net", "--"),
                                          None, None, True, False))
        if self.network_isolation != "required":
            if root and self.drop_privileges:
                candidates.append(_Launch((), uid, gid, False, True))
            candidates.append(_Launch((), None, None, False, False))
        chosen = None
        for cand in candidates:
            run = await self._spawn("print(1 + 1)", cand, timeout_s=10.0)
            if run.returncode == 0 and run.stdout.strip() == "2":
                chosen = cand
                break
        if chosen is None:
            raise RuntimeError(
                "python sandbox: no way to start the interpreter "
                f"({self.interpreter}) with network_isolation={self.network_isolation!r}"
            )
        _PROBE_CACHE[key] = chosen
        return chosen

    async def capabilities(self) -> dict[str, Any]:
        """Which layers are active in this process's environment (for logs and tests)."""
        launch = await self.launch_config()
        return {
            "network_namespace": launch.network_namespace,
            "privileges_dropped": launch.drop_uid is not None,
            "audit_hook": self.audit_hook,
            "nproc_limit_effective": launch.drop_uid is not None or os.geteuid() != 0,
        }

    async def run(self, code: str) -> SandboxRun:
        """Execute `code` in the sandbox (see module docstring)."""
        launch = await self.launch_config()
        async with self._semaphore.get():
            return await self._spawn(code, launch, timeout_s=self.timeout_s)

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

    async def _spawn(self, code: str, launch: _Launch, timeout_s: float) -> SandboxRun:
        scratch = tempfile.mkdtemp(prefix="rljax-sandbox-", dir=self.scratch_root)
        proc: asyncio.subprocess.Process | None = None
        try:
            if launch.drop_uid is not None:
                os.chown(scratch, launch.drop_uid, launch.drop_gid)
            preamble = PREAMBLE
            if not self.audit_hook:
                preamble = preamble.replace("sys.addaudithook(hook)", "pass")
            argv = [*launch.prefix, self.interpreter, "-I", "-S", "-B", "-c", preamble]
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
                env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
                preexec_fn=preexec,
            )
            return await self._communicate(proc, code.encode("utf-8", "replace"), timeout_s)
        finally:
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
            shutil.rmtree(scratch, ignore_errors=True)

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


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group the sandbox leads (it was started in a new session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
