"""Rule rewards against verl's ``reward_score``.

Expected values are hand-computed from verl's code (``verl/utils/reward_score``):
``default_compute_score``'s dispatch, ``math_dapo.normalize_final_answer``,
``geo3k.compute_score``, ``prime_math.compute_score`` and ``search_r1_like_qa_em``.
Where rljax deliberately differs from verl the test says so and what verl gives.
"""

import logging

import pytest

from rljax.rewards import compute_score, get_reward_fn, math_equal, normalize_math_answer

# ---- math_dapo: verl's answer-line normalisation ----------------------------------------

# (response, ground truth): verl's normalize_final_answer makes both sides equal -> +1.
DAPO_RIGHT = [
    ("Answer: 34 dollars", "34"),
    ("Answer: 34dollars", "34"),  # verl deletes spaces before the unit words
    ("Answer: 90 degrees", "90"),
    ("Answer: 12 ways", "12"),
    ("Answer: 7 points", "7"),
    ("Answer: 5 inches", "5"),
    ("Answer: 3 square units", "3"),
    ("Answer: 45 minutes", "45"),
    ("Answer: 6 cm", "6"),
    ("Answer: 1,000 students", "1000"),
    ("Answer: 12 feet", "12"),
    ("Answer: 20 cents", "20"),
    ("Answer: $34$ dollars", "34"),
    ("Answer: 12\"", "12"),  # inches mark
    ("Answer: a + b = 34", "34"),  # keep what follows the last "="
    ("Answer: m + n = 7", "7"),
    ("Answer: x = y = 9", "9"),
    (r"Answer: $a+b=\frac{1}{2}$", r"\frac{1}{2}"),
    ("Answer: The final answer is $34$", "34"),  # the first $...$ span is the answer
    (r"Answer: 2 \text{ and } 3", "2,3"),
    ("Answer: 34", "34 dollars"),  # the ground truth is normalised too
    (r"Answer: \textbf{3\sqrt{2}}", r"3\sqrt{2}"),  # text commands unwrap around braces
    (r"Answer: \text{3\sqrt{2} ways}", r"3\sqrt{2}"),
]

DAPO_WRONG = [
    ("Answer: 34 dollars", "35"),
    ("Answer: a + b = 34", "35"),
    ("Answer: 34 = a + b", "34"),  # what follows the last "=" is "a + b"
    ("Answer: The final answer is $35$", "34"),
]


@pytest.mark.parametrize("response, truth", DAPO_RIGHT)
def test_dapo_units_and_equations_score_as_verl(response, truth):
    result = compute_score("math_dapo", "Some reasoning.\n" + response, truth)
    assert result["score"] == 1.0 and result["acc"] == 1.0


@pytest.mark.parametrize("response, truth", DAPO_WRONG)
def test_dapo_wrong_answers_stay_wrong(response, truth):
    assert compute_score("math_dapo", response, truth)["score"] == -1.0


def test_dapo_unit_words_are_words():
    # verl removes "sue" from inside "Tuesday" (both sides), so "Tday" == "Tuesday" there;
    # rljax removes unit words only as words. Deliberate difference (docs/rewards.md).
    assert compute_score("math_dapo", r"Answer: \text{Tuesday}", r"\text{Tuesday}")["score"] == 1.0
    assert compute_score("math_dapo", "Answer: Tday", "Tuesday")["score"] == -1.0


# Deliberate differences: verl's result in the comment, rljax's in the assertion.
DAPO_DELIBERATE = [
    ("Answer: 2a + 3", "2a+3", 1.0),  # verl -1: its "a " substitution makes "2+3"
    ("Answer: 0.5", r"\frac{1}{2}", 1.0),  # verl -1: string equality only
    ("Answer: 34.0", "34", 1.0),  # verl -1
    ("Answer: 1,2,3", "123", -1.0),  # verl +1: commas dropped whenever only digits remain
    (r"Answer: 0.\overline{3}", "0.3", -1.0),  # verl +1: \overline{3} -> 3
    (r"Answer: \begin{pmatrix} 1 \\ -2 \end{pmatrix}", r"\begin{pmatrix}1\\-2\end{pmatrix}", 1.0),  # verl -1
    (r"so \boxed{204}", "204", 1.0),  # verl -1: no "Answer:" line (rljax falls back to the box)
    (r"Answer: \boxed{k = 5}", "5", 1.0),  # verl -1: it splits at "=" before unboxing, leaving "5}"
    ("Answer: 34.", "34", 1.0),  # verl -1: a trailing period stays
    ("Answer: $$34$$", "34", 1.0),  # verl -1: its first $...$ span is the empty one
    (r"Answer: 12\%", "12", 1.0),  # verl -1: rljax drops percent signs, as the MATH checker does
    ("Answer: an 34", "34", -1.0),  # verl +1: "an " deleted
    (r"Answer: 1, 2, 3, \ldots", "1, 2, 3", -1.0),  # verl +1: \ldots deleted
]


@pytest.mark.parametrize("response, truth, score", DAPO_DELIBERATE)
def test_dapo_deliberate_differences(response, truth, score):
    assert compute_score("math_dapo", response, truth)["score"] == score


# ---- dispatch: verl's default_compute_score names ---------------------------------------


def test_math_source_is_dapo_as_in_verl():
    # verl: data_source "math" -> math_dapo.compute_score: +-1 on the "Answer:" line.
    assert compute_score("math", "Thinking...\nAnswer: 5", "5")["score"] == 1.0
    assert compute_score("math", "Thinking...\nAnswer: 6", "5")["score"] == -1.0
    assert compute_score("math", "nothing here", "5")["score"] == -1.0
    assert get_reward_fn("math") is get_reward_fn("math_dapo")


def test_math_dapo_reasoning_is_dapo():
    assert get_reward_fn("math_dapo_reasoning") is get_reward_fn("math_dapo")
    assert compute_score("math_dapo_reasoning", "<think>...</think>\nAnswer: 204", "204")["score"] == 1.0


def test_verl_dispatch_table():
    from rljax.rewards import geo3k, gsm8k, math_boxed, math_dapo, numina, search_r1

    expected = {
        "openai/gsm8k": gsm8k,
        "lighteval/MATH": math_boxed,
        "DigitalLearningGmbH/MATH-lighteval": math_boxed,
        "HuggingFaceH4/MATH-500": math_boxed,
        "math_dapo": math_dapo,
        "math": math_dapo,
        "math_dapo_reasoning": math_dapo,
        "aime2024": math_dapo,
        "aime_2025": math_dapo,
        "numina_aops_forum": numina,
        "numina_synthetic_math": numina,
        "numina_amc_aime": numina,
        "numina_synthetic_amc": numina,
        "numina_cn_k12": numina,
        "numina_olympiads": numina,
        "hiyouga/geometry3k": geo3k,
        "searchR1_nq": search_r1,
        "searchR1_triviaqa": search_r1,
        "searchR1_popqa": search_r1,
        "searchR1_hotpotqa": search_r1,
        "searchR1_2wikimultihopqa": search_r1,
        "searchR1_musique": search_r1,
        "searchR1_bamboogle": search_r1,
    }
    for source, module in expected.items():
        assert get_reward_fn(source) is module.compute_score, source


# ---- math_normalize: the \\ row break ----------------------------------------------------


def test_row_break_survives_normalisation():
    a = r"\begin{pmatrix}1\\-2\end{pmatrix}"
    b = r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}"
    assert normalize_math_answer(a) == normalize_math_answer(b) == a
    assert math_equal(a, b)
    assert math_equal(r"\begin{pmatrix} 3 \\ 4 \end{pmatrix}", r"\begin{pmatrix}3\\4\end{pmatrix}")
    # a row break is not nothing: one entry 34 is another vector
    assert not math_equal(r"\begin{pmatrix} 3 \\ 4 \end{pmatrix}", r"\begin{pmatrix}34\end{pmatrix}")
    # the spacing commands are still spacing
    assert math_equal(r"10\ 000", "10000") and math_equal(r"1\,000", "1000")


def test_row_break_in_boxed_math_score():
    response = r"So $\boxed{\begin{pmatrix} 1 \\ -2 \end{pmatrix}}$."
    assert compute_score("HuggingFaceH4/MATH-500", response, r"\begin{pmatrix}1\\-2\end{pmatrix}")["score"] == 1.0


# ---- hiyouga/geometry3k: 0.9 * boxed accuracy + 0.1 * format ------------------------------

GEO3K = [
    (r"<think>The area is 3.</think> So the answer is \boxed{3}.", "3", 1.0),
    (r"The area is \boxed{3}.", "3", 0.9),  # right, but no <think>...</think> first
    (r"<think>hmm</think> \boxed{4}", "3", 0.1),  # wrong, well formatted
    (r"<think>hmm</think> 3", "3", 0.0),  # no box: neither accurate nor formatted
    (r"<think>a</think>\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"<think>a</think>\boxed{2\sqrt{3}}", r"2 \sqrt{3}", 1.0),
    (" <think>a</think>\\boxed{3}", "3", 0.9),  # verl's fullmatch: <think> must open the response
]


@pytest.mark.parametrize("response, truth, score", GEO3K)
def test_geometry3k(response, truth, score):
    assert compute_score("hiyouga/geometry3k", response, truth)["score"] == pytest.approx(score)


# ---- numina_*: PRIME's math checker, 1.0 / 0.0 --------------------------------------------

NUMINA = [
    (r"We find $\boxed{12}$.", "12", 1.0),
    (r"We find $\boxed{13}$.", "12", 0.0),
    ("So the answer is 12", "12", 1.0),  # no box: the text after "answer is"
    ("Final answer: 12", "12", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),  # what follows the last "="
    (r"\boxed{\dfrac{3}{4}}", r"\frac34", 1.0),
    ("no answer at all", "12", 0.0),
]


@pytest.mark.parametrize("response, truth, score", NUMINA)
@pytest.mark.parametrize("source", ["numina_olympiads", "numina_cn_k12", "numina_synthetic_math"])
def test_numina(source, response, truth, score):
    result = compute_score(source, response, truth)
    assert result["score"] == score and result["acc"] == score


# ---- searchR1_*: exact match of the last <answer>, SQuAD-normalised ----------------------

SEARCH = [
    ("<answer> The Eiffel Tower! </answer>", {"target": ["eiffel tower"]}, 1.0),
    ("<answer>Paris</answer> then <answer>London</answer>", {"target": ["London", "UK"]}, 1.0),
    ("<answer>Paris</answer>", {"target": ["London"]}, 0.0),
    ("London", {"target": ["London"]}, 0.0),  # no <answer> tag
    ("<answer>London</answer>" * 11, {"target": ["London"]}, 0.25),  # > 10 tags: a quarter
    ("<answer>an apple</answer>", {"target": "Apple"}, 1.0),
]


@pytest.mark.parametrize("response, truth, score", SEARCH)
def test_search_r1(response, truth, score):
    assert compute_score("searchR1_nq", response, truth)["score"] == score


# ---- a data source with no scorer: one loud warning ---------------------------------------


def test_unscored_data_source_warns_once(caplog):
    from rljax.rewards import has_reward_fn

    caplog.set_level(logging.WARNING, logger="rljax.rewards")
    assert all(not has_reward_fn("nobody/knows-13") for _ in range(200))
    assert all(has_reward_fn("math_dapo") for _ in range(5))
    warned = [r for r in caplog.records if "nobody/knows-13" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING
    assert "custom_reward_function" in warned[0].getMessage()
    assert not [r for r in caplog.records if "data_source 'math_dapo'" in r.getMessage()]
    # a second unknown name gets its own single warning
    caplog.clear()
    for _ in range(3):
        has_reward_fn("nobody/knows-14")
    assert len([r for r in caplog.records if "data_source 'nobody/knows-14'" in r.getMessage()]) == 1
    assert not has_reward_fn("other/unknown", warn=False) and "other/unknown" not in caplog.text
