"""Synthetic arithmetic, string and tool-use tasks in their row formats."""

from __future__ import annotations

import json
import random

import pytest

from rljax.data import DataConfig, make_dataset
from rljax.data import synthetic, synthetic_tools
from rljax.data.sources import open_source


def test_arithmetic_answers_are_right():
    rng = random.Random(0)
    for _ in range(200):
        q, a, kind = synthetic.arithmetic_problem(rng, digits=3, operators="+-*", num_operands=3)
        assert q.endswith("=") and kind == "arithmetic"
        assert int(a) == eval(q[:-1])  # noqa: S307 - our own generated digits and operators
        assert int(a) >= 0
    q, a, _ = synthetic.arithmetic_problem(random.Random(1), digits=1, operators="+")
    assert len(q) == 4 and q[1] == "+"


def test_integer_value_follows_python_precedence():
    assert synthetic.integer_value([2, 3, 4, 5], ["+", "*", "-"]) == 9  # 2 + 12 - 5
    assert synthetic.integer_value([10, 3, 2], ["-", "-"]) == 5  # left to right, not 10 - (3 - 2)
    assert synthetic.integer_value([7, 6, 5], ["*", "*"]) == 210


def test_tool_arithmetic_answers_are_what_the_calculator_tool_returns():
    from rljax.agent.tools.calculator import evaluate, format_number  # the tool the agent calls

    rng = random.Random(0)
    for _ in range(300):
        question, expression, answer = synthetic_tools.tool_problem(
            rng, min_digits=1, max_digits=3, operators="+-*", num_operands=4)
        assert question == expression + "="
        assert answer == format_number(evaluate(expression)) == str(eval(expression))  # noqa: S307 - our own digits
        assert int(answer) >= 0


def test_string_answers_are_right():
    rng = random.Random(0)
    for _ in range(50):
        q, a, kind = synthetic.make_problem(rng, "string", min_len=2, max_len=5)
        op, word = q.split(": ")
        assert op == kind and 2 <= len(word) <= 5
        assert a == (word[::-1] if op == "reverse" else word.upper())


def test_wrong_answers_are_wrong():
    for task in ("arithmetic", "reverse", "uppercase"):
        for row in synthetic.make_rows("preference", 50, seed=1, task=task):
            assert row["chosen"][0]["content"] != row["rejected"][0]["content"]


@pytest.mark.parametrize("fmt", ["sft", "preference", "rl"])
def test_rows_are_deterministic_and_in_alphabet(fmt, char_tok):
    a = synthetic.make_rows(fmt, 20, seed=5, task="string")
    assert a == synthetic.make_rows(fmt, 20, seed=5, task="string")
    assert a != synthetic.make_rows(fmt, 20, seed=6, task="string")
    text = json.dumps(a)
    assert char_tok.unk_token_id not in char_tok.encode(text, add_special_tokens=False)


def test_rl_rows_are_verl_format():
    row = synthetic.make_rows("rl", 1, seed=0, task="arithmetic", digits=1)[0]
    assert row["data_source"] == "synthetic/arithmetic"
    assert row["prompt"][0]["role"] == "user"
    assert row["reward_model"] == {"style": "rule", "ground_truth": row["extra_info"]["answer"]}
    assert str(eval(row["prompt"][0]["content"][:-1])) == row["reward_model"]["ground_truth"]  # noqa: S307


def test_writers_round_trip(tmp_path, char_tok):
    for fmt in ("sft", "preference", "rl"):
        j = getattr(synthetic, f"write_{fmt}_jsonl")(str(tmp_path / f"{fmt}.jsonl"), 12, seed=2)
        p = getattr(synthetic, f"write_{fmt}_parquet")(str(tmp_path / f"{fmt}.parquet"), 12, seed=2)
        rows_j, rows_p = open_source(j), open_source(p)
        assert [r.data for r in rows_j] == [r.data for r in rows_p]
        cfg = DataConfig(train_files=[p], format=fmt, batch_size=4, max_length=64, max_prompt_length=32)
        batch = next(make_dataset(cfg, char_tok, process_index=0, process_count=1))
        assert batch
    with pytest.raises(ValueError, match="expected a .jsonl path"):
        synthetic.write_sft_jsonl(str(tmp_path / "x.parquet"), 1)
    with pytest.raises(ValueError, match="unknown synthetic task"):
        synthetic.make_rows("sft", 1, task="sorting")


def test_template_writes_the_user_message_of_every_format():
    template = "What is {expression}? Answer with the number only. ({question})"
    for fmt in ("sft", "preference", "rl"):
        plain = synthetic.make_rows(fmt, 3, seed=4, digits=2, operators="+")
        worded = synthetic.make_rows(fmt, 3, seed=4, digits=2, operators="+", template=template)
        key = "messages" if fmt == "sft" else "prompt"
        for p, w in zip(plain, worded):
            question = p[key][0]["content"]  # the bare question, e.g. "48+37="
            assert w[key][0]["content"] == f"What is {question[:-1]}? Answer with the number only. ({question})"
    with pytest.raises(ValueError, match=r"bad template 'What is \{x\}\?'"):
        synthetic.make_rows("rl", 1, template="What is {x}?")


def test_grading_is_written_into_rl_rows():
    exact = synthetic.make_rows("rl", 2, seed=0)
    assert all("grading" not in row["extra_info"] for row in exact)
    graded = synthetic.make_rows("rl", 2, seed=0, grading="last_number")
    assert [row["extra_info"]["grading"] for row in graded] == ["last_number"] * 2
    with pytest.raises(ValueError, match="unknown grading 'loose'"):
        synthetic.make_rows("rl", 1, grading="loose")


def test_spec_with_a_worded_template(tmp_path):
    from rljax.data.synthetic_spec import materialize

    spec = ("synthetic:arithmetic/rl?n=3&seed=2&digits=2&operators=%2B&grading=last_number"
            "&template=What is {expression}? Answer with the number only.")
    (path,) = materialize([spec], str(tmp_path))
    rows = [json.loads(line) for line in open(path)]
    for row in rows:
        content = row["prompt"][0]["content"]
        assert content == f"What is {row['extra_info']['question'][:-1]}? Answer with the number only."
        assert row["extra_info"]["grading"] == "last_number"
        assert "+" in content
