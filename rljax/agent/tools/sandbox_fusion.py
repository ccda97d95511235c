"""A code-interpreter tool backed by a remote SandboxFusion server (as verl's ``SandboxFusionTool``).

Each call POSTs ``{url}/run_code`` with SandboxFusion's request fields (``code``,
``language``, ``run_timeout``, ``compile_timeout``, ``memory_limit_MB``) and turns the
response into what the model sees: the run's stdout, then its stderr; a compile step's
output when compilation failed. The isolation is the server's (SandboxFusion runs code in its
own containers); nothing runs on this machine.

Response fields read: ``status`` (``Success`` / ``Failed`` / ``SandboxError``), ``message``,
and ``compile_result`` / ``run_result``, each ``{status: Finished | Error |
TimeLimitExceeded, return_code, stdout, stderr, execution_time}``.

Failures become observations, never exceptions, so an episode goes on:

- a ``TimeLimitExceeded`` run, or no answer within ``request_timeout_s``: error kind
  ``timeout``;
- ``SandboxError``, an HTTP error (after ``max_retries`` retries for 429/502/503/504 and
  refused connections, with exponential backoff), an unreachable server or a body that is not
  SandboxFusion's JSON: error kind ``exception``, with the reason in the text.

YAML::

    tools:
      - name: sandbox_fusion
        options: {sandbox_fusion_url: "http://localhost:8080", default_timeout: 10}
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from typing import Any

from rljax.agent.tools.base import PerLoopSemaphore, Tool, ToolResult

_RETRY_STATUS = frozenset({429, 502, 503, 504})


class _Unavailable(Exception):
    """A failure worth retrying (overloaded gateway, connection refused)."""


class SandboxFusionTool(Tool):
    """Runs ``{"code": str}`` on a SandboxFusion server; see the module docstring.

    Options (verl's names where verl has one):
        sandbox_fusion_url: the server (``http://host:port``) or its ``.../run_code`` endpoint.
        default_language: SandboxFusion ``language`` (``python``, ``cpp``, ``nodejs``, ...).
        default_timeout: ``run_timeout`` in seconds.
        compile_timeout: ``compile_timeout`` in seconds (compiled languages).
        memory_limit_mb: ``memory_limit_MB``.
        rate_limit: at most this many requests in flight per tool instance (per event loop).
        request_timeout_s: how long to wait for an answer (default: both timeouts + 10 s).
        max_retries: retries of a refused connection or an HTTP 429/502/503/504.
        retry_backoff_s: first retry delay, doubled each time.
        max_output_bytes: cap on the observation text (UTF-8 bytes of stdout and of stderr).
        headers: extra HTTP headers (e.g. an API gateway's key).
    """

    default_schema = {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "Run a program in a remote code sandbox and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The program to run."}},
                "required": ["code"],
            },
        },
    }

    def __init__(self, schema: dict[str, Any] | None = None, sandbox_fusion_url: str = "",
                 default_language: str = "python", default_timeout: float = 10.0,
                 compile_timeout: float = 10.0, memory_limit_mb: int = 1024, rate_limit: int = 10,
                 request_timeout_s: float | None = None, max_retries: int = 2,
                 retry_backoff_s: float = 0.5, max_output_bytes: int = 16384,
                 headers: dict[str, str] | None = None):
        super().__init__(schema)
        if not sandbox_fusion_url:
            raise ValueError("sandbox_fusion: set options.sandbox_fusion_url (e.g. http://localhost:8080)")
        url = sandbox_fusion_url.rstrip("/")
        self.url = url if url.endswith("/run_code") else url + "/run_code"
        self.language = default_language
        self.run_timeout = float(default_timeout)
        self.compile_timeout = float(compile_timeout)
        self.memory_limit_mb = int(memory_limit_mb)
        self.request_timeout_s = float(request_timeout_s if request_timeout_s is not None
                                       else self.run_timeout + self.compile_timeout + 10.0)
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.max_output_bytes = int(max_output_bytes)
        self.headers = dict(headers or {})
        self._semaphore = PerLoopSemaphore(max(1, int(rate_limit)))

    def request_body(self, code: str) -> dict[str, Any]:
        return {"code": code, "language": self.language, "run_timeout": self.run_timeout,
                "compile_timeout": self.compile_timeout, "memory_limit_MB": self.memory_limit_mb}

    async def call(self, arguments: dict[str, Any], state: Any) -> ToolResult:
        body = json.dumps(self.request_body(str(arguments["code"]))).encode("utf-8")
        async with self._semaphore.get():
            delay = self.retry_backoff_s
            for attempt in range(self.max_retries + 1):
                try:
                    response = await asyncio.wait_for(asyncio.to_thread(self._post, body),
                                                      self.request_timeout_s)
                    return self.format_response(response)
                except asyncio.TimeoutError:
                    return ToolResult(f"Error: the code sandbox did not answer within "
                                      f"{self.request_timeout_s:g} s", error="timeout")
                except _Unavailable as e:
                    if attempt == self.max_retries:
                        return ToolResult(f"Error: code sandbox unavailable ({e})", error="exception")
                except (OSError, ValueError) as e:  # HTTP 4xx/5xx, unreachable, not JSON
                    return ToolResult(f"Error: code sandbox request failed ({_reason(e)})", error="exception")
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _post(self, body: bytes) -> dict[str, Any]:
        """One blocking request (run in a worker thread)."""
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **self.headers})
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout_s) as resp:
                data = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode("utf-8", "replace")
            msg = f"HTTP {e.code} {e.reason}" + (f": {detail}" if detail else "")
            if e.code in _RETRY_STATUS:
                raise _Unavailable(msg) from None
            raise OSError(msg) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ConnectionRefusedError):
                raise _Unavailable(f"connection refused by {self.url}") from None
            if isinstance(e.reason, (socket.timeout, TimeoutError)):
                raise asyncio.TimeoutError() from None
            raise
        except (socket.timeout, TimeoutError):
            raise asyncio.TimeoutError() from None
        return parse_response(data)

    def _cap(self, text: str | None) -> tuple[str, bool]:
        raw = (text or "").encode("utf-8", "replace")
        if len(raw) <= self.max_output_bytes:
            return text or "", False
        return raw[: self.max_output_bytes].decode("utf-8", "ignore"), True

    def format_response(self, response: dict[str, Any]) -> ToolResult:
        """What the model sees for one SandboxFusion response (see the module docstring)."""
        status = response.get("status")
        compile_result = response.get("compile_result") or {}
        run_result = response.get("run_result") or {}
        if status == "SandboxError":
            message = response.get("message") or run_result.get("stderr") or compile_result.get("stderr") or ""
            return ToolResult(f"Error: sandbox error: {message}".strip(), error="exception")
        parts: list[str] = []
        truncated = False
        compiled_ok = not compile_result or (compile_result.get("status") == "Finished"
                                             and compile_result.get("return_code") in (0, None))
        if not compiled_ok:
            for key in ("stdout", "stderr"):
                text, cut = self._cap(compile_result.get(key))
                parts.append(text)
                truncated |= cut
        for key in ("stdout", "stderr"):
            text, cut = self._cap(run_result.get(key))
            parts.append(text)
            truncated |= cut
        text = ""
        for part in parts:
            if part:
                text += ("" if not text or text.endswith("\n") else "\n") + part
        text = text.rstrip("\n")
        if truncated:
            text += f"\n[output truncated at {self.max_output_bytes} bytes]"
        error = None
        if "TimeLimitExceeded" in (run_result.get("status"), compile_result.get("status")):
            limit = self.run_timeout if run_result.get("status") == "TimeLimitExceeded" else self.compile_timeout
            text += f"\nError: execution timed out after {limit:g} s"
            error = "timeout"
        elif not compiled_ok and not run_result:
            text += "\nError: compilation failed"
        return ToolResult(text.strip("\n") or "(no output)", error=error)


def parse_response(data: bytes) -> dict[str, Any]:
    """A SandboxFusion server's answer as a dict with its ``status``; `ValueError` saying
    what it is instead (not JSON, or JSON of something else). Shared with the code
    reward's client (`rljax.rewards.code_runner`)."""
    try:
        out = json.loads(data)
    except ValueError:
        raise ValueError(f"not JSON: {data[:200]!r}") from None
    if not isinstance(out, dict) or "status" not in out:
        raise ValueError(f"not a SandboxFusion response: {str(out)[:200]}")
    return out


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        return f"cannot reach the server: {e.reason}"
    return str(e) or type(e).__name__
