"""OS-level isolation for the Python tool: a bubblewrap (``bwrap``) command line and a seccomp filter.

`PythonSandboxTool` (``python_sandbox.py``) starts its interpreter through `bwrap_argv` when
``bwrap`` is on ``PATH`` and a probe run works. The sandbox then has:

- its own mount namespace whose root is an empty tmpfs holding only: ``/usr`` (read-only),
  the ``/bin``, ``/lib``... entries of the host (read-only binds, or the same symlinks on a
  merged-``/usr`` system), the files the interpreter needs to start (its real executable, its
  shared library and its standard library directories, resolved by asking the interpreter;
  these are read-only binds at their own paths, so a Python under ``/root`` works without
  exposing anything else of ``/root``), any extra read-only paths the user lists, a fresh
  ``/proc`` of its own pid namespace, a minimal ``/dev``, and the scratch directory (the only
  writable path): a size-limited tmpfs (``--size N --tmpfs``) mounted at the path of the
  host's (empty) scratch directory. It lives in the sandbox's mount namespace, so everything
  written there is bounded by its size and vanishes when the sandbox's last process exits;
  nothing the code writes reaches the host's disk. No ``/etc``, no home directories, no ``/tmp`` of
  the host, no ``/proc`` of any host process;
- fresh pid, network (no interface up), ipc, uts and (where possible) cgroup namespaces;
- ``PR_SET_NO_NEW_PRIVS`` (bubblewrap always sets it);
- optionally a seccomp filter (`seccomp_filter`) that refuses system calls a Python program
  has no use for and that enlarge the kernel's attack surface (namespace creation, mounts,
  ``ptrace``, ``bpf``, ``perf_event_open``, ``keyctl``, ``io_uring``, ``userfaultfd``,
  kernel modules, ...).

As root, no user namespace is created: the interpreter starts as root inside the namespaces
and the tool's preamble drops to the unprivileged uid before any model-written code runs
(``setresuid`` clears every capability). As another user, bubblewrap maps that user into a
user namespace (the kernel must allow unprivileged user namespaces).
"""

from __future__ import annotations

import collections
import json
import os
import platform
import shutil
import stat
import struct
import subprocess
from collections.abc import Iterable, Sequence

# Top-level entries that are either real directories (bound read-only) or, on merged-/usr
# systems, symlinks into /usr (recreated as the same symlinks).
SYSTEM_ENTRIES = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# Asked of the interpreter itself (with the flags the sandbox uses): what it reads at start.
_PATHS_PROBE = r"""
import json, os, sys, sysconfig
paths = [os.path.realpath(sys.executable)]
paths += [p for p in sys.path if p]
libdir, so = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and so:
    paths.append(os.path.join(libdir, so))
print(json.dumps({"paths": paths, "stdlib": [p for p in sys.path if p]}))
"""


def find_bwrap() -> str | None:
    """The ``bwrap`` executable on the usual system paths or ``PATH``, or None."""
    return shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")


def interpreter_files(interpreter: str, timeout_s: float = 30.0) -> tuple[str, list[str], list[str]]:
    """``(real executable, paths to bind, stdlib dirs)`` for running `interpreter` with ``-I -S``.

    The interpreter is asked (a venv's ``bin/python`` resolves to the base interpreter; in
    isolated mode without ``site`` it only reads its own standard library). Paths that do not
    exist are dropped; nothing is bound that the interpreter did not name.
    """
    out = subprocess.run([interpreter, "-I", "-S", "-c", _PATHS_PROBE], capture_output=True,
                         text=True, timeout=timeout_s, env={"PATH": "/usr/bin:/bin"}, check=True)
    info = json.loads(out.stdout)
    real = os.path.realpath(info["paths"][0])
    binds: list[str] = []
    for p in info["paths"]:
        if os.path.exists(p) and p not in binds:
            binds.append(p)
    stdlib = [os.path.realpath(p) for p in info["stdlib"] if os.path.exists(p)]
    return real, binds, stdlib


def _covered(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def bwrap_argv(bwrap: str, *, scratch: str, binds: Sequence[str], network: bool = True,
               seccomp_fd: int | None = None, user_namespace: bool = False,
               scratch_bytes: int | None = None) -> list[str]:
    """The ``bwrap ... --`` prefix for one run (see the module docstring).

    `scratch_bytes`: the scratch directory is a tmpfs of this size (mode 0777: the sandbox's
    own uid, dropped from root or not, can write to it); None binds the host directory.
    """
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--hostname", "sandbox"]
    if network:
        argv.append("--unshare-net")
    if user_namespace:
        argv += ["--unshare-user", "--disable-userns"]
    argv += ["--ro-bind", "/usr", "/usr"]
    bound = ["/usr"]
    for entry in SYSTEM_ENTRIES:
        if os.path.islink(entry):
            argv += ["--symlink", os.readlink(entry), entry]
        elif os.path.isdir(entry):
            argv += ["--ro-bind", entry, entry]
            bound.append(entry)
    made: list[str] = []

    def parents(path: str) -> list[str]:
        # The directories leading to a mount point are created on the sandbox's tmpfs root;
        # make them 0755 so that the unprivileged uid can reach what is bound below them
        # (bwrap would otherwise create them like their host counterparts, e.g. /root 0700).
        out = []
        parent = os.path.dirname(path)
        while parent not in ("/", "") and not _covered(parent, bound) and parent not in made:
            out.append(parent)
            parent = os.path.dirname(parent)
        made.extend(out)
        return [a for d in reversed(out) for a in ("--perms", "0755", "--dir", d)]

    for path in binds:
        path = os.path.abspath(path)
        if os.path.exists(path) and not _covered(path, bound):
            argv += parents(path) + ["--ro-bind", path, path]
            bound.append(path)
    argv += ["--proc", "/proc", "--dev", "/dev"] + parents(scratch)
    if scratch_bytes is None:
        argv += ["--bind", scratch, scratch]
    else:
        argv += ["--perms", "0777", "--size", str(int(scratch_bytes)), "--tmpfs", scratch]
    argv += ["--chdir", scratch]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + ["--"]


# -- removing a scratch directory ------------------------------------------------------------

def remove_tree(path: str) -> list[str]:
    """Remove the directory `path` and everything in it; return what could not be removed.

    Made for a tree written by hostile code, and defeated by none of depth, names, modes or
    links: no recursion and no path longer than one name (every operation is relative to an
    open directory fd), so nesting depth costs neither stack nor ``PATH_MAX``; at most two
    directory fds are open at once. Each directory below the top is emptied by renaming its
    entries into the top directory (``renameat``: moves a name, follows nothing), then
    removed, so every entry is moved at most once. Symbolic links are never followed
    (``O_NOFOLLOW``; a link is removed as a name), and nothing on another filesystem is
    entered (a directory whose ``st_dev`` differs from the top's is left and reported). A
    directory without read, write or search permission for its owner gets mode 0700 through
    an ``O_PATH | O_NOFOLLOW`` fd of its own (never through a name a link could redirect);
    files are never chmod-ed (a hard link to a file outside keeps its mode). An empty list
    means `path` no longer exists.
    """
    try:
        top = _open_dir(path, None)
    except FileNotFoundError:
        return []
    except OSError as e:
        return [f"{path}: {e.strerror}"]
    left: list[str] = []
    try:
        dev = os.fstat(top).st_dev
        serial = 0
        while True:
            queue = collections.deque(os.listdir(top))
            if not queue:
                break
            progress = False
            while queue:
                name = queue.popleft()
                try:
                    st = os.stat(name, dir_fd=top, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=top)
                    progress = True
                    continue
                if st.st_dev != dev:
                    left.append(f"{path}/{name!r}: another filesystem, not entered")
                    continue
                sub = _open_dir(name, top)
                try:
                    if os.fstat(sub).st_dev != dev:
                        left.append(f"{path}/{name!r}: another filesystem, not entered")
                        continue
                    for inner in os.listdir(sub):
                        # moving a directory to another parent needs write permission on it
                        ist = os.stat(inner, dir_fd=sub, follow_symlinks=False)
                        if stat.S_ISDIR(ist.st_mode) and ist.st_mode & 0o700 != 0o700:
                            os.close(_open_dir(inner, sub))
                        while True:  # a fresh name in the top directory
                            serial += 1
                            target = f".rm-{serial}"
                            try:
                                os.stat(target, dir_fd=top, follow_symlinks=False)
                            except FileNotFoundError:
                                break
                        os.rename(inner, target, src_dir_fd=sub, dst_dir_fd=top)
                        queue.append(target)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=top)
                progress = True
            if not progress:
                break  # only entries reported in `left` remain
    except OSError as e:
        left.append(f"{path}: {e.strerror} ({e.filename!r})")
    finally:
        os.close(top)
    if not left:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            left.append(f"{path}: {e.strerror}")
    return left


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(name: str, dir_fd: int | None) -> int:
    """A read fd of the directory `name` (never through a symlink), with mode 0700 if its
    owner lacked read, write or search permission (set through an ``O_PATH`` fd)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        fd = None
    if fd is not None and os.fstat(fd).st_mode & 0o700 == 0o700:
        return fd
    if fd is not None:
        os.fchmod(fd, 0o700)
        return fd
    # No read permission: chmod the directory itself through an O_PATH fd (the name cannot be
    # swapped for a link between the check and the chmod), then open it for reading.
    pfd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{pfd}", 0o700)
        return os.open(".", _DIR_FLAGS, dir_fd=pfd)
    finally:
        os.close(pfd)


# -- seccomp ----------------------------------------------------------------------------------
# A classic-BPF program over `struct seccomp_data` {int nr; u32 arch; u64 ip; u64 args[6]}:
# check the architecture, then refuse the listed system calls with EPERM, clone3 with ENOSYS
# (its flags live in memory a filter cannot read; libc falls back to clone, whose flags are
# checked), and clone with any namespace flag with EPERM. Everything else is allowed.

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Syscall numbers from the kernel's unistd headers (asm/unistd_64.h; asm-generic/unistd.h).
_DENIED_SYSCALLS = {
    "x86_64": {
        "ptrace": 101, "syslog": 103, "uselib": 134, "personality": 135, "vhangup": 153,
        "pivot_root": 155, "_sysctl": 156, "adjtimex": 159, "chroot": 161, "acct": 163,
        "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
        "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
        "init_module": 175, "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212,
        "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249,
        "keyctl": 250, "unshare": 272, "perf_event_open": 298, "fanotify_init": 300,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
        "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    },
    "aarch64": {
        "lookup_dcookie": 18, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51,
        "vhangup": 58, "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97,
        "kexec_load": 104, "init_module": 105, "delete_module": 106, "clock_settime": 112,
        "syslog": 116, "ptrace": 117, "reboot": 142, "sethostname": 161, "setdomainname": 162,
        "settimeofday": 170, "adjtimex": 171, "add_key": 217, "request_key": 218, "keyctl": 219,
        "swapon": 224, "swapoff": 225, "perf_event_open": 241, "fanotify_init": 262,
        "name_to_handle_at": 264, "open_by_handle_at": 265, "clock_adjtime": 266, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "finit_module": 273,
        "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    },
}
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
# | CLONE_NEWNET | CLONE_NEWTIME (a 32-bit mask: clone's flags are in the low word of args[0])
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000 | 0x00000080
_X32_BIT = 0x40000000

_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_EPERM, _ENOSYS = 1, 38


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter as bytes for ``bwrap --seccomp FD``, or None on an architecture not listed."""
    machine = machine or platform.machine()
    if machine not in _AUDIT_ARCH:
        return None
    denied = sorted(_DENIED_SYSCALLS[machine].values())
    # Layout: header | one jeq per denied call | clone3 | clone | clone-flags | returns.
    head = [(_LD_W_ABS, 4, 0, 0), ("arch",), (_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        head.append(("x32",))  # x32 system calls share the arch value; refuse them all
    body: list[tuple] = [("deny", nr) for nr in denied]
    body += [("enosys", _CLONE3), ("clone", _CLONE[machine])]
    tail_check = [(_LD_W_ABS, 16, 0, 0), ("nsflags",)]
    rets = {"allow": _RET_ALLOW, "deny": _RET_ERRNO | _EPERM, "enosys": _RET_ERRNO | _ENOSYS,
            "kill": _RET_KILL_PROCESS}
    prog = head + body + [("ret", "allow")] + tail_check + [("ret", "allow")]
    ret_at = {}
    for name in ("deny", "enosys", "kill"):
        ret_at[name] = len(prog)
        prog.append(("ret", name))
    clone_check_at = len(head) + len(body) + 1

    out = []
    for i, ins in enumerate(prog):
        def rel(target: int) -> int:
            off = target - i - 1
            if not 0 <= off <= 255:
                raise AssertionError("seccomp program too long for a jump")
            return off

        kind = ins[0]
        if isinstance(kind, int):
            out.append(_insn(*ins))
        elif kind == "arch":
            out.append(_insn(_JEQ_K, _AUDIT_ARCH[machine], 0, rel(ret_at["kill"])))
        elif kind == "x32":
            out.append(_insn(_JGE_K, _X32_BIT, rel(ret_at["deny"]), 0))
        elif kind == "deny":
            out.append(_insn(_JEQ_K, ins[1], rel(ret_at["deny"]), 0))
        elif kind == "enosys":
            out.append(_insn(_JEQ_K, ins[1], rel(ret_at["enosys"]), 0))
        elif kind == "clone":
            out.append(_insn(_JEQ_K, ins[1], rel(clone_check_at), 0))
        elif kind == "nsflags":
            out.append(_insn(_JSET_K, _CLONE_NS_FLAGS, rel(ret_at["deny"]), 0))
        elif kind == "ret":
            out.append(_insn(_RET_K, rets[ins[1]]))
    return b"".join(out)


def seccomp_pipe(program: bytes) -> int:
    """A readable fd holding `program` (the caller passes it to bwrap and closes it)."""
    r, w = os.pipe()
    try:
        os.write(w, program)  # far below a pipe's capacity, so this never blocks
    finally:
        os.close(w)
    return r
