"""A synthetic tool-use task: arithmetic that needs the calculator (no downloads).

Task ``"tool_arithmetic"``: multiply (by default) two numbers of `min_digits`..`max_digits`
digits, ``"347*82="`` -> ``"28454"``. A tiny model cannot do this in its head; it can learn
to call the ``calculator`` tool (`rljax.agent.tools.CalculatorTool`) and copy the result.
The data is plain rows: the answer is the expression's integer value
(`rljax.data.synthetic.integer_value`, what the calculator returns for it), so this module
imports nothing from `rljax.agent`, which sits above data.

Row formats (what `rljax.data.make_dataset` reads; every row carries the ``tools`` column
(unless ``tools=false``),
the calculator's function schema `CALCULATOR_SCHEMA`, so a rendered prompt is exactly the
prompt the agent loop renders with ``configs/tools/calculator.yaml``):

* sft: a tool-use demonstration, the conversation the agent loop produces::

      user       "347*82="
      assistant  tool_calls=[calculator(expression="347*82")]   (content "")
      tool       "28454"                                       (name "calculator")
      assistant  "28454"

  The tool message holds exactly what the calculator returns. With ``tool_fraction < 1``
  that fraction of rows are demonstrations and the others answer directly
  (``[user, assistant "28454"]``): a cold start that calls the tool only sometimes, so RL
  has a decision to learn (the quickstart's setting).
* rl (verl): ``{"data_source": "synthetic/tool_arithmetic", "prompt": [user],
  "ability": "math", "reward_model": {"style": "rule", "ground_truth": answer},
  "extra_info": {"split", "index", "question", "expression", "answer"}, "tools": [schema]}``;
  the reward (`rljax.rewards.synthetic_tools`) is exact match of the final answer.

Knobs: ``min_digits`` / ``max_digits`` (per operand, default 2 / 3), ``operators`` (any of
``"+-*"``, default ``"*"``), ``num_operands`` (default 2), ``tool_fraction`` (sft only,
default 1.0), ``tools`` (default true; false: rows have no ``tools`` column, for agents whose
chat template does not show tool schemas, like the CPU quickstart's), ``system`` (an
optional system prompt; with tools the chat template merges it into the tools block).
Deterministic in ``seed``; all text is in the char tokenizer's alphabet.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from rljax.data.synthetic import integer_value

TASKS: tuple[str, ...] = ("tool_arithmetic",)
DATA_SOURCE = "synthetic/tool_arithmetic"
TOOL_NAME = "calculator"

# The calculator's schema as the model sees it, kept short (no description: the char
# tokenizer spends a token per character, and every prompt renders it).
# `configs/tools/calculator.yaml` declares the same schema.
CALCULATOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def tool_problem(
    rng: random.Random,
    min_digits: int = 2,
    max_digits: int = 3,
    operators: str = "*",
    num_operands: int = 2,
) -> tuple[str, str, str]:
    """One problem: (question ``"347*82="``, expression ``"347*82"``, answer ``"28454"``).

    The answer is the expression's integer value, what the calculator tool returns for it
    (negative results are redrawn).
    """
    if not 1 <= min_digits <= max_digits or num_operands < 2 or not operators or set(operators) - set("+-*"):
        raise ValueError(
            f"bad tool_arithmetic knobs: min_digits={min_digits}, max_digits={max_digits}, "
            f"operators={operators!r}, num_operands={num_operands}"
        )
    for _ in range(1000):
        operands = []
        for _ in range(num_operands):
            d = rng.randint(min_digits, max_digits)
            operands.append(rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1))
        ops = [rng.choice(operators) for _ in range(num_operands - 1)]
        expression = "".join(f"{a}{op}" for a, op in zip(operands, ops)) + str(operands[-1])
        value = integer_value(operands, ops)
        if value >= 0:
            break
    return expression + "=", expression, str(value)


def tool_call_message(expression: str, content: str = "") -> dict[str, Any]:
    """The assistant turn that calls the calculator (OpenAI ``tool_calls`` format)."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": expression}}}],
    }


def demonstration(question: str, expression: str, answer: str, system: str | None = None) -> list[dict[str, Any]]:
    """The messages of one tool-use demonstration (see the module docstring)."""
    head = [{"role": "system", "content": system}] if system else []
    return head + [
        {"role": "user", "content": question},
        tool_call_message(expression),
        {"role": "tool", "name": TOOL_NAME, "content": answer},
        {"role": "assistant", "content": answer},
    ]


def make_rows(
    format: str,
    n: int,
    seed: int = 0,
    task: str = "tool_arithmetic",
    system: str | None = None,
    split: str = "train",
    tool_fraction: float = 1.0,
    tools: bool = True,
    **knobs: Any,
) -> list[dict[str, Any]]:
    """`n` rows of `format` ("sft" | "rl") for the tool task (see the module docstring)."""
    if task not in TASKS:
        raise ValueError(f"unknown synthetic tool task {task!r}; expected one of {TASKS}")
    if not 0.0 <= float(tool_fraction) <= 1.0:
        raise ValueError(f"tool_fraction must be in [0, 1], got {tool_fraction}")
    if format not in ("sft", "rl"):
        raise ValueError(f"format {format!r} is not available for {task}; expected sft or rl")
    rng = random.Random(f"{task}:{format}:{seed}")
    rows: list[dict[str, Any]] = []
    for i in range(n):
        question, expression, answer = tool_problem(rng, **knobs)
        columns = {"tools": [copy.deepcopy(CALCULATOR_SCHEMA)]} if tools else {}
        if format == "sft":
            if rng.random() < tool_fraction:
                messages = demonstration(question, expression, answer, system)
            else:
                head = [{"role": "system", "content": system}] if system else []
                messages = head + [{"role": "user", "content": question},
                                   {"role": "assistant", "content": answer}]
            rows.append({"messages": messages, **columns})
        else:
            prompt = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": question}]
            rows.append({
                "data_source": DATA_SOURCE,
                "prompt": prompt,
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": i, "question": question,
                               "expression": expression, "answer": answer},
                **columns,
            })
    return rows
