"""The program that runs a code sample's tests inside the sandbox (standard library only).

`rljax.rewards.code_runner` sends this module's source, followed by a call of `main` on a
JSON payload, as the code of one `PythonSandboxTool` run (OS layer, no audit hook in this
parent: it must fork). The payload holds the sample's code, each test's *input* (never an
expected output: the comparison happens outside the sandbox), ``fn_name`` (call-based
tests) and the limits.

`main` runs the tests one at a time, in order, each in a fresh forked child:

1. the child lowers its own ``RLIMIT_CPU`` (the test's time limit) and ``RLIMIT_AS`` (the
   memory limit), points fds 0-2 at ``/dev/null``, and installs the tool's audit hook
   (``sandbox_preamble.PREAMBLE``, sent in the payload) before any sample code runs: no
   fork, no subprocess, no socket, no write outside the scratch folder;
2. it disables the functions verl's ``reliability_guard`` disables (``exit``, ``quit``,
   ``os.remove``, ``os.getcwd``, ``subprocess.Popen``, ...), so that code relying on them
   fails here as it does in verl;
3. it builds the module verl's ``prime_code`` builds (`PRELUDE` + the code; for stdin tests
   the code wrapped in a function ``code()`` by `stdin_program`), and runs the test:
   stdin tests call ``code()`` with ``sys.stdin`` a ``StringIO`` of the input, ``open``
   patched to a ``mock_open`` of it (module-level ``stdin``: ``read``/``readline``/
   ``readlines`` serve the input lines without newlines, as verl's patches do) and
   ``sys.stdout`` captured; call-based tests call ``fn_name`` (a method of ``Solution()``
   when the code defines ``class Solution``) on the JSON-decoded input lines;
4. it sends one JSON record down a pipe: ``{"status": "ok", "out": stdout}``,
   ``{"status": "ok", "value": tagged value}`` (`encode`: lists, tuples, dicts and their
   key types survive), or a failure (``compile_error``, ``error``, ``output_limit``).

The parent waits for the record at most the test's time limit (and never past the
sample's deadline), then SIGKILLs the child; no record means ``timeout`` (time limit) or
``crash`` (the child died). Each test's record is printed as one JSON line as soon as it
is known; tests not started before the deadline have none.
"""

import io
import json
import os
import resource
import select
import signal
import sys
import time

# The names verl's prime_code puts in front of every sample (its ``run_test``), in its order.
PRELUDE_STAR = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                "statistics", "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")
PRELUDE_MODULES = PRELUDE_STAR[:-2]
PRELUDE = ("".join("from %s import *\n" % m for m in PRELUDE_STAR)
           + "".join("import %s\n" % m for m in PRELUDE_MODULES) + "sys.setrecursionlimit(6*10**5)\n")

# What verl's reliability_guard sets to None before a sample runs.
GUARD_OS = ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
            "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
            "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir")
GUARD_MODULES = ("ipdb", "joblib", "resource", "psutil", "tkinter", "subprocess", "ctypes")

CHILD_CODE = "import builtins\nbuiltins.__dict__.pop('_rljax_code_test')()\n"


def stdin_program(code):
    """verl's stdin wrapping: a trailing ``if __name__ == '__main__':`` block is unwrapped
    (through ``ast.unparse``); lines starting with ``import ``/``from `` before the first
    other line stay at module level, everything from that line on becomes the body of
    ``def code():`` (indented by a tab), preceded by ``stdin = sys.stdin`` and ``stdout =
    sys.stdout``."""
    import ast
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:
        pass
    out = []
    started = False
    for line in code.split("\n"):
        is_import = line.startswith("from ") or line.startswith("import ")
        if not started and not is_import:
            out.append("stdin = sys.stdin\nstdout = sys.stdout\ndef code():\n")
            started = True
        out.append(("\t" if started else "") + line + "\n")
    return "".join(out)


def encode(value):
    """A JSON-able tagged form of a call's result that keeps what ``==`` looks at: the
    types bool/int/float/str/None/list/tuple/dict and dict keys' types."""
    if value is None:
        return ["n"]
    if isinstance(value, bool):
        return ["b", value]
    if isinstance(value, int):
        return ["i", str(int(value))]
    if isinstance(value, float):
        return ["f", repr(float(value))]
    if isinstance(value, str):
        return ["s", str(value)]
    if isinstance(value, list):
        return ["l", [encode(v) for v in value]]
    if isinstance(value, tuple):
        return ["t", [encode(v) for v in value]]
    if isinstance(value, dict):
        return ["d", [[encode(k), encode(v)] for k, v in value.items()]]
    raise TypeError("cannot encode %s" % type(value).__name__)


def _send(fd, record):
    data = json.dumps(record).encode("utf-8", "replace")
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class _Capture(io.StringIO):
    """verl's captured stdout (a StringIO whose ``close`` takes one argument), ending the
    test as ``output_limit`` once more than `cap` characters are written."""

    def __init__(self, cap, finish):
        super().__init__()
        self._cap, self._finish = cap, finish
        self.close = lambda x: 1

    def write(self, s):
        if self.tell() + len(s) > self._cap:
            self._finish({"status": "output_limit"})
        return super().write(s)


def _guard():
    import builtins
    import shutil
    builtins.exit = None
    builtins.quit = None
    builtins.help = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in GUARD_OS:
        if hasattr(os, name):
            setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    if sys.modules.get("subprocess") is not None:  # imported with unittest.mock, before the hook
        sys.modules["subprocess"].Popen = None
    for name in GUARD_MODULES:
        sys.modules[name] = None


def _run_test(fd, code, test_input, fn_name, cap):
    """The child's test, after the hook is installed; ends the process."""
    exit_now = os._exit

    def finish(record):
        try:
            _send(fd, record)
        finally:
            exit_now(0)

    import types
    from unittest import mock
    real_stdin = open(0, closefd=False)
    devnull_out = open(1, "w", closefd=False)
    sys.stdin, sys.stdout, sys.stderr = real_stdin, devnull_out, devnull_out
    call_based = fn_name is not None
    program = PRELUDE + (code if call_based else stdin_program(code))
    _guard()
    module = types.ModuleType("tmp_sol")
    try:
        exec(compile(program, "<string>", "exec"), module.__dict__)
        sys.modules["tmp_sol"] = module
        target = module.Solution() if call_based and "class Solution" in code else module
        method = getattr(target, fn_name if call_based else "code")
    except BaseException as e:
        finish({"status": "compile_error", "error": type(e).__name__})
    if call_based:
        try:
            args = [json.loads(line) for line in test_input.split("\n")]
            if isinstance(args[0], dict):
                try:
                    args = [{int(k): v for k, v in args[0].items()}]
                except Exception:
                    pass
        except BaseException as e:
            finish({"status": "error", "error": "test input: " + type(e).__name__})
        try:
            value = method(*args)
            json.dumps(value)  # verl's check serialises the result; what cannot be serialised fails
            record = {"status": "ok", "value": encode(value)}
        except BaseException as e:
            record = {"status": "error", "error": type(e).__name__}
        finish(record)
    if isinstance(test_input, list):
        test_input = "\n".join(test_input)
    try:
        lines = iter(test_input.split("\n"))
        real_stdin.readline = lambda *a: next(lines)
        real_stdin.readlines = lambda *a: test_input.split("\n")
        real_stdin.read = lambda *a: test_input
        sys.stdin = io.StringIO(test_input)
        import builtins
        builtins.open = mock.mock_open(read_data=test_input)
    except BaseException as e:
        finish({"status": "error", "error": type(e).__name__})
    capture = _Capture(cap, finish)
    sys.stdout = capture
    try:
        try:
            method()
        except SystemExit:
            pass
        record = {"status": "ok", "out": capture.getvalue()}
    except BaseException as e:
        record = {"status": "error", "error": type(e).__name__}
    sys.stdout = devnull_out
    finish(record)


def _child(fd, payload, test_input):
    """In the forked child: limits, fds, the audit hook, then the test (never returns)."""
    try:
        cpu = max(1, int(payload["test_timeout_s"] + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        mem = payload["memory_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        null = os.open("/dev/null", os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)
        os.close(null)
        import builtins
        from unittest import mock  # noqa: F401  (imported before the hook: it reads many files)
        builtins._rljax_code_test = lambda: _run_test(fd, payload["code"], test_input, payload["fn_name"],
                                                      payload["max_output_chars"])
        sys.argv = ["-c", json.dumps({"drop": None, "read": [], "hook": True, "files": payload["max_files"]})]
        sys.stdin = io.StringIO(CHILD_CODE)
        exec(payload["preamble"], {"__name__": "__preamble__", "__builtins__": builtins})
    finally:
        os._exit(3)


def _wait_record(fd, pid, budget_s, cap):
    """(record or None, what happened): read the child's record until EOF or `budget_s`."""
    deadline = time.monotonic() + budget_s
    data = bytearray()
    why = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            why = "timeout"
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
        if len(data) > cap:
            why = "output_limit"
            break
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    if why is not None:
        return {"status": why}
    try:
        record = json.loads(bytes(data))
    except ValueError:
        record = None
    if not isinstance(record, dict) or "status" not in record:
        # a child killed by RLIMIT_CPU is a timeout; any other death a crash
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
            return {"status": "timeout"}
        return {"status": "crash"}
    return record


def main(payload):
    """Run every test of `payload` in order until the sample's deadline (module docstring)."""
    start = time.monotonic()
    deadline = start + payload["sample_timeout_s"]
    for name in PRELUDE_STAR:  # imported once here, so each child's prelude is fast
        __import__(name)
    from unittest import mock  # noqa: F401
    import ast  # noqa: F401
    cap = 4 * payload["max_output_chars"] + 65536  # JSON escaping can grow the text
    for i, test_input in enumerate(payload["inputs"]):
        now = time.monotonic()
        if now >= deadline:
            break
        budget = min(payload["test_timeout_s"], deadline - now)
        r, w = os.pipe()
        for attempt in range(50):  # EAGAIN: the uid's process limit, shared with other samples
            try:
                pid = os.fork()
                break
            except BlockingIOError:
                time.sleep(0.02)
        else:
            os.close(r)
            os.close(w)
            print(json.dumps({"i": i, "status": "crash", "error": "fork failed"}), flush=True)
            continue
        if pid == 0:
            os.close(r)
            _child(w, payload, test_input)
        os.close(w)
        t0 = time.monotonic()
        try:
            record = _wait_record(r, pid, budget, cap)
        finally:
            os.close(r)
        record["i"] = i
        record["time_s"] = round(time.monotonic() - t0, 4)
        print(json.dumps(record), flush=True)
