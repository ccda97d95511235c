"""Code rewards: verl's ``codecontests``, ``apps``, ``codeforces`` and ``taco`` data sources, and
rljax's ``synthetic/code`` task (`rljax.data.synthetic_code`), scored the same way.

The response's code runs against the test cases of ``ground_truth`` and the score is the
share that pass, with the semantics of verl's ``default_compute_score`` for these sources
(``verl.utils.reward_score.prime_code``, ``continuous=True``):

- the code: the text after the last ```` ```python ```` up to the next ```` ``` ````; a
  response without one is taken up to its first ```` ``` ```` (all of it when it has none)
  (`extract_code`);
- ``ground_truth``: a dict or its JSON text with ``inputs`` and ``outputs`` (lists, one
  entry per test) and optionally ``fn_name``. Without ``fn_name`` each test is a program
  run: the input is its stdin (a list of lines is joined with newlines), the output what it
  must print. With ``fn_name`` each test is a call: every line of the input is one JSON
  argument, the output the JSON of the return value;
- the score is 1.0 when every test passes; otherwise, with `continuous` (verl's default for
  these sources), the share of the first ten tests that pass; without, 0.0. verl's
  per-test runs lose ``fn_name``: for that share a call-based test runs as a program on
  its input lines and must print the expected JSON text (so a call-based answer scores
  1.0 or, almost always, 0.0);
- stdout is compared as verl's ``run_test`` does (`stdout_matches`): equal after stripping
  the whole text, or after stripping every line; equal line lists once empty lines are
  dropped (and the expected lines stripped); or, unless every line is an unsigned integer,
  every line a number and all close (``numpy.allclose``: ``|a - b| <= 1e-8 + 1e-5 |b|``).
  A call's value is compared with ``==`` to the decoded JSON, a tuple result as a list, as
  verl does (`value_matches`).

Tests run in rljax's OS sandbox (`rljax.rewards.code_runner.run_in_sandbox`: one sandbox
per sample, a forked child per test with its time and memory limits, a cap on the
sample's wall time). With a SandboxFusion URL (``reward.sandbox_fusion.url``) each test
is one request to that server and the semantics are those of verl's ``sandbox_fusion``
module instead (`score_with_sandbox_fusion`).

The scorer returns ``{"score", "acc"}``: ``acc`` is 1.0 when every test passed.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rljax.rewards.code_runner import SandboxFusionClient, SandboxFusionError, SandboxLimits, run_in_sandbox
from rljax.rewards.registry import register_reward

CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco", "synthetic/code")  # the last: rljax.data.synthetic_code
CONTINUOUS_TESTS = 10  # verl scores the first ten tests when not all pass


@dataclass(frozen=True)
class CodeRewardSettings:
    """How code samples are run (`reward.code` and `reward.sandbox_fusion` of the RL config)."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    sandbox_fusion: SandboxFusionClient | None = None  # set: tests go to that server
    continuous: bool = True  # not all pass: the share of the first ten tests (verl's default) | 0.0


DEFAULT_SETTINGS = CodeRewardSettings()


def extract_code(completion: str) -> str:
    """verl's ``prime_code`` extraction (module docstring)."""
    return completion.split("```python")[-1].split("```")[0]


def parse_tests(ground_truth: Any) -> dict[str, Any] | None:
    """``ground_truth`` as a dict with ``inputs``/``outputs`` lists (at least one output
    per input), or None when it is not one."""
    tests = ground_truth
    if not isinstance(tests, dict):
        try:
            tests = json.loads(tests)
        except (TypeError, ValueError):
            return None
    if not isinstance(tests, dict):
        return None
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(outputs) < len(inputs):
        return None
    return tests


# ---- comparisons (verl's run_test) ------------------------------------------------------------

def _int_like(s: str) -> bool:
    return isinstance(s, str) and s.isdigit()


def _close(a: float, b: float) -> bool:
    """``numpy.isclose(a, b)`` with its defaults: rtol 1e-5 (of `b`), atol 1e-8."""
    if a == b:
        return True
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return False
    return abs(a - b) <= 1e-8 + 1e-5 * abs(b)


def stdout_matches(stdout: str, expected: Any) -> bool:
    """Whether a program's `stdout` passes a test whose output is `expected` (a string, or
    a list of lines joined with newlines), as verl's ``run_test`` decides (module docstring)."""
    if isinstance(expected, list):
        if not all(isinstance(e, str) for e in expected):
            return False
        expected = "\n".join(expected)
    if not isinstance(expected, str):
        return False
    lines = stdout.splitlines()
    want = expected.strip()
    if "\n".join(lines).strip() == want or "\n".join(line.strip() for line in lines).strip() == want:
        return True
    expected_lines = [line.strip() for line in expected.split("\n") if line]
    if lines == expected_lines:
        return True
    got = [line for line in lines if line]
    if got == expected_lines:
        return True
    if len(got) != len(expected_lines) or all(_int_like(a) and _int_like(b) for a, b in zip(got, expected_lines)):
        return False
    try:
        return all(_close(float(a), float(b)) for a, b in zip(got, expected_lines))
    except ValueError:
        return False


def decode_value(tagged: Any) -> Any:
    """The value `rljax.rewards.code_harness.encode` encoded."""
    tag = tagged[0]
    if tag == "n":
        return None
    if tag == "b":
        return bool(tagged[1])
    if tag == "i":
        return int(tagged[1])
    if tag == "f":
        return float(tagged[1])
    if tag == "s":
        return str(tagged[1])
    if tag == "l":
        return [decode_value(v) for v in tagged[1]]
    if tag == "t":
        return tuple(decode_value(v) for v in tagged[1])
    if tag == "d":
        return {decode_value(k): decode_value(v) for k, v in tagged[1]}
    raise ValueError(f"unknown value tag {tag!r}")


def _int_keys(d: dict) -> dict:
    return {int(k): v for k, v in d.items()}


def value_matches(output: Any, expected_json: Any) -> bool:
    """Whether a call's return value `output` passes a test whose output is the JSON text
    `expected_json`, as verl's ``run_test`` decides: ``output == expected``, or
    ``output == expected[0]`` for a non-empty list, a tuple result as a list, a list of
    tuples as a list of lists against ``expected[0]``; an expected dict (or a list whose
    first element is a dict) has its keys made ints when they all are."""
    if not isinstance(expected_json, (str, bytes, bytearray)):
        return False
    try:
        expected = json.loads(expected_json)
    except ValueError:
        return False
    if isinstance(expected, dict):
        try:
            expected = [_int_keys(expected)]
        except (ValueError, TypeError):
            pass
    try:
        if isinstance(expected[0], dict):
            expected = [_int_keys(expected[0])]
    except (KeyError, IndexError, TypeError, ValueError):
        pass
    if isinstance(output, tuple):
        output = list(output)
    result = output == expected
    if isinstance(expected, list) and expected:
        result = result or output == expected[0]
    try:
        if isinstance(output[0], tuple):
            result = result or [list(x) for x in output] == expected[0]
    except (KeyError, IndexError, TypeError):
        pass
    return result is True


def record_passes(record: dict[str, Any] | None, expected: Any, call_based: bool) -> bool:
    """Whether one test's harness record passes against `expected`."""
    if record is None or record.get("status") != "ok":
        return False
    try:
        if call_based:
            return value_matches(decode_value(record["value"]), expected)
        return stdout_matches(str(record["out"]), expected)
    except (KeyError, IndexError, TypeError, ValueError, RecursionError):
        return False


def pass_fraction(passed: list[bool], continuous: bool) -> float:
    """verl's score from per-test results: 1.0 when all pass, else (continuous) the share
    of the first `CONTINUOUS_TESTS` that pass, else 0.0."""
    if all(passed):
        return 1.0
    if not continuous:
        return 0.0
    first = passed[:CONTINUOUS_TESTS]
    return sum(first) / len(first)


# ---- scoring ---------------------------------------------------------------------------------

def score_in_sandbox(completion: str, ground_truth: Any, continuous: bool = True,
                     limits: SandboxLimits = SandboxLimits()) -> tuple[float, list[bool]]:
    """(score, per-test pass) with verl's ``prime_code`` semantics (module docstring); a
    ground truth that is not test cases scores 0.0 with no tests."""
    tests = parse_tests(ground_truth)
    if tests is None or not tests["inputs"]:
        return 0.0, []
    code = extract_code(completion)
    fn_name = tests.get("fn_name")
    passed = _run_and_check(code, tests["inputs"], tests["outputs"], fn_name, limits)
    if all(passed) or not continuous or fn_name is None:
        return pass_fraction(passed, continuous), passed
    # verl's per-test runs drop fn_name: the first ten tests run as programs on stdin
    first = _run_and_check(code, tests["inputs"][:CONTINUOUS_TESTS], tests["outputs"], None, limits)
    return sum(first) / len(first), passed


def _run_and_check(code: str, inputs: list, outputs: list, fn_name: str | None, limits: SandboxLimits) -> list[bool]:
    records = run_in_sandbox(code, inputs, fn_name, limits)
    return [record_passes(records[i] if i < len(records) else None, outputs[i], fn_name is not None)
            for i in range(len(inputs))]


# verl's sandbox_fusion path -------------------------------------------------------------------

def extract_code_sandbox_fusion(completion: str) -> str | None:
    """verl's ``sandbox_fusion`` extraction: after the last ```` ```python ````; else the
    first fenced block (a first line that is a bare word, the language, dropped); None
    when the response has no fence."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    if "```" not in completion:
        return None
    block = completion.split("```")[1]
    if "\n" in block:
        first, rest = block.split("\n", 1)
        if first.strip().isalpha():
            block = rest
    return block


def call_program(code: str, fn_name: str) -> str:
    """A program that calls `fn_name` of `code` (a global function, else a method of
    ``Solution()``) on the JSON arguments of its stdin lines and prints the result: the
    JSON of a dict, list, tuple, bool or None, ``str()`` of anything else (what verl's
    ``sandbox_fusion`` runs for a call-based test)."""
    prelude = "".join(f"from {m} import *\n" for m in _SF_STAR) + "".join(f"import {m}\n" for m in _SF_STAR[:-2])
    return (prelude + "\n" + code + "\n\n"
            + "def _rljax_call():\n"
            + "    import json as _j, sys as _s\n"
            + "    raw = _s.stdin.read()\n"
            + "    args = [_j.loads(line) for line in raw.split('\\n')] if raw.strip() else []\n"
            + f"    name = {fn_name!r}\n"
            + "    if name in globals():\n"
            + "        fn = globals()[name]\n"
            + "    elif 'Solution' in globals():\n"
            + "        fn = getattr(globals()['Solution'](), name)\n"
            + "    else:\n"
            + "        raise SystemExit(1)\n"
            + "    out = fn(*args)\n"
            + "    if out is None or isinstance(out, (dict, list, tuple, bool)):\n"
            + "        print(_j.dumps(out))\n"
            + "    else:\n"
            + "        print(str(out))\n"
            + "_rljax_call()\n")


_SF_STAR = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
            "itertools", "functools", "operator", "io", "sys", "json", "builtins", "typing")


def sandbox_fusion_passes(response: dict[str, Any], expected: Any) -> bool:
    """verl's ``sandbox_fusion`` verdict for one test: the run finished with status
    ``Success`` and its stdout equals the expected output once trailing newlines are
    dropped from both (a test without an expected output passes when the run does)."""
    run = response.get("run_result") or {}
    if response.get("status") != "Success" or run.get("status") != "Finished":
        return False
    if expected is None:
        return True
    stdout = run.get("stdout")
    return str(stdout if stdout is not None else "").rstrip("\n") == str(expected).rstrip("\n")


def score_with_sandbox_fusion(completion: str, ground_truth: Any, client: SandboxFusionClient,
                              continuous: bool = True) -> tuple[float, list[bool]]:
    """(score, per-test pass) with verl's ``sandbox_fusion`` semantics: each test one
    request (in parallel, `client.max_concurrency` at most); with `continuous` the share
    of the first ten tests that pass, else of all tests. A server that gives no answer
    after the retries fails that test."""
    code = extract_code_sandbox_fusion(completion)
    tests = parse_tests(ground_truth)
    if code is None or tests is None or not tests["inputs"]:
        return 0.0, []
    fn_name = tests.get("fn_name")
    program = call_program(code, fn_name) if fn_name else code

    def one(i: int) -> bool:
        stdin = tests["inputs"][i]
        try:
            response = client.run(program, None if stdin is None else str(stdin))
        except SandboxFusionError:
            return False
        return sandbox_fusion_passes(response, tests["outputs"][i])

    n = len(tests["inputs"])
    with ThreadPoolExecutor(max_workers=min(n, max(1, client.max_concurrency))) as pool:
        passed = list(pool.map(one, range(n)))
    considered = passed[:CONTINUOUS_TESTS] if continuous else passed
    return sum(considered) / len(considered), passed


# ---- the registered scorer -------------------------------------------------------------------

@register_reward(*CODE_SOURCES)
def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  continuous: bool | None = None, settings: CodeRewardSettings | None = None) -> dict[str, Any]:
    """Registered code reward (module docstring): ``{"score", "acc"}``. `settings`: the
    sandbox limits, or a SandboxFusion client (default: `DEFAULT_SETTINGS`); `continuous`
    (default: the settings') as in verl."""
    settings = settings or DEFAULT_SETTINGS
    continuous = settings.continuous if continuous is None else bool(continuous)
    if settings.sandbox_fusion is not None:
        score, passed = score_with_sandbox_fusion(solution_str, ground_truth, settings.sandbox_fusion, continuous)
    else:
        score, passed = score_in_sandbox(solution_str, ground_truth, continuous, settings.limits)
    return {"score": float(score), "acc": float(bool(passed) and all(passed))}
