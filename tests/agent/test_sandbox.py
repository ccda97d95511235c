"""The Python sandbox against hostile code: each attack is stopped or refused, the loop goes on."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import sys

import pytest

from rljax.agent import AgentConfig, Episode, run_episodes
from rljax.bench.scripted_agent import ScriptedSampler
from rljax.agent.tools import PythonSandboxTool
from rljax.agent.trajectory import OBSERVATION

from .helpers import enc, hermes_call, run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")

# An interpreter an unprivileged uid can run (ours may live under /root); used to exercise the
# privilege-drop layer when the tests run as root.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
# CI installs bubblewrap (.ci/run): there the OS layer must be active, not silently skipped.
REQUIRE_BWRAP = bool(os.environ.get("CI") or os.environ.get("RLJAX_REQUIRE_BWRAP"))


def processes_in(root) -> list[int]:
    """Pids of live processes whose working directory is under `root`."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if cwd.startswith(str(root)):
                found.append(int(pid))
    return found


@pytest.fixture
def scratch_root(tmp_path):
    root = tmp_path / "scratch"
    root.mkdir()
    os.chmod(root, 0o755)  # so a dropped uid can enter its own scratch dir
    yield root
    assert processes_in(root) == [], "a sandboxed process outlived its call"
    assert list(root.iterdir()) == [], "a scratch directory was not removed"


def sandbox(scratch_root, **kw) -> PythonSandboxTool:
    opts = dict(timeout_s=3.0, cpu_time_s=1, memory_mb=256, scratch_root=str(scratch_root))
    opts.update(kw)
    return PythonSandboxTool(**opts)


def call(tool, code: str):
    return run(tool.call({"code": code}, None))


def test_runs_code_in_fresh_scratch_dir(scratch_root):
    tool = sandbox(scratch_root)
    out = call(tool, "import os\nopen('f.txt', 'w').write('hi')\nprint(open('f.txt').read(), os.getcwd())")
    assert out.error is None and out.text.startswith("hi " + str(scratch_root))
    out = call(tool, "import os\nprint(os.listdir('.'))")  # next call: a new, empty directory
    assert out.text == "[]"
    assert "ZeroDivisionError" in call(tool, "1/0").text


def test_infinite_loop_is_stopped(scratch_root):
    out = call(sandbox(scratch_root), "while True:\n    pass")
    assert out.error == "timeout" and ("CPU time limit" in out.text or "timed out" in out.text)


def test_sleeping_forever_hits_wall_clock_timeout(scratch_root):
    out = call(sandbox(scratch_root, timeout_s=1.0), "import time\nprint('start', flush=True)\ntime.sleep(60)")
    assert out.error == "timeout" and "timed out after 1 s" in out.text and out.text.startswith("start")


def test_fork_bomb_is_refused(scratch_root):
    out = call(sandbox(scratch_root), "import os\nwhile True:\n    os.fork()")
    assert "PermissionError: sandbox: os.fork is not allowed" in out.text
    for code in ("import subprocess\nsubprocess.run(['true'])", "import os\nos.system('true')",
                 "import os\nos.execv('/bin/true', ['true'])", "import pty\npty.fork()"):
        assert "PermissionError" in call(sandbox(scratch_root), code).text, code


@pytest.mark.parametrize("interpreter", [None, SYSTEM_PYTHON])
def test_fork_without_audit_hook_is_bounded_by_other_layers(scratch_root, interpreter):
    """Layer 2: RLIMIT_NPROC (when effective) and killing the process group at the end."""
    tool = sandbox(scratch_root, audit_hook=False, max_processes=8, timeout_s=1.5, interpreter=interpreter)
    caps = run(tool.capabilities())
    code = ("import os, time\nn = 0\nfor i in range(40):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
            "    n += 1\nprint('forked', n, flush=True)\n")
    out = call(tool, code)
    n = int(out.text.split("forked ")[1].split()[0])
    if caps["nproc_limit_effective"]:
        assert n < 8
    # whatever was forked was killed with the process group (checked by the fixture)


def test_memory_hog_is_stopped(scratch_root):
    tool = sandbox(scratch_root)
    assert "MemoryError" in call(tool, "x = bytearray(4 * 1024 ** 3)\nprint(len(x))").text
    out = call(tool, "a = []\nwhile True:\n    a.append(bytearray(10 ** 7))")
    assert "MemoryError" in out.text or out.error == "timeout"


@pytest.fixture
def listening_server():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.3)
    yield server
    server.close()


def assert_no_connection(server):
    with pytest.raises(socket.timeout):
        conn, _ = server.accept()
        conn.close()


NET_CODE = ("import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    s.sendall(b'leak')\n    print('connected')\nexcept Exception as e:\n"
            "    print('refused', type(e).__name__, e)\n")


def test_network_is_refused(scratch_root, listening_server):
    port = listening_server.getsockname()[1]
    out = call(sandbox(scratch_root), NET_CODE.format(port=port))
    assert out.text.startswith("refused PermissionError") and "connected" not in out.text
    assert_no_connection(listening_server)
    out = call(sandbox(scratch_root), "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:1')")
    assert "sandbox: network access (socket.getaddrinfo) is not allowed" in out.text


def test_network_namespace_alone_blocks_connections(scratch_root, listening_server):
    tool = sandbox(scratch_root, audit_hook=False)
    if not run(tool.capabilities())["network_namespace"]:
        pytest.skip("unshare --net is not usable here; only the audit hook blocks the network")
    port = listening_server.getsockname()[1]
    out = call(tool, NET_CODE.format(port=port))
    assert out.text.startswith("refused") and "connected" not in out.text
    assert_no_connection(listening_server)


def test_writes_outside_scratch_are_refused(scratch_root, tmp_path):
    target = tmp_path / "evil.txt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    tool = sandbox(scratch_root)
    attacks = [
        f"open({str(target)!r}, 'w').write('x')",
        f"open({str(target)!r}, 'a').write('x')",
        f"import os\nos.open({str(target)!r}, os.O_CREAT | os.O_WRONLY)",
        f"import os\nos.remove({str(victim)!r})",
        f"import os\nos.rename({str(victim)!r}, 'stolen.txt')",
        f"import os\nos.symlink({str(victim)!r}, 'link')\nopen('link', 'w').write('x')",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        f"import os\nos.chmod({str(victim)!r}, 0o777)",
        "import os\nos.chdir('/tmp')\nopen('rljax_evil_relative.txt', 'w').write('x')",
        f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
        "os.open('evil.txt', os.O_CREAT | os.O_WRONLY, dir_fd=fd)",
        f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t (x)')",
    ]
    for code in attacks:
        out = call(tool, code)
        assert "PermissionError" in out.text, code
    assert not target.exists() and victim.read_text() == "keep me"
    assert not os.path.exists("/tmp/rljax_evil_relative.txt")


def test_parent_environment_is_not_visible(scratch_root, monkeypatch):
    monkeypatch.setenv("RLJAX_TEST_SECRET", "hunter2-secret-value")
    tool = sandbox(scratch_root)
    out = call(tool, "import os\nprint(sorted(os.environ))\nprint(os.environ.get('RLJAX_TEST_SECRET'))")
    assert "hunter2" not in out.text and "RLJAX_TEST_SECRET" not in out.text
    assert out.text.splitlines()[-1] == "None"
    out = call(tool, "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())")
    assert "hunter2" not in out.text and "PermissionError" in out.text
    out = call(tool, "print(open('/proc/1/environ').read())")
    assert "hunter2" not in out.text and "PermissionError" in out.text


def test_signals_to_other_processes_are_refused(scratch_root):
    out = call(sandbox(scratch_root), "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert "PermissionError: sandbox: os.kill is not allowed" in out.text


def test_native_escape_hatches_are_refused(scratch_root):
    tool = sandbox(scratch_root)
    for code in ("import ctypes", "import _posixsubprocess", "import resource\n"
                 "resource.setrlimit(resource.RLIMIT_CPU, (100, 100))", "import gc\ngc.get_objects()",
                 "def f(): pass\nf.__code__ = (lambda: 1).__code__"):
        assert "PermissionError" in call(tool, code).text, code


def test_output_flood_is_capped(scratch_root):
    out = call(sandbox(scratch_root, max_output_bytes=1000), "while True:\n    print('x' * 100)")
    assert "[output truncated at 1000 bytes]" in out.text and len(out.text) < 1200


def test_cancellation_kills_the_process(scratch_root):
    tool = sandbox(scratch_root, timeout_s=30)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(tool.run("import time\ntime.sleep(30)"), 0.5)

    run(main())  # the fixture asserts that no process and no scratch dir is left


def test_privilege_drop_when_root(scratch_root):
    if os.geteuid() != 0 or SYSTEM_PYTHON is None:
        pytest.skip("needs root and a system python")
    tool = sandbox(scratch_root, interpreter=SYSTEM_PYTHON)
    caps = run(tool.capabilities())
    if not caps["privileges_dropped"]:
        pytest.skip("the unprivileged uid cannot run the interpreter here")
    assert call(tool, "import os\nprint(os.getuid(), os.getgid())").text == "65534 65534"


def test_agent_loop_goes_on_after_hostile_code(hermes_tok, scratch_root, monkeypatch):
    monkeypatch.setenv("RLJAX_TEST_SECRET", "hunter2-secret-value")
    tok = hermes_tok
    programs = [
        "while True:\n    pass",
        "import os\nwhile True:\n    os.fork()",
        "x = bytearray(4 * 1024 ** 3)",
        "import socket\nsocket.create_connection(('127.0.0.1', 80))",
        "open('/tmp/rljax_evil_from_agent.txt', 'w').write('x')",
        "import os\nprint(os.environ.get('RLJAX_TEST_SECRET'))",
        "print(6 * 7)",
    ]
    script = [enc(tok, hermes_call("python", {"code": c}) + "<|im_end|>") for c in programs]
    script.append(enc(tok, "The answer is 42.<|im_end|>"))
    tool = sandbox(scratch_root, timeout_s=2.0)
    cfg = AgentConfig(max_turns=len(script), tool_timeout_s=10, max_response_tokens=8192)
    (traj,) = run(run_episodes(ScriptedSampler(script), [Episode(messages=[{"role": "user", "content": "go"}])],
                               tok, cfg, tools=[tool]))
    assert traj.termination == "stop" and traj.num_turns == len(script)
    observations = [tok.decode(traj.response_ids[s.start:s.end]) for s in traj.segments if s.kind == OBSERVATION]
    assert "CPU time limit" in observations[0] or "timed out" in observations[0]
    assert "os.fork is not allowed" in observations[1]
    assert "MemoryError" in observations[2]
    assert "PermissionError" in observations[3]
    assert "writing outside the scratch directory" in observations[4]
    assert "None" in observations[5] and "hunter2" not in observations[5]
    assert "\n42\n" in observations[6]
    assert traj.tool_errors["timeout"] == 1
    assert not os.path.exists("/tmp/rljax_evil_from_agent.txt")


def test_sandbox_tool_is_reusable_across_event_loops(scratch_root):
    tool = sandbox(scratch_root, max_concurrency=1)

    async def two():
        return await asyncio.gather(tool.run("print(1)"), tool.run("print(2)"))

    for _ in range(2):
        assert [r.stdout.strip() for r in run(two())] == ["1", "2"]


def test_file_size_limit(scratch_root):
    out = call(sandbox(scratch_root, max_file_size_mb=1),
               "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (4 * 1024 * 1024))")
    assert "File too large" in out.text


# -- escape attempts: each one is an attack test ---------------------------------------------
#
# Each attack runs against three configurations ("layer"):
#   all         the default: the OS layer (bubblewrap, when installed) and the in-process layer;
#   in-process  os_sandbox="off": audit hook, rlimits, scrubbed env, uid drop where possible;
#   os          audit_hook=False: the OS layer alone, as if the code had escaped the audit hook.
# Without bubblewrap the "os" cases check that the fallback is reported, then skip; where CI or
# RLJAX_REQUIRE_BWRAP is set (.ci/run installs bubblewrap) they fail instead.

LAYERS = ("all", "in-process", "os")


def layered(scratch_root, layer: str, **kw) -> PythonSandboxTool:
    if layer == "in-process":
        kw.setdefault("os_sandbox", "off")
    elif layer == "os":
        kw.setdefault("audit_hook", False)
    tool = sandbox(scratch_root, **kw)
    if layer == "os":
        caps = run(tool.capabilities())
        if caps["os_sandbox"] is None:
            assert caps["mount_namespace"] is False and caps["pid_namespace"] is False and caps["notes"]
            if REQUIRE_BWRAP:
                pytest.fail("the OS sandbox layer is required here (CI / RLJAX_REQUIRE_BWRAP) but "
                            f"inactive: {caps['notes']}")
            pytest.skip(f"no OS sandbox layer here ({caps['notes'][0]}); fallback reported")
    return tool


def refused(out, layer: str) -> bool:
    """The in-process layer refuses with PermissionError; under the OS layer alone only the
    effects are checked (nothing outside the sandbox changed or leaked)."""
    return layer == "os" or "PermissionError" in out.text


SUBINTERPRETER_ESCAPE = """
try:
    import _interpreters as interp
except ImportError:
    import _xxsubinterpreters as interp
iid = interp.create()
interp.run_string(iid, '''
import ctypes, os
pid = os.posix_spawn("/bin/sh", ["sh", "-c", "echo ESCAPED-$((6 * 7)) > {target}; echo ESCAPED-$((6 * 7))"], {{}})
os.waitpid(pid, 0)
''')
"""

# From a working directory deeper than the scratch dir is far from "/", a path relative to a
# dir_fd of the scratch dir climbs to "/" while the same path read relative to the cwd stays
# inside the scratch dir.
DIR_FD_PREFIX = """
import os
scratch = os.getcwd()
depth = scratch.count("/") + 2
os.makedirs("/".join(["d"] * depth))
os.chdir("/".join(["d"] * depth))
fd = os.open(scratch, os.O_RDONLY)
up = "../" * scratch.count("/")
"""


@pytest.mark.parametrize("layer", LAYERS)
def test_subinterpreter_cannot_escape_the_audit_hook(scratch_root, tmp_path, layer):
    target = tmp_path / "pwned_by_subinterpreter.txt"
    out = call(layered(scratch_root, layer), SUBINTERPRETER_ESCAPE.format(target=target))
    assert not target.exists()
    if layer != "os":  # without the hook the shell does start, inside the sandbox
        assert "ESCAPED-42" not in out.text and "PermissionError" in out.text


@pytest.mark.parametrize("layer", LAYERS)
def test_dir_fd_relative_write_from_deep_cwd_is_refused(scratch_root, tmp_path, layer):
    target = tmp_path / "pwned_by_dir_fd.txt"
    code = DIR_FD_PREFIX + (f"os.write(os.open(up + {str(target)[1:]!r}, os.O_CREAT | os.O_WRONLY, dir_fd=fd), b'x')\n"
                            "print('wrote')")
    tool = layered(scratch_root, layer)
    out = call(tool, code)
    assert not target.exists() and "wrote" not in out.text
    assert refused(out, layer), out.text
    # At the fd limit the hook cannot list the open directory fds: it must refuse, not guess.
    escape_dir = tmp_path / "pwned_dir"
    code = DIR_FD_PREFIX + ("fds = []\ntry:\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
                            "except OSError:\n    pass\n"
                            f"os.mkdir(up + {str(escape_dir)[1:]!r}, dir_fd=fd)\nprint('made')")
    out = call(tool, code)
    assert not escape_dir.exists() and "made" not in out.text and refused(out, layer), out.text
    # A relative symlink made inside, then moved up so that it points outside.
    code = DIR_FD_PREFIX + ("os.makedirs(scratch + '/a/b')\nos.symlink('../..', scratch + '/a/b/L')\n"
                            "os.rename(scratch + '/a/b/L', scratch + '/L')\nos.mkdir('L/evil', dir_fd=fd)\nprint('made')")
    out = call(tool, code)
    assert not (tmp_path / "evil").exists() and "made" not in out.text and refused(out, layer), out.text


def parent_environ_entries() -> list[bytes]:
    """This process's environment as the kernel shows it in /proc (set at exec, not by putenv)."""
    with open("/proc/self/environ", "rb") as f:
        return [e for e in f.read().split(b"\0") if len(e) > 6]


@pytest.mark.parametrize("layer", LAYERS)
def test_dir_fd_relative_read_of_parent_environ_is_refused(scratch_root, layer):
    secrets = parent_environ_entries()
    assert secrets, "the test process has an environment to steal"
    tool = layered(scratch_root, layer)
    environ = f"proc/{os.getpid()}/environ"
    for code in (DIR_FD_PREFIX + f"print(os.read(os.open(up + {environ!r}, os.O_RDONLY, dir_fd=fd), 1 << 20))",
                 f"print(open('/{environ}', 'rb').read())"):
        out = call(tool, code)
        assert not any(e.decode(errors="replace") in out.text for e in secrets), out.text[:300]
        assert "PermissionError" in out.text or "FileNotFoundError" in out.text, out.text


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text("hunter2-file-secret")
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o644)  # readable by any uid: only the sandbox itself can keep it private
    return path


@pytest.mark.parametrize("layer", LAYERS)
def test_reading_outside_the_scratch_dir_is_refused(scratch_root, secret_file, layer):
    tool = layered(scratch_root, layer)
    for code in (f"print(open({str(secret_file)!r}).read())",
                 f"import os\nprint(os.listdir({str(secret_file.parent)!r}))",
                 DIR_FD_PREFIX + f"print(os.read(os.open(up + {str(secret_file)[1:]!r}, os.O_RDONLY, dir_fd=fd), 99))",
                 "import os\nprint(os.listdir('/etc'))"):
        out = call(tool, code)
        # (an error message may repeat the path it was given, never what is there)
        assert "hunter2-file-secret" not in out.text and "['secret.txt']" not in out.text, code
        assert "'passwd'" not in out.text, code
        assert "PermissionError" in out.text or "FileNotFoundError" in out.text, code


def test_native_code_from_the_scratch_dir_is_refused(scratch_root):
    """An extension module written into the scratch dir would be native code the hook never sees;
    a hand-made code object is a known way to corrupt the interpreter's memory."""
    code = ("import _json, importlib.util, os\nname = 'evil' + os.path.basename(_json.__file__)[len('_json'):]\n"
            "open(name, 'wb').write(open(_json.__file__, 'rb').read())\n"
            "spec = importlib.util.spec_from_file_location('_json', os.path.abspath(name))\n"
            "m = importlib.util.module_from_spec(spec)\nprint('loaded', m)")
    for layer in ("all", "in-process"):
        out = call(layered(scratch_root, layer), code)
        assert "loaded" not in out.text and "PermissionError" in out.text, layer
    out = call(sandbox(scratch_root), "(lambda: 1).__code__.replace(co_consts=(2,))")
    assert "PermissionError: sandbox: code.__new__ is not allowed" in out.text


@pytest.mark.parametrize("layer", ["all", "in-process"])
def test_rebinding_stdlib_helpers_does_not_blind_the_hook(scratch_root, tmp_path, layer):
    """The hook's path checks must not run Python code the sandboxed program can replace."""
    target = tmp_path / "pwned_by_rebinding.txt"
    tool = layered(scratch_root, layer)
    for patch in ("import posixpath\nposixpath._joinrealpath = lambda path, rest, *a: (os.getcwd() + '/x', True)",
                  "os.path.realpath = lambda p, **k: os.getcwd() + '/x'\nos.path.isdir = lambda p: False",
                  "os.lstat = lambda p: os.stat('.')\nos.fsdecode = lambda p: os.getcwd() + '/x'"):
        out = call(tool, f"import os\n{patch}\nopen({str(target)!r}, 'w').write('x')\nprint('wrote')")
        assert "wrote" not in out.text and "PermissionError" in out.text, (patch, out.text)
    assert not target.exists()
    out = call(tool, "import sys\nsys._current_frames()")
    assert "PermissionError: sandbox: sys._current_frames is not allowed" in out.text


def test_os_layer_contains_native_code(scratch_root, secret_file, tmp_path):
    """With the audit hook out of the way (ctypes works), a shell finds nothing of the host."""
    target = tmp_path / "pwned_by_shell.txt"
    script = (f"cat {secret_file}; ls /root /etc /home; cat /proc/{os.getpid()}/environ; "
              f"echo x > {target}; echo x > /usr/pwned; id -u")
    code = ("import ctypes, os\n"
            f"pid = os.posix_spawn('/bin/sh', ['sh', '-c', {script!r}], {{}})\n"
            "print('exit', os.waitpid(pid, 0)[1], flush=True)")
    tool = layered(scratch_root, "os")
    out = call(tool, code)
    assert "exit" in out.text
    assert "hunter2" not in out.text and not target.exists() and not os.path.exists("/usr/pwned")
    assert not any(e.decode(errors="replace") in out.text for e in parent_environ_entries())
    if run(tool.capabilities())["privileges_dropped"]:
        assert "65534" in out.text.splitlines()  # id -u


def test_seccomp_refuses_namespace_creation(scratch_root):
    tool = layered(scratch_root, "os")
    caps = run(tool.capabilities())
    if not caps["seccomp"]:
        assert "seccomp filter" not in caps["layers"]
        if REQUIRE_BWRAP and os.uname().machine in ("x86_64", "aarch64"):
            pytest.fail(f"seccomp expected under bubblewrap on this machine: {caps['notes']}")
        pytest.skip("no seccomp filter on this machine")
    keyctl = 250 if os.uname().machine == "x86_64" else 219
    code = ("import ctypes, os, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
            f"print('keyctl', libc.syscall({keyctl}, 0, -4, 0), ctypes.get_errno())\n"
            "t = threading.Thread(target=print, args=('thread ok',))\nt.start()\nt.join()\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(7)\nprint('child', os.waitpid(pid, 0)[1] >> 8)")
    out = call(tool, code)
    assert "unshare -1 1" in out.text and "keyctl -1 1" in out.text, out.text  # EPERM
    assert "thread ok" in out.text and "child 7" in out.text, out.text  # threads and fork still work


@pytest.mark.parametrize("layer", LAYERS)
def test_capabilities_are_truthful(scratch_root, secret_file, layer):
    """What `capabilities()` claims is what the code observes (uid, mount and pid isolation)."""
    kw = {"in-process": {"os_sandbox": "off"}, "os": {"audit_hook": False}}.get(layer, {})
    tool = sandbox(scratch_root, **kw)
    caps = run(tool.capabilities())
    code = (f"import os\nprint(os.getuid(), os.getgid(), os.path.exists({str(secret_file)!r}), "
            f"os.path.exists('/proc/{os.getpid()}'))")
    uid, gid, secret_visible, parent_visible = call(tool, code).text.split()
    assert [int(uid), int(gid)] == [caps["uid"], caps["gid"]]
    assert caps["mount_namespace"] == (secret_visible == "False")
    assert caps["pid_namespace"] == (parent_visible == "False")
    assert caps["audit_hook"] == (layer != "os")
    assert caps["read_confinement"] == ("mount namespace" if caps["mount_namespace"] else
                                        "audit hook" if layer != "os" else None)
    if os.geteuid() == 0:
        assert caps["privileges_dropped"] == (caps["uid"] != 0) == caps["nproc_limit_effective"]
    if layer == "in-process":
        assert caps["os_sandbox"] is None and "OS sandbox off by configuration (os_sandbox: off)" in caps["notes"]
    elif REQUIRE_BWRAP:
        assert caps["os_sandbox"] == "bwrap" and caps["mount_namespace"] and caps["pid_namespace"]
        assert caps["network_namespace"] and caps["privileges_dropped"] == (os.geteuid() == 0)


def test_layers_are_logged_once_at_start(scratch_root, caplog, monkeypatch):
    from rljax.agent.tools import python_sandbox

    monkeypatch.setattr(python_sandbox, "_PROBE_CACHE", {})
    caplog.set_level(logging.INFO, logger=python_sandbox.logger.name)
    for _ in range(2):
        tool = sandbox(scratch_root)
        call(tool, "print(1)")
        caps = run(tool.capabilities())
    records = [r for r in caplog.records if "active layers" in r.getMessage()]
    assert len(records) == 1
    msg = records[0].getMessage()
    assert "audit hook" in msg and f"uid {caps['uid']}" in msg
    assert ("bwrap (mount, pid, network" in msg) == (caps["os_sandbox"] == "bwrap")
    if caps["os_sandbox"] is None:
        assert records[0].levelno == logging.WARNING and "OS sandbox unavailable" in msg


def test_fallback_without_bubblewrap_is_reported(scratch_root, caplog, monkeypatch):
    """No bwrap: the in-process layer still refuses the escapes; capabilities and the log say so."""
    from rljax.agent.tools import python_sandbox

    monkeypatch.setattr(python_sandbox, "_PROBE_CACHE", {})
    monkeypatch.setattr(python_sandbox, "find_bwrap", lambda: None)
    caplog.set_level(logging.INFO, logger=python_sandbox.logger.name)
    tool = sandbox(scratch_root)
    caps = run(tool.capabilities())
    assert caps["os_sandbox"] is None and not caps["mount_namespace"] and not caps["seccomp"]
    assert caps["read_confinement"] == "audit hook"
    assert any("bubblewrap (bwrap) is not installed" in n for n in caps["notes"])
    (record,) = [r for r in caplog.records if "active layers" in r.getMessage()]
    assert record.levelno == logging.WARNING and "bubblewrap (bwrap) is not installed" in record.getMessage()
    out = call(tool, SUBINTERPRETER_ESCAPE.format(target=scratch_root.parent / "x"))
    assert "PermissionError" in out.text and "ESCAPED" not in out.text
    with pytest.raises(RuntimeError, match="bubblewrap"):
        run(sandbox(scratch_root, os_sandbox="required").capabilities())


def test_legitimate_file_work_in_the_scratch_dir_still_works(scratch_root):
    """The stricter path checks must not break ordinary programs."""
    code = ("import os, shutil, tempfile, pathlib, zoneinfo\nos.makedirs('a/b')\n"
            "pathlib.Path('a/b/f.txt').write_text('x')\nfd = os.open('a', os.O_RDONLY)\n"
            "print(os.listdir('a'), open('b/f.txt', opener=lambda p, f: os.open(p, f, dir_fd=fd)).read())\n"
            "os.close(fd)\nwith tempfile.TemporaryDirectory() as d:\n    open(os.path.join(d, 'g'), 'w').write('y')\n"
            "shutil.copytree('a', 'c')\nshutil.rmtree('a')\nos.chdir('c/b')\nprint(open('../b/f.txt').read(), "
            "sorted(os.listdir('..')))\nprint(zoneinfo.ZoneInfo('UTC'))\nimport decimal, json, re\nprint('ok')")
    for layer in ("all", "in-process"):
        out = call(layered(scratch_root, layer), code)
        assert out.text.splitlines() == ["['b'] x", "x ['b']", "UTC", "ok"], (layer, out.text)
