"""The Python sandbox against hostile code: each attack is stopped or refused, the loop goes on."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys

import pytest

from rljax.agent import AgentConfig, Episode, run_episodes
from rljax.agent.testing import ScriptedSampler
from rljax.agent.tools import PythonSandboxTool
from rljax.agent.trajectory import OBSERVATION

from .helpers import enc, hermes_call, run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")

# An interpreter an unprivileged uid can run (ours may live under /root); used to exercise the
# privilege-drop layer when the tests run as root.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


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
