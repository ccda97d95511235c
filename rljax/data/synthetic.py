"""Synthetic tasks written as SFT, preference and verl-RL files (no downloads).

Tasks (`task=`):

* ``"arithmetic"`` — ``"12+7="`` -> ``"19"``. Knobs: ``digits`` (max digits per operand,
  default 2), ``operators`` (any of ``"+-*"``, default ``"+-"``), ``num_operands``
  (default 2), ``allow_negative`` (default False: problems with a negative result are
  redrawn). Usual precedence (``*`` first).
* ``"reverse"`` — ``"reverse: abc"`` -> ``"cba"``; ``"uppercase"`` — ``"uppercase: abc"`` ->
  ``"ABC"``; ``"string"`` — either, at random. Knobs: ``min_len`` / ``max_len`` of the
  lower-case word (default 3 / 8).

Row knobs of every task: ``system`` (a system prompt), ``template`` (the user message, a
format string of ``{question}``, and of ``{expression}`` — the question without its
trailing ``=`` —, e.g. ``"What is {expression}? Answer with the number only."``; default
the bare question) and, for rl rows, ``grading``: ``"exact"`` (default; the stripped
response must equal the answer) or ``"last_number"`` (the last number in the response must
equal it, as GSM8K's flexible rule reads numbers: `rljax.rewards.synthetic`).

Row formats (what `rljax.data.make_dataset` reads):

* sft: ``{"messages": [user question, assistant answer]}`` (optional ``system`` prompt);
* preference: ``{"prompt": [user], "chosen": [assistant right answer],
  "rejected": [assistant wrong answer]}``;
* rl (verl): ``{"data_source": "synthetic/<task>", "prompt": [user], "ability": ...,
  "reward_model": {"style": "rule", "ground_truth": answer},
  "extra_info": {"split", "index", "question", "answer"}}`` (and ``"grading"`` when not
  exact).

Everything is deterministic in ``seed``. All text uses only characters of the char
tokenizer's alphabet (`rljax.data.tokenizer.CHAR_ALPHABET`).
"""

from __future__ import annotations

import json
import os
import random
import string
from typing import Any, Callable

TASKS: tuple[str, ...] = ("arithmetic", "reverse", "uppercase", "string")
DATA_SOURCES: dict[str, str] = {
    "arithmetic": "synthetic/arithmetic",
    "reverse": "synthetic/reverse",
    "uppercase": "synthetic/uppercase",
}


def integer_value(operands: list[int], ops: list[str]) -> int:
    """Value of ``operands[0] ops[0] operands[1] ...`` with ``*`` before ``+``/``-``
    (Python's precedence; equal precedence groups left to right)."""
    terms: list[int] = [operands[0]]
    signs: list[int] = [1]
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


def arithmetic_problem(
    rng: random.Random,
    digits: int = 2,
    operators: str = "+-",
    num_operands: int = 2,
    allow_negative: bool = False,
) -> tuple[str, str, str]:
    """One problem: (question like ``"12+7="``, answer like ``"19"``, task name)."""
    if digits < 1 or num_operands < 2 or not operators or set(operators) - set("+-*"):
        raise ValueError(
            f"bad arithmetic knobs: digits={digits}, operators={operators!r}, "
            f"num_operands={num_operands}"
        )
    for _ in range(1000):
        operands = [rng.randint(0, 10**digits - 1) for _ in range(num_operands)]
        ops = [rng.choice(operators) for _ in range(num_operands - 1)]
        value = integer_value(operands, ops)
        if allow_negative or value >= 0:
            break
    question = "".join(f"{a}{op}" for a, op in zip(operands, ops)) + f"{operands[-1]}="
    return question, str(value), "arithmetic"


def string_problem(
    rng: random.Random, op: str | None = None, min_len: int = 3, max_len: int = 8
) -> tuple[str, str, str]:
    """One problem: (``"reverse: abc"``, ``"cba"``, ``"reverse"``) or the uppercase kind."""
    op = op or rng.choice(("reverse", "uppercase"))
    if op not in ("reverse", "uppercase") or not 1 <= min_len <= max_len:
        raise ValueError(f"bad string task knobs: op={op!r}, min_len={min_len}, max_len={max_len}")
    word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(min_len, max_len)))
    answer = word[::-1] if op == "reverse" else word.upper()
    return f"{op}: {word}", answer, op


def make_problem(rng: random.Random, task: str, **knobs: Any) -> tuple[str, str, str]:
    """(question, answer, task name) for `task` (see the module docstring)."""
    if task == "arithmetic":
        return arithmetic_problem(rng, **knobs)
    if task in ("reverse", "uppercase"):
        return string_problem(rng, op=task, **knobs)
    if task == "string":
        return string_problem(rng, **knobs)
    raise ValueError(f"unknown synthetic task {task!r}; expected one of {TASKS}")


def wrong_answer(rng: random.Random, answer: str, kind: str) -> str:
    """A plausible wrong answer, never equal to `answer`."""
    if kind == "arithmetic":
        delta = rng.choice([d for d in range(-10, 11) if d != 0])
        return str(int(answer) + delta)
    k = rng.randrange(len(answer))
    pool = string.ascii_uppercase if answer[k].isupper() else string.ascii_lowercase
    ch = rng.choice([c for c in pool if c != answer[k]])
    return answer[:k] + ch + answer[k + 1 :]


GRADINGS: tuple[str, ...] = ("exact", "last_number")


def _user(question: str, system: str | None, template: str) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}] if system else []
    content = template.format(question=question, expression=question.removesuffix("="))
    return msgs + [{"role": "user", "content": content}]


def make_rows(
    format: str,
    n: int,
    seed: int = 0,
    task: str = "arithmetic",
    system: str | None = None,
    split: str = "train",
    template: str = "{question}",
    grading: str = "exact",
    **knobs: Any,
) -> list[dict[str, Any]]:
    """`n` rows of `format` ("sft" | "preference" | "rl") for `task`."""
    if grading not in GRADINGS:
        raise ValueError(f"unknown grading {grading!r}; expected one of {GRADINGS}")
    try:
        template.format(question="", expression="")
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(
            f"bad template {template!r}: only {{question}} and {{expression}} may be named ({err})"
        ) from None
    rng = random.Random(f"{task}:{format}:{seed}")
    rows: list[dict[str, Any]] = []
    for i in range(n):
        question, answer, kind = make_problem(rng, task, **knobs)
        prompt = _user(question, system, template)
        if format == "sft":
            rows.append({"messages": prompt + [{"role": "assistant", "content": answer}]})
        elif format == "preference":
            rows.append({
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": answer}],
                "rejected": [{"role": "assistant", "content": wrong_answer(rng, answer, kind)}],
            })
        elif format == "rl":
            rows.append({
                "data_source": DATA_SOURCES[kind],
                "prompt": prompt,
                "ability": "math" if kind == "arithmetic" else "string",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": i, "question": question, "answer": answer}
                | ({} if grading == "exact" else {"grading": grading}),
            })
        else:
            raise ValueError(f"unknown format {format!r}; expected sft, preference or rl")
    return rows


def write_rows(rows: list[dict[str, Any]], path: str) -> str:
    """Write rows as JSON lines (``.jsonl``/``.json``) or Parquet (``.parquet``)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif path.endswith(".jsonl") or path.endswith(".json"):
        with open(path, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        raise ValueError(f"unsupported extension for {path!r}; use .jsonl, .json or .parquet")
    return path


def _writer(format: str, ext: str) -> Callable[..., str]:
    def write(path: str, n: int, seed: int = 0, task: str = "arithmetic", **kwargs: Any) -> str:
        if not path.endswith(ext):
            raise ValueError(f"expected a {ext} path, got {path!r}")
        return write_rows(make_rows(format, n, seed=seed, task=task, **kwargs), path)

    write.__name__ = f"write_{format}_{ext.lstrip('.')}"
    write.__doc__ = (
        f"Write `n` synthetic {format} rows of `task` to the {ext} file `path`; returns path.\n\n"
        "Extra keyword arguments: ``system``, ``split`` and the task knobs."
    )
    return write


write_sft_jsonl = _writer("sft", ".jsonl")
write_sft_parquet = _writer("sft", ".parquet")
write_preference_jsonl = _writer("preference", ".jsonl")
write_preference_parquet = _writer("preference", ".parquet")
write_rl_jsonl = _writer("rl", ".jsonl")
write_rl_parquet = _writer("rl", ".parquet")
