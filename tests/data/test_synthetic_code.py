"""The synthetic code task: specs, tests in verl's format, and its reward through the sandbox."""

from __future__ import annotations

import json
import random

import pytest

from rljax.data import synthetic_code
from rljax.data.synthetic_spec import materialize

# (family, k, stdin, expected stdout), worked out by hand from each spec's wording
HAND_CASES = [
    ("add", 7, "-3", "4"),
    ("multiply", 4, "12", "48"),
    ("square", 0, "-9", "81"),
    ("parity", 0, "-7", "odd"),
    ("parity", 0, "0", "even"),
    ("sum_two", 0, "-5 12", "7"),
    ("max_two", 0, "-5 -12", "-5"),
    ("sum_list", 0, "3 -4 10", "9"),
    ("count_list", 5, "5 6 -1 9", "2"),
    ("reverse", 0, "abcz", "zcba"),
    ("upper", 0, "fox", "FOX"),
    ("length", 0, "abcdef", "6"),
    ("repeat", 3, "ab", "ababab"),
]


@pytest.mark.parametrize("family,k,stdin,stdout", HAND_CASES)
def test_expected_outputs_follow_the_spec(family, k, stdin, stdout):
    assert synthetic_code.SPECS[family].answer(k, stdin) == stdout


def test_every_family_has_a_hand_case():
    assert {case[0] for case in HAND_CASES} == set(synthetic_code.SPECS)


def test_rows_are_deterministic_and_carry_distinct_tests():
    rows = synthetic_code.make_rows("rl", 60, seed=3, num_tests=4)
    assert rows == synthetic_code.make_rows("rl", 60, seed=3, num_tests=4)
    assert rows != synthetic_code.make_rows("rl", 60, seed=4, num_tests=4)
    for row in rows:
        assert row["data_source"] == "synthetic/code" and row["ability"] == "code"
        tests = json.loads(row["reward_model"]["ground_truth"])
        assert len(tests["inputs"]) == len(set(tests["inputs"])) == len(tests["outputs"]) == 4
        assert row["prompt"][-1]["content"].startswith(row["extra_info"]["spec"])
    assert {r["extra_info"]["family"] for r in rows} == set(synthetic_code.SPECS)


def test_sft_rows_answer_with_the_reference_solution_in_a_python_block():
    rl = synthetic_code.make_rows("rl", 5, seed=1, families="add,reverse")
    sft = synthetic_code.make_rows("sft", 5, seed=1, families="add,reverse")
    for row in sft:
        user, assistant = row["messages"]
        assert assistant["content"].startswith("```python\n") and assistant["content"].endswith("\n```")
    assert {r["extra_info"]["family"] for r in rl} <= {"add", "reverse"}


def test_bad_knobs_are_named():
    with pytest.raises(ValueError, match="unknown code task families \\['nope'\\]"):
        synthetic_code.make_rows("rl", 1, families="add,nope")
    with pytest.raises(ValueError, match="num_tests must be at least 1"):
        synthetic_code.make_rows("rl", 1, num_tests=0)
    with pytest.raises(ValueError, match="format 'preference' is not available"):
        synthetic_code.make_rows("preference", 1)
    with pytest.raises(ValueError, match=r"only \{spec\} may be named"):
        synthetic_code.make_rows("rl", 1, template="{question}")


def test_a_spec_path_takes_a_template_that_is_not_yaml(tmp_path):
    spec = "synthetic:code/rl?n=3&seed=0&num_tests=2&template={spec} Code only."
    (path,) = materialize([spec], str(tmp_path))
    rows = [json.loads(line) for line in open(path)]
    assert len(rows) == 3
    assert all(r["prompt"][0]["content"] == r["extra_info"]["spec"] + " Code only." for r in rows)
    assert all(len(json.loads(r["reward_model"]["ground_truth"])["inputs"]) == 2 for r in rows)


@pytest.mark.slow  # one sandboxed run per family: ~3 s
def test_reference_solutions_pass_and_a_prompting_program_fails_in_the_sandbox():
    import rljax.rewards.builtins  # noqa: F401 - registers the scorers
    from rljax.rewards.registry import default_compute_score

    rows = synthetic_code.make_rows("rl", 200, seed=5)
    one_per_family = {r["extra_info"]["family"]: r for r in rows}
    assert set(one_per_family) == set(synthetic_code.SPECS)
    for row in one_per_family.values():
        truth = row["reward_model"]["ground_truth"]
        answer = f"Sure.\n```python\n{row['extra_info']['solution']}\n```\nDone."
        assert default_compute_score("synthetic/code", answer, truth) == {"score": 1.0, "acc": 1.0}
    # The form a small instruct model writes first: a prompt string on stdout fails every test.
    add = one_per_family["add"]
    k = int(add["extra_info"]["spec"].rsplit("+", 1)[1].strip(" ."))
    prompting = f"```python\nn = int(input('Enter a number: '))\nprint(n + {k})\n```"
    assert default_compute_score("synthetic/code", prompting, add["reward_model"]["ground_truth"])["score"] == 0.0
    # Right on some tests only: the share that pass (verl's continuous score).
    parity = one_per_family["parity"]
    tests = json.loads(parity["reward_model"]["ground_truth"])
    always_even = "```python\ninput()\nprint('even')\n```"
    share = sum(out == "even" for out in tests["outputs"]) / len(tests["outputs"])
    got = default_compute_score("synthetic/code", always_even, parity["reward_model"]["ground_truth"])
    assert got["score"] == pytest.approx(share if share < 1 else 1.0)
    assert got["acc"] == float(share == 1.0)


def test_drawn_inputs_stay_in_their_ranges():
    rng = random.Random(0)
    for _ in range(200):
        p = synthetic_code.code_problem(rng, tuple(synthetic_code.SPECS), 3)
        for x in p["tests"]["inputs"]:
            if p["family"] in ("add", "multiply", "square", "parity"):
                assert -50 <= int(x) <= 99
            elif p["family"] in ("reverse", "upper", "length", "repeat"):
                assert x.isalpha() and x.islower() and 3 <= len(x) <= 9
