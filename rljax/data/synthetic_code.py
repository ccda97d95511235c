"""A synthetic code task: write a small stdin/stdout program from a spec (no downloads).

Task ``"code"``: each row asks for a Python program that reads its input from standard
input and prints one answer, e.g. *"Write a Python program that reads an integer n from
standard input and prints n + 7."* The spec families (`SPECS`) cover integer arithmetic
with a drawn constant, two integers on one line, a list of integers, and string
operations on one word. Each row carries `num_tests` test cases drawn with it (default 5),
in verl's code format, so it is scored like verl's ``codecontests`` rows: the program runs
in rljax's OS sandbox and the score is 1.0 when every test passes, else the share of tests
that pass (`rljax.rewards.code`, data source ``synthetic/code``).

Row formats (what `rljax.data.make_dataset` reads):

* sft: ``{"messages": [user spec, assistant reference solution in a ```python block]}``;
* rl (verl): ``{"data_source": "synthetic/code", "prompt": [user], "ability": "code",
  "reward_model": {"style": "rule", "ground_truth": JSON text of {"inputs": [stdin, ...],
  "outputs": [stdout, ...]}}, "extra_info": {"split", "index", "spec", "solution"}}``.

Knobs: ``families`` (a comma-separated subset of `SPECS`, default all), ``num_tests``
(default 5), ``system`` (an optional system prompt) and ``template`` (the user message, a
format string of ``{spec}``; default `DEFAULT_TEMPLATE`). Deterministic in ``seed``.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any, Callable

TASKS: tuple[str, ...] = ("code",)
DATA_SOURCE = "synthetic/code"
DEFAULT_TEMPLATE = "{spec}"


@dataclass(frozen=True)
class Spec:
    """One spec family: its text, a reference solution and an input drawer, each of a
    constant `k` drawn per row; `answer` maps an input line to the expected output."""

    text: Callable[[int], str]
    solution: Callable[[int], str]
    draw_k: Callable[[random.Random], int]
    draw_input: Callable[[random.Random], str]
    answer: Callable[[int, str], str]


def _int(rng: random.Random) -> str:
    return str(rng.randint(-50, 99))


def _two(rng: random.Random) -> str:
    return f"{rng.randint(-50, 99)} {rng.randint(-50, 99)}"


def _ints(rng: random.Random) -> str:
    return " ".join(str(rng.randint(-20, 50)) for _ in range(rng.randint(1, 6)))


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase[:6] + "xyz") for _ in range(rng.randint(3, 9)))


def _no_k(rng: random.Random) -> int:
    return 0


def _small_k(rng: random.Random) -> int:
    return rng.randint(2, 9)


_READ_INT = "reads an integer n from standard input and prints"
_READ_TWO = "reads two integers a and b, on one line separated by a space, from standard input and prints"
_READ_LIST = "reads integers separated by spaces, on one line, from standard input and prints"
_READ_WORD = "reads a word from standard input and prints"

SPECS: dict[str, Spec] = {
    "add": Spec(lambda k: f"{_READ_INT} n + {k}.", lambda k: f"n = int(input())\nprint(n + {k})",
                _small_k, _int, lambda k, x: str(int(x) + k)),
    "multiply": Spec(lambda k: f"{_READ_INT} n * {k}.", lambda k: f"n = int(input())\nprint(n * {k})",
                     _small_k, _int, lambda k, x: str(int(x) * k)),
    "square": Spec(lambda k: f"{_READ_INT} the square of n.", lambda k: "n = int(input())\nprint(n * n)",
                   _no_k, _int, lambda k, x: str(int(x) ** 2)),
    "parity": Spec(lambda k: f"{_READ_INT} even if n is even and odd otherwise.",
                   lambda k: "n = int(input())\nprint('even' if n % 2 == 0 else 'odd')",
                   _no_k, _int, lambda k, x: "even" if int(x) % 2 == 0 else "odd"),
    "sum_two": Spec(lambda k: f"{_READ_TWO} a + b.", lambda k: "a, b = map(int, input().split())\nprint(a + b)",
                    _no_k, _two, lambda k, x: str(sum(map(int, x.split())))),
    "max_two": Spec(lambda k: f"{_READ_TWO} the larger of the two.",
                    lambda k: "a, b = map(int, input().split())\nprint(max(a, b))",
                    _no_k, _two, lambda k, x: str(max(map(int, x.split())))),
    "sum_list": Spec(lambda k: f"{_READ_LIST} their sum.",
                     lambda k: "print(sum(map(int, input().split())))",
                     _no_k, _ints, lambda k, x: str(sum(map(int, x.split())))),
    "count_list": Spec(lambda k: f"{_READ_LIST} how many of them are greater than {k}.",
                       lambda k: f"print(sum(1 for x in map(int, input().split()) if x > {k}))",
                       _small_k, _ints, lambda k, x: str(sum(1 for v in map(int, x.split()) if v > k))),
    "reverse": Spec(lambda k: f"{_READ_WORD} it reversed.", lambda k: "print(input()[::-1])",
                    _no_k, _word, lambda k, x: x[::-1]),
    "upper": Spec(lambda k: f"{_READ_WORD} it in upper case.", lambda k: "print(input().upper())",
                  _no_k, _word, lambda k, x: x.upper()),
    "length": Spec(lambda k: f"{_READ_WORD} its number of letters.", lambda k: "print(len(input()))",
                   _no_k, _word, lambda k, x: str(len(x))),
    "repeat": Spec(lambda k: f"{_READ_WORD} it {k} times, joined with no spaces.",
                   lambda k: f"print(input() * {k})", _small_k, _word, lambda k, x: x * k),
}


def code_problem(rng: random.Random, families: tuple[str, ...], num_tests: int) -> dict[str, Any]:
    """One problem: its spec text, reference solution and `num_tests` distinct tests."""
    name = rng.choice(families)
    spec = SPECS[name]
    k = spec.draw_k(rng)
    inputs: list[str] = []
    for _ in range(50 * num_tests):
        x = spec.draw_input(rng)
        if x not in inputs:
            inputs.append(x)
        if len(inputs) == num_tests:
            break
    return {
        "family": name,
        "spec": f"Write a Python program that {spec.text(k)}",
        "solution": spec.solution(k),
        "tests": {"inputs": inputs, "outputs": [spec.answer(k, x) for x in inputs]},
    }


def _families(families: str | None) -> tuple[str, ...]:
    names = tuple(SPECS) if not families else tuple(f.strip() for f in str(families).split(",") if f.strip())
    unknown = [f for f in names if f not in SPECS]
    if unknown or not names:
        raise ValueError(f"unknown code task families {unknown}; expected a comma-separated subset of {list(SPECS)}")
    return names


def make_rows(
    format: str,
    n: int,
    seed: int = 0,
    task: str = "code",
    system: str | None = None,
    split: str = "train",
    template: str = DEFAULT_TEMPLATE,
    families: str | None = None,
    num_tests: int = 5,
) -> list[dict[str, Any]]:
    """`n` rows of `format` ("sft" | "rl") for the code task (see the module docstring)."""
    if task not in TASKS:
        raise ValueError(f"unknown synthetic code task {task!r}; expected one of {TASKS}")
    if format not in ("sft", "rl"):
        raise ValueError(f"format {format!r} is not available for {task}; expected sft or rl")
    if int(num_tests) < 1:
        raise ValueError(f"num_tests must be at least 1, got {num_tests}")
    try:
        template.format(spec="")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"bad template {template!r}: only {{spec}} may be named ({err})") from None
    names = _families(families)
    rng = random.Random(f"{task}:{format}:{seed}")
    head = [{"role": "system", "content": system}] if system else []
    rows: list[dict[str, Any]] = []
    for i in range(n):
        p = code_problem(rng, names, int(num_tests))
        prompt = head + [{"role": "user", "content": template.format(spec=p["spec"])}]
        if format == "sft":
            answer = f"```python\n{p['solution']}\n```"
            rows.append({"messages": prompt + [{"role": "assistant", "content": answer}]})
        else:
            rows.append({
                "data_source": DATA_SOURCE,
                "prompt": prompt,
                "ability": "code",
                "reward_model": {"style": "rule", "ground_truth": json.dumps(p["tests"])},
                "extra_info": {"split": split, "index": i, "family": p["family"], "spec": p["spec"],
                               "solution": p["solution"]},
            })
    return rows
