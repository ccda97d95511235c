"""The SandboxFusion backend against a local fake server speaking SandboxFusion's /run_code API."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rljax.agent import AgentConfig, Episode, run_episodes
from rljax.bench.scripted_agent import ScriptedSampler
from rljax.agent.tools import load_tools
from rljax.agent.tools.sandbox_fusion import SandboxFusionTool
from rljax.agent.trajectory import OBSERVATION

from .helpers import enc, hermes_call, run


def finished(stdout="", stderr="", return_code=0, status="Finished"):
    return {"status": status, "execution_time": 0.01, "return_code": return_code, "stdout": stdout, "stderr": stderr}


def response(run_result=None, status="Success", message="", compile_result=None):
    return {"status": status, "message": message, "compile_result": compile_result, "run_result": run_result,
            "executor_pod_name": None, "files": {}}


class FakeSandboxFusion:
    """Answers POST /run_code from a queue of scripted replies; records every request body.

    A reply is a dict (sent as JSON, HTTP 200), ``(status, body_bytes)``, or ``("sleep", s)``.
    When the queue is empty the last reply is repeated.
    """

    def __init__(self):
        self.replies: list = []
        self.requests: list[dict] = []
        self.paths: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                fake.paths.append(self.path)
                fake.requests.append(json.loads(body))
                reply = fake.replies.pop(0) if len(fake.replies) > 1 else fake.replies[0]
                if isinstance(reply, tuple) and reply[0] == "sleep":
                    time.sleep(reply[1])
                    reply = response(finished("late\n"))
                if isinstance(reply, dict):
                    code, data = 200, json.dumps(reply).encode()
                else:
                    code, data = reply
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, per test
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    with FakeSandboxFusion() as fake:
        yield fake


def call(tool, code="print(6 * 7)"):
    return run(tool.call({"code": code}, None))


def test_request_follows_the_sandbox_fusion_api(server):
    server.replies = [response(finished("42\n"))]
    tool = SandboxFusionTool(sandbox_fusion_url=server.url, default_timeout=7, memory_limit_mb=256)
    out = call(tool)
    assert out.text == "42" and out.error is None
    assert server.paths == ["/run_code"]
    assert server.requests == [{"code": "print(6 * 7)", "language": "python", "run_timeout": 7.0,
                                "compile_timeout": 10.0, "memory_limit_MB": 256}]
    # verl's configs give the full endpoint; both spellings reach the same path
    call(SandboxFusionTool(sandbox_fusion_url=server.url + "/run_code/"))
    assert server.paths[-1] == "/run_code"


def test_program_errors_are_shown_like_the_local_tool(server):
    tb = 'Traceback (most recent call last):\n  File "/tmp/x.py", line 1\nZeroDivisionError: division by zero\n'
    server.replies = [response(finished("before\n", tb, return_code=1), status="Failed")]
    out = call(SandboxFusionTool(sandbox_fusion_url=server.url), "print('before')\n1/0")
    assert out.error is None and out.text.startswith("before\nTraceback") and "ZeroDivisionError" in out.text


def test_compile_errors_are_shown(server):
    server.replies = [response(None, status="Failed",
                               compile_result=finished("", "a.cpp:1: error: expected ';'", return_code=1))]
    out = call(SandboxFusionTool(sandbox_fusion_url=server.url, default_language="cpp"), "int main() {}")
    assert "expected ';'" in out.text and "compilation failed" in out.text
    assert server.requests[0]["language"] == "cpp"


def test_time_limit_exceeded_is_a_timeout(server):
    server.replies = [response(finished("partial\n", "", return_code=None, status="TimeLimitExceeded"),
                               status="Failed")]
    out = call(SandboxFusionTool(sandbox_fusion_url=server.url, default_timeout=3))
    assert out.error == "timeout" and out.text == "partial\nError: execution timed out after 3 s"


def test_sandbox_error_is_an_exception_observation(server):
    server.replies = [response(finished("", "runner crashed", status="Error"), status="SandboxError",
                               message="runner crashed")]
    out = call(SandboxFusionTool(sandbox_fusion_url=server.url))
    assert out.error == "exception" and out.text == "Error: sandbox error: runner crashed"


def test_gateway_errors_are_retried_then_reported(server):
    server.replies = [(503, b"busy"), (502, b""), response(finished("ok\n"))]
    tool = SandboxFusionTool(sandbox_fusion_url=server.url, max_retries=2, retry_backoff_s=0.01)
    out = call(tool)
    assert out.text == "ok" and len(server.requests) == 3
    server.replies = [(503, b"busy")]
    out = call(tool)
    assert out.error == "exception" and "HTTP 503" in out.text and "busy" in out.text
    assert len(server.requests) == 3 + 3  # first try + 2 retries


def test_client_errors_and_garbage_are_not_retried(server):
    server.replies = [(422, b'{"detail": "language: field required"}')]
    tool = SandboxFusionTool(sandbox_fusion_url=server.url, retry_backoff_s=0.01)
    out = call(tool)
    assert out.error == "exception" and "HTTP 422" in out.text and len(server.requests) == 1
    for body in (b"<html>oops</html>", b'{"unexpected": 1}'):
        server.replies = [(200, body)]
        out = call(tool)
        assert out.error == "exception" and "request failed" in out.text


def test_a_server_that_does_not_answer_is_a_timeout(server):
    server.replies = [("sleep", 3.0)]
    tool = SandboxFusionTool(sandbox_fusion_url=server.url, request_timeout_s=0.5)
    start = time.monotonic()
    out = call(tool)
    assert out.error == "timeout" and "did not answer within 0.5 s" in out.text
    assert time.monotonic() - start < 2.5


def test_an_unreachable_server_is_an_exception_observation():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    tool = SandboxFusionTool(sandbox_fusion_url=f"http://127.0.0.1:{port}", max_retries=1, retry_backoff_s=0.01)
    out = call(tool)
    assert out.error == "exception" and "unavailable" in out.text and "refused" in out.text


def test_output_is_capped(server):
    server.replies = [response(finished("x" * 5000))]
    out = call(SandboxFusionTool(sandbox_fusion_url=server.url, max_output_bytes=100))
    assert out.text == "x" * 100 + "\n[output truncated at 100 bytes]"


def test_configured_from_yaml(server, tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(f"tools:\n  - name: sandbox_fusion\n    options: {{sandbox_fusion_url: '{server.url}', "
                    "default_timeout: 5, rate_limit: 2, headers: {X-Api-Key: k}}\n")
    tools = load_tools(path)
    tool = tools["code_interpreter"]
    assert isinstance(tool, SandboxFusionTool) and tool.run_timeout == 5.0
    with pytest.raises(ValueError, match="sandbox_fusion_url"):
        load_tools({"tools": [{"name": "sandbox_fusion"}]})
    with pytest.raises(ValueError, match="unknown option 'url'"):
        load_tools({"tools": [{"name": "sandbox_fusion", "options": {"url": server.url}}]})


def test_agent_loop_goes_on_after_sandbox_failures(hermes_tok, server):
    tok = hermes_tok
    server.replies = [(500, b"internal error"), response(finished("", "", None, "TimeLimitExceeded"), "Failed"),
                      response(finished("42\n"))]
    script = [enc(tok, hermes_call("code_interpreter", {"code": c}) + "<|im_end|>") for c in ("a", "b", "c")]
    script.append(enc(tok, "The answer is 42.<|im_end|>"))
    tool = SandboxFusionTool(sandbox_fusion_url=server.url, max_retries=0)
    cfg = AgentConfig(max_turns=len(script), tool_timeout_s=10, max_response_tokens=4096)
    (traj,) = run(run_episodes(ScriptedSampler(script), [Episode(messages=[{"role": "user", "content": "go"}])],
                               tok, cfg, tools=[tool]))
    assert traj.termination == "stop" and traj.num_turns == len(script)
    observations = [tok.decode(traj.response_ids[s.start:s.end]) for s in traj.segments if s.kind == OBSERVATION]
    assert "HTTP 500" in observations[0] and "timed out" in observations[1] and "42" in observations[2]
    assert traj.tool_errors["exception"] == 1 and traj.tool_errors["timeout"] == 1
    assert sum(traj.tool_errors.values()) == 2
