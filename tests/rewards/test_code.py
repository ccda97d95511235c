"""Code rewards (`rljax.rewards.code`): extraction, output comparison and scoring by hand,
tests run in the OS sandbox, hostile samples, and the SandboxFusion path against a fake
server. Expected values are hand-computed from verl's ``prime_code`` / ``sandbox_fusion``
rules (the parity test, test_code_parity.py, asks verl itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rljax.rewards import RewardManager, get_reward_fn, known_data_sources
from rljax.rewards.code import (
    CODE_SOURCES,
    CodeRewardSettings,
    compute_score,
    extract_code,
    extract_code_sandbox_fusion,
    pass_fraction,
    stdout_matches,
    value_matches,
)
from rljax.rewards.code_harness import stdin_program
from rljax.rewards.code_runner import SandboxFusionClient, SandboxFusionError, SandboxLimits, run_in_sandbox

REQUIRE_BWRAP = bool(os.environ.get("CI") or os.environ.get("RLJAX_REQUIRE_BWRAP"))
OS_SANDBOX = "required" if REQUIRE_BWRAP else "auto"
FAST = SandboxLimits(test_timeout_s=1.0, memory_mb=256, sample_timeout_s=3.0, max_output_bytes=1 << 16,
                     os_sandbox=OS_SANDBOX)
SETTINGS = CodeRewardSettings(limits=FAST)
SUM_GT = {"inputs": ["1 2\n", "3 4\n", "60 1\n"], "outputs": ["3\n", "7\n", "61\n"]}


def fence(code: str) -> str:
    return f"Answer:\n```python\n{code}\n```\n"


def score(code: str, gt=SUM_GT, settings=SETTINGS, **kw) -> float:
    return compute_score("apps", fence(code), json.dumps(gt), settings=settings, **kw)["score"]


# ---- pure parts ------------------------------------------------------------------------------

def test_registered_for_verls_code_sources():
    for name in ("codecontests", "apps", "codeforces", "taco"):
        assert name in known_data_sources() and get_reward_fn(name) is compute_score
    assert set(CODE_SOURCES) == {"codecontests", "apps", "codeforces", "taco", "synthetic/code"}


@pytest.mark.parametrize("completion, code", [
    ("```python\nA\n```", "\nA\n"),
    ("x ```python\nA\n``` y ```python\nB\n``` z", "\nB\n"),  # the last python block
    ("print(1)", "print(1)"),  # no fence: all of it
    ("pre\n```\nA\n```", "pre\n"),  # a plain fence: what comes before it
    ("```python\nA", "\nA"),  # unclosed
])
def test_extract_code_as_prime_code(completion, code):
    assert extract_code(completion) == code


@pytest.mark.parametrize("completion, code", [
    ("```python\nA\n```", "\nA\n"),
    ("pre\n```cpp\nA\n```", "A\n"),  # a bare-word first line is the language
    ("pre\n```\nA\n```", "\nA\n"),
    ("no fence", None),
])
def test_extract_code_as_sandbox_fusion(completion, code):
    assert extract_code_sandbox_fusion(completion) == code


@pytest.mark.parametrize("stdout, expected, ok", [
    ("3\n", "3\n", True),
    ("  3  \n\n", "3", True),  # the whole text stripped
    ("1 \n 2\n", "1\n2\n", True),  # every line stripped
    ("1\n\n2\n", "1\n2\n", True),  # empty lines dropped
    ("1\n2\n", "1\n\n2\n", True),  # empty expected lines dropped
    ("1\r\n2\r\n", "1\n2\n", True),
    ("0.333333\n", "0.3333333333\n", True),  # |d| = 3.3e-7 <= 1e-8 + 1e-5 * 0.333
    ("0.33\n", "0.3333333333\n", False),
    ("0.333333 3.0\n", "0.3333333333 3.0\n", False),  # a line of two numbers: text only
    ("-1.0000001\n", "-1\n", True),  # "-1" is not an unsigned integer: compared as floats
    ("10\n", "10.000001\n", True),
    ("10\n", "11\n", False),
    ("a  b\n", "a b\n", False),  # inner spaces count
    ("1 2 3\n", "1\n2\n3\n", False),
    ("", "  \n", True),
    ("3\n", ["3"], True),  # a list of lines is joined
    ("3\n", 3, False),  # not text
    ("nan\n", "nan\n", True),  # equal text
    ("nan\n", "nan \n", True),
    ("inf\n", "1e309\n", True),  # float("1e309") == inf
])
def test_stdout_matches_as_run_test(stdout, expected, ok):
    assert stdout_matches(stdout, expected) is ok


@pytest.mark.parametrize("output, expected, ok", [
    (3, "3", True),
    (3.0, "3", True),  # 3.0 == 3
    ("3", "3", False),
    ([1, 2], "[1, 2]", True),
    ((1, 2), "[1, 2]", True),  # a tuple result as a list
    ([(1, 2)], "[[1, 2]]", False),  # a list of tuples is not a list of lists
    ([(1, 2)], "[[[1, 2]]]", True),  # ... except against expected[0]
    ([1, 2], "[[1, 2]]", True),  # output == expected[0]
    ({1: 2}, '{"1": 2}', True),  # keys made ints
    ({"1": 2}, '{"1": 2}', False),
    ({"a": 2}, '{"a": 2}', True),  # keys that are not ints stay
    (None, "null", True),
    (True, "1", True),
    (1, "not json", False),
])
def test_value_matches_as_run_test(output, expected, ok):
    assert value_matches(output, expected) is ok


def test_pass_fraction():
    assert pass_fraction([True] * 12, True) == 1.0
    assert pass_fraction([True] * 10 + [False, True], True) == 1.0  # only the first ten count
    assert pass_fraction([False] + [True] * 11, True) == 0.9
    assert pass_fraction([True, False, True], True) == pytest.approx(2 / 3)
    assert pass_fraction([True, False, True], False) == 0.0


def test_stdin_program_wraps_like_prime_code():
    code = "import sys\nx = 1\nimport os\nprint(x)"
    assert stdin_program(code) == ("import sys\nstdin = sys.stdin\nstdout = sys.stdout\ndef code():\n"
                                   "\tx = 1\n\timport os\n\tprint(x)\n")
    guarded = "def f():\n    print(1)\nif __name__ == \"__main__\":\n    f()"
    assert stdin_program(guarded).endswith("\tdef f():\n\t    print(1)\n\tf()\n")


# ---- in the sandbox --------------------------------------------------------------------------

def test_right_wrong_partial_in_the_sandbox():
    assert score("a, b = map(int, input().split())\nprint(a + b)") == 1.0
    assert score("a, b = map(int, input().split())\nprint(a * b)") == 0.0
    assert score("a, b = map(int, input().split())\nprint(a + b if a < 50 else 0)") == pytest.approx(2 / 3)
    assert score("a, b = map(int, input().split())\nprint(a + b if a < 50 else 0)", continuous=False) == 0.0
    out = compute_score("apps", fence("print(1)"), "not json", settings=SETTINGS)
    assert out == {"score": 0.0, "acc": 0.0}


def test_call_based_in_the_sandbox():
    gt = {"fn_name": "add", "inputs": ["1\n2", "[1]\n[2, 3]"], "outputs": ["3", "[1, 2, 3]"]}
    assert score("def add(a, b):\n    return a + b", gt) == 1.0
    assert score("class Solution:\n    def add(self, a, b):\n        return a + b", gt) == 1.0
    # not all pass: verl's per-test runs are programs on stdin, which print nothing here
    assert score("def add(a, b):\n    return a + b if a == 1 else None", gt) == 0.0


def test_records_carry_no_expected_output_and_the_network_is_closed():
    code = "import socket\ns = socket.socket()\ns.connect(('1.1.1.1', 80))\nprint('connected')"
    records = run_in_sandbox(code, ["\n"], None, FAST)
    assert records[0]["status"] == "error"


def _timed(code: str, gt=SUM_GT, limits=FAST):
    t0 = time.monotonic()
    s = score(code, gt, CodeRewardSettings(limits=limits))
    return s, time.monotonic() - t0


def test_infinite_loop_costs_its_time_limit():
    one = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    s, took = _timed("while True:\n    pass", one)
    assert s == 0.0 and FAST.test_timeout_s <= took < FAST.test_timeout_s + 2.0
    records = run_in_sandbox("while True:\n    pass", ["\n"], None, FAST)
    assert records[0]["status"] == "timeout"


@pytest.mark.slow
def test_infinite_loop_on_every_test_stops_at_the_sample_cap():
    many = {"inputs": ["1 2\n"] * 8, "outputs": ["3\n"] * 8}
    s, took = _timed("while True:\n    pass", many)
    assert s == 0.0 and took < FAST.sample_timeout_s + 2.0  # not 8 x test_timeout_s


def test_fork_bomb_is_refused():
    s, took = _timed("import os\nwhile True:\n    os.fork()")
    assert s == 0.0 and took < 3.0
    records = run_in_sandbox("import os\nwhile True:\n    os.fork()", ["\n"], None, FAST)
    assert records[0]["status"] == "error"


def test_memory_hog_hits_its_memory_limit():
    hog = "x = []\nwhile True:\n    x.append(bytearray(10 ** 7))"
    records = run_in_sandbox(hog, ["\n"], None, FAST)
    assert records[0]["status"] == "error" and records[0]["error"] == "MemoryError"
    assert records[0]["time_s"] < FAST.test_timeout_s


def test_stdout_flood_hits_its_output_limit():
    records = run_in_sandbox("while True:\n    print('x' * 1000)", ["\n"], None, FAST)
    assert records[0]["status"] == "output_limit" and records[0]["time_s"] < FAST.test_timeout_s
    big = run_in_sandbox("def f():\n    return 'x' * 10 ** 6", ["0"], "f", FAST)
    assert big[0]["status"] in ("output_limit", "error")


@pytest.mark.slow
def test_hostile_samples_cost_only_their_own_limits_in_a_batch():
    """A batch through worker processes: every right answer still scores 1."""
    right = fence("a, b = map(int, input().split())\nprint(a + b)")
    hostile = [fence("while True:\n    pass"), fence("import os\nwhile True:\n    os.fork()"),
               fence("x = []\nwhile True:\n    x.append(bytearray(10 ** 7))"), fence("while True:\n    print('x' * 1000)")]
    batch = []
    for k in range(8):
        batch.append({"data_source": "apps", "solution_str": right, "ground_truth": json.dumps(SUM_GT)})
        batch.append({"data_source": "codeforces", "solution_str": hostile[k % 4], "ground_truth": SUM_GT})
    with RewardManager(num_workers=2, timeout_s=10.0, code_settings=SETTINGS) as manager:
        result = manager.score(batch)
    assert list(result.scores) == [1.0, 0.0] * 8
    assert not result.errors


# ---- SandboxFusion --------------------------------------------------------------------------

class _FakeSandboxFusion(BaseHTTPRequestHandler):
    """``POST /run_code``: runs the Python program with the local interpreter (the test's
    own programs), answering the first `fail_first` requests with HTTP 503."""

    server_version = "fake-sandbox-fusion"
    lock = threading.Lock()
    requests = 0
    in_flight = 0
    max_in_flight = 0
    fail_first = 0
    drop_first = 0  # of the requests after the failing ones: closed without an answer
    garbage = b""  # set: every answer is HTTP 200 with this body

    def log_message(self, *args):
        pass

    def do_POST(self):
        cls = type(self)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with cls.lock:
            cls.requests += 1
            failing = cls.requests <= cls.fail_first
            dropping = not failing and cls.requests <= cls.fail_first + cls.drop_first
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
        counted = True  # still in in_flight
        try:
            if self.path != "/run_code":
                self.send_error(404)
                return
            if failing:
                self.send_error(503)
                return
            if dropping:
                self.close_connection = True
                return
            if cls.garbage:
                self.send_response(200)
                self.send_header("Content-Length", str(len(cls.garbage)))
                self.end_headers()
                self.wfile.write(cls.garbage)
                return
            time.sleep(0.05)
            try:
                run = subprocess.run([sys.executable, "-c", body["code"]], input=body["stdin"] or "",
                                     capture_output=True, text=True, timeout=body["run_timeout"])
                result = {"status": "Finished", "return_code": run.returncode, "stdout": run.stdout,
                          "stderr": run.stderr, "execution_time": 0.01}
                status = "Success" if run.returncode == 0 else "Failed"
            except subprocess.TimeoutExpired:
                result = {"status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}
                status = "Failed"
            data = json.dumps({"status": status, "message": "", "compile_result": None, "run_result": result}).encode()
            with cls.lock:  # done before the client can see the answer and send its next request
                cls.in_flight -= 1
                counted = False
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        finally:
            if counted:
                with cls.lock:
                    cls.in_flight -= 1


@pytest.fixture
def fake_server():
    handler = type("Handler", (_FakeSandboxFusion,), {"lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        server.server_close()


def _client(server, **kw) -> SandboxFusionClient:
    return SandboxFusionClient(url=f"http://127.0.0.1:{server.server_address[1]}", retry_backoff_s=0.01, **kw)


def test_sandbox_fusion_scores_as_verls_module(fake_server):
    server, handler = fake_server
    settings = CodeRewardSettings(sandbox_fusion=_client(server, max_concurrency=2))
    many = {"inputs": [f"{k} 1\n" for k in range(12)], "outputs": [f"{k + 1}\n" for k in range(12)]}
    right = "a, b = map(int, input().split())\nprint(a + b)"
    assert score(right, many, settings) == 1.0
    assert handler.requests == 12 and handler.max_in_flight <= 2  # one request per test, at most 2 at once
    # verl's sandbox_fusion: the share of the first ten, even when a later test fails
    assert score("a, b = map(int, input().split())\nprint(a + b if a != 11 else 0)", many, settings) == 1.0
    assert score("a, b = map(int, input().split())\nprint(a + b if a % 2 else 0)", many, settings) == 0.5
    # stdout compared without trailing newlines only: a trailing space fails (prime_code would pass it)
    assert score("a, b = map(int, input().split())\nprint(a + b, end=' \\n')", many, settings) == 0.0
    assert compute_score("apps", "no code block", json.dumps(many), settings=settings)["score"] == 0.0
    gt = {"fn_name": "add", "inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"]}
    assert score("def add(a, b):\n    return a + b", gt, settings) == 1.0
    assert score("class Solution:\n    def add(self, a, b):\n        return a + b", gt, settings) == 1.0


def test_sandbox_fusion_retries_then_gives_up(fake_server):
    server, handler = fake_server
    handler.fail_first = 2
    settings = CodeRewardSettings(sandbox_fusion=_client(server, max_concurrency=1, max_retries=2))
    one = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    assert score("a, b = map(int, input().split())\nprint(a + b)", one, settings) == 1.0
    assert handler.requests == 3  # two 503s, then the answer
    handler.requests, handler.fail_first, handler.drop_first = 0, 1, 1
    assert score("a, b = map(int, input().split())\nprint(a + b)", one, settings) == 1.0
    assert handler.requests == 3  # a 503, a dropped connection, then the answer
    handler.requests, handler.fail_first, handler.drop_first = 0, 10, 0
    assert score("a, b = map(int, input().split())\nprint(a + b)", one, settings) == 0.0
    assert handler.requests == 3  # the first try and two retries


def test_sandbox_fusion_answers_that_are_not_sandbox_fusions_fail_the_test_without_retries(fake_server):
    server, handler = fake_server
    client = _client(server, max_retries=2)
    one = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    for body, problem in ((b"<html>oops</html>", "not JSON"), (b'{"unexpected": 1}', "not a SandboxFusion response")):
        handler.requests, handler.garbage = 0, body
        with pytest.raises(SandboxFusionError, match=problem):
            client.run("print(3)", "")
        assert score("a, b = map(int, input().split())\nprint(a + b)", one,
                     CodeRewardSettings(sandbox_fusion=client)) == 0.0
        assert handler.requests == 2  # one request each, none retried


def test_reward_config_code_sections():
    from rljax.config import ConfigError, check_config, from_dict
    from rljax.rl.config import RLConfig
    from rljax.rl.generation import code_reward_settings

    settings = code_reward_settings(RLConfig().reward)
    assert settings.sandbox_fusion is None and settings.limits.test_timeout_s == 5.0 and settings.continuous
    cfg = from_dict(RLConfig, {"reward": {"code": {"test_timeout_s": 2, "continuous": False},
                                          "sandbox_fusion": {"url": "http://sf:8080", "max_concurrency": 4}}})
    check_config(cfg)
    settings = code_reward_settings(cfg.reward)
    assert settings.limits.test_timeout_s == 2 and not settings.continuous
    assert settings.sandbox_fusion.endpoint == "http://sf:8080/run_code" and settings.sandbox_fusion.max_concurrency == 4
    for bad, key in [({"code": {"memory_mb": 0}}, "reward.code.memory_mb"),
                     ({"sandbox_fusion": {"url": "sf:8080"}}, "reward.sandbox_fusion.url"),
                     ({"code": {"timeout": 1}}, "timeout")]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            check_config(from_dict(RLConfig, {"reward": bad}))


def test_code_pass_at_k_in_validation_metrics():
    """`rljax eval`'s metrics: a code sample is correct when every test passes (``acc``),
    so pass@k is the unbiased estimator over ``acc``; the partial scores (``reward``) have
    none. One prompt, 4 samples, 1 all-pass: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1/2,
    pass@4 = 1 (hand-computed, Chen et al. 2021 eq. 1)."""
    from rljax.evaluation.validation import validation_metrics

    answers = ["a, b = map(int, input().split())\nprint(a + b)",
               "a, b = map(int, input().split())\nprint(a + b if a < 50 else 0)",
               "a, b = map(int, input().split())\nprint(a * b)",
               "print(0)"]
    records = []
    for code in answers:
        out = compute_score("taco", fence(code), SUM_GT, settings=SETTINGS)
        records.append({"data_source": "taco", "prompt_index": 0, **out})
    assert [r["acc"] for r in records] == [1.0, 0.0, 0.0, 0.0]
    m = validation_metrics(records)
    assert m["val-aux/taco/acc/pass@1"] == pytest.approx(0.25)
    assert m["val-aux/taco/acc/pass@2"] == pytest.approx(0.5)
    assert m["val-core/taco/acc/pass@4"] == pytest.approx(1.0)
    assert m["val-core/taco/acc/mean@4"] == pytest.approx(0.25)
    assert m["val-aux/taco/reward/mean@4"] == pytest.approx((1 + 2 / 3) / 4)
    assert not any(k.startswith("val-aux/taco/reward/pass@") for k in m)


def test_scores_from_inside_a_running_event_loop():
    import asyncio

    async def inside():
        return score("a, b = map(int, input().split())\nprint(a + b)")

    assert asyncio.run(inside()) == 1.0
