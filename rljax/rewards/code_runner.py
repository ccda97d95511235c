"""Where a code sample's tests run: rljax's OS sandbox, or a SandboxFusion server.

`run_in_sandbox` runs the tests of one sample in one `PythonSandboxTool` run (bubblewrap:
no network, a size-limited scratch tmpfs, fresh namespaces, seccomp, the unprivileged
uid; see `rljax.agent.tools.python_sandbox`). Inside, `rljax.rewards.code_harness` runs
each test in its own forked child under the audit hook, with the test's time limit
(wall clock, and ``RLIMIT_CPU``), the memory limit (``RLIMIT_AS``) and a cap on what it
prints; the whole sample stops at `SandboxLimits.sample_timeout_s` (tests not started by
then have no record, and fail). The expected outputs never enter the sandbox: the
records (stdout, or the call's tagged value) come back and are compared here.

`SandboxFusionClient` runs one program with one stdin on a SandboxFusion server
(``POST {url}/run_code``), at most `max_concurrency` requests at once per process,
retrying a refused or dropped connection or an HTTP 429/502/503/504 with exponential
backoff, as rljax's `SandboxFusionTool` does.
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import rljax.rewards.code_harness as code_harness
from rljax.agent.tools.sandbox_fusion import parse_response


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sample's tests in the OS sandbox."""

    test_timeout_s: float = 5.0  # wall-clock (and CPU) seconds of one test
    memory_mb: int = 512  # address space of one test's process
    sample_timeout_s: float = 8.0  # wall clock of all the sample's tests together
    max_output_bytes: int = 1 << 20  # what one test may print (or return, encoded)
    max_processes: int = 64  # RLIMIT_NPROC of the sandbox's uid
    os_sandbox: str = "auto"  # "auto" | "required" | "off" (PythonSandboxTool's option)

    def check(self) -> None:
        for name in ("test_timeout_s", "memory_mb", "sample_timeout_s", "max_output_bytes", "max_processes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"code sandbox limit {name} must be > 0, got {getattr(self, name)!r}")
        if self.os_sandbox not in ("auto", "required", "off"):
            raise ValueError(f"code sandbox os_sandbox must be auto|required|off, got {self.os_sandbox!r}")


_HARNESS_SOURCE: str | None = None
_TOOLS: dict[tuple, Any] = {}


def harness_source() -> str:
    global _HARNESS_SOURCE
    if _HARNESS_SOURCE is None:
        _HARNESS_SOURCE = inspect.getsource(code_harness)
    return _HARNESS_SOURCE


def _tool(limits: SandboxLimits, n_tests: int):
    from rljax.agent.tools.python_sandbox import PythonSandboxTool

    per_test = 4 * limits.max_output_bytes + 65536 + 256
    out_cap = per_test * max(n_tests, 1) + 65536
    key = (limits, out_cap)
    tool = _TOOLS.get(key)
    if tool is None:
        if len(_TOOLS) > 64:
            _TOOLS.clear()
        tool = PythonSandboxTool(
            timeout_s=limits.sample_timeout_s + 5.0, cpu_time_s=int(limits.sample_timeout_s) + 5,
            memory_mb=limits.memory_mb, max_processes=limits.max_processes, max_output_bytes=out_cap,
            os_sandbox=limits.os_sandbox, audit_hook=False, max_concurrency=1 << 16)
        _TOOLS[key] = tool
    return tool


def run_in_sandbox(code: str, inputs: Sequence[Any], fn_name: str | None, limits: SandboxLimits) -> list[dict[str, Any]]:
    """One record per test run, in order (see `rljax.rewards.code_harness`); fewer than
    `inputs` when the sample's deadline stopped it."""
    from rljax.agent.tools.sandbox_preamble import PREAMBLE

    if not inputs:
        return []
    payload = {"code": code, "inputs": list(inputs), "fn_name": fn_name, "preamble": PREAMBLE,
               "test_timeout_s": float(limits.test_timeout_s), "memory_mb": int(limits.memory_mb),
               "sample_timeout_s": float(limits.sample_timeout_s),
               "max_output_chars": int(limits.max_output_bytes), "max_files": 256}
    program = harness_source() + f"\nmain(json.loads({json.dumps(payload)!r}))\n"
    tool = _tool(limits, len(inputs))
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: the usual case (a reward worker)
        run = asyncio.run(tool.run(program))
    else:  # called from a coroutine: a loop of its own, on another thread
        with ThreadPoolExecutor(1) as pool:
            run = pool.submit(asyncio.run, tool.run(program)).result()
    return parse_records(run.stdout, len(inputs))


def parse_records(stdout: str, n: int) -> list[dict[str, Any]]:
    """The harness's JSON lines, in order from test 0; stops at the first gap."""
    records: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("i") == len(records) and len(records) < n:
            records.append(record)
    return records


# ---- SandboxFusion --------------------------------------------------------------------------

_RETRY_STATUS = frozenset({429, 502, 503, 504})
_SEMAPHORES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SEMAPHORES_LOCK = threading.Lock()


class SandboxFusionError(RuntimeError):
    """The server gave no usable answer (after the retries)."""


@dataclass(frozen=True)
class SandboxFusionClient:
    """Runs programs on a SandboxFusion server (module docstring)."""

    url: str
    max_concurrency: int = 16  # requests in flight at once, per process
    max_retries: int = 2  # retries of a refused connection or HTTP 429/502/503/504
    retry_backoff_s: float = 0.5  # first retry delay, doubled each time
    run_timeout_s: float = 10.0  # the server's run_timeout (and compile_timeout)
    memory_limit_mb: int = 1024  # the server's memory_limit_MB
    language: str = "python"

    @property
    def endpoint(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/run_code") else url + "/run_code"

    def _semaphore(self) -> threading.BoundedSemaphore:
        key = (self.endpoint, int(self.max_concurrency))
        with _SEMAPHORES_LOCK:
            if key not in _SEMAPHORES:
                _SEMAPHORES[key] = threading.BoundedSemaphore(max(1, int(self.max_concurrency)))
            return _SEMAPHORES[key]

    def run(self, code: str, stdin: str | None) -> dict[str, Any]:
        """The server's JSON answer for `code` run on `stdin`; `SandboxFusionError` when
        there is none after the retries."""
        body = json.dumps({"code": code, "stdin": stdin, "language": self.language,
                           "run_timeout": self.run_timeout_s, "compile_timeout": self.run_timeout_s,
                           "memory_limit_MB": self.memory_limit_mb, "files": {}, "fetch_files": []}).encode()
        delay = self.retry_backoff_s
        with self._semaphore():
            for attempt in range(self.max_retries + 1):
                try:
                    return self._post(body)
                except _Retry as e:
                    if attempt == self.max_retries:
                        raise SandboxFusionError(f"{self.endpoint}: {e} (after {self.max_retries} retries)") from None
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _post(self, body: bytes) -> dict[str, Any]:
        timeout = 2 * self.run_timeout_s + 10.0
        req = urllib.request.Request(self.endpoint, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                data = resp.read()
        except urllib.error.HTTPError as e:
            if e.code in _RETRY_STATUS:
                raise _Retry(f"HTTP {e.code}") from None
            raise SandboxFusionError(f"{self.endpoint}: HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ConnectionRefusedError):
                raise _Retry("connection refused") from None
            raise SandboxFusionError(f"{self.endpoint}: {e.reason}") from None
        except (socket.timeout, TimeoutError):
            raise SandboxFusionError(f"{self.endpoint}: no answer within {timeout:g} s") from None
        except (ConnectionError, http.client.HTTPException) as e:  # dropped mid-request (RemoteDisconnected, ...)
            raise _Retry(f"connection lost ({type(e).__name__})") from None
        except OSError as e:
            raise SandboxFusionError(f"{self.endpoint}: {e}") from None
        try:
            return parse_response(data)
        except ValueError as e:
            raise SandboxFusionError(f"{self.endpoint}: {e}") from None


class _Retry(Exception):
    """A failure worth retrying."""
