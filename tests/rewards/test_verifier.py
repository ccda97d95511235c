import pytest

from rljax.data.tokenizer import build_char_tokenizer
from rljax.rewards import GenerativeVerifier, parse_score, parse_yes_no


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


class FakeJudge:
    """Token-in-token-out fake: answers "Yes" when the graded answer equals the reference."""

    def __init__(self, tok, reply=None):
        self.tok, self.reply, self.prompts = tok, reply, []

    def __call__(self, prompts):
        self.prompts.extend(prompts)
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            ref = text.split("Reference answer:\n")[1].split("\n")[0]
            ans = text.split("Student answer:\n")[1].split("\n")[0]
            reply = self.reply or ("<think>checking</think> Yes" if ref == ans else "No, it is wrong.")
            out.append(self.tok.encode(reply, add_special_tokens=False) + [self.tok.eos_token_id])
        return out


def test_yes_no_verdicts_are_rewards(tok):
    judge = FakeJudge(tok)
    verifier = GenerativeVerifier(judge, tok)
    batch = [
        {"solution_str": "19", "ground_truth": "19", "extra_info": {"question": "12+7="}},
        {"solution_str": "18", "ground_truth": "19", "extra_info": {"question": "12+7="}},
        {"solution_str": "cba", "ground_truth": "cba", "prompt": [{"role": "user", "content": "reverse: abc"}]},
    ]
    result = verifier(batch)
    assert result.scores.tolist() == [1.0, 0.0, 1.0]
    assert result.metrics["verifier/parse_failures"] == 0
    assert result.extras["verifier_output"][1] == "No, it is wrong."
    # The grading prompt is the chat template with a generation prompt.
    first = tok.decode(judge.prompts[0])
    assert first.startswith("<|im_start|>user\n") and first.endswith("<|im_start|>assistant\n")
    assert "Question:\n12+7=" in first and "reverse: abc" in tok.decode(judge.prompts[2])


def test_unparseable_verdict_scores_failure(tok):
    verifier = GenerativeVerifier(FakeJudge(tok, reply="maybe"), tok, failure_score=-1.0)
    result = verifier([{"solution_str": "1", "ground_truth": "1", "question": "q"}])
    assert result.scores.tolist() == [-1.0]
    assert result.metrics["verifier/parse_failures"] == 1 and 0 in result.errors


def test_score_parser_custom_template_and_system(tok):
    seen = []

    def judge(prompts):
        seen.extend(tok.decode(p) for p in prompts)
        return [tok.encode("Score: 0.75", add_special_tokens=False) for _ in prompts]

    verifier = GenerativeVerifier(judge, tok, "Grade {answer} for {question}.", parse_score, system_prompt="Be strict.")
    scores, verdicts, failed = verifier.verify(["q1"], ["a1"])
    assert scores.tolist() == [0.75] and failed == [False]
    assert seen[0].startswith("<|im_start|>system\nBe strict.") and "Grade a1 for q1." in seen[0]
    with pytest.raises(ValueError, match="unknown field"):
        GenerativeVerifier(judge, tok, "Grade {response}")


def test_parsers():
    assert parse_yes_no("Yes") == 1.0 and parse_yes_no("no.") == 0.0
    assert parse_yes_no("<think>yes yes</think> Final: No") == 0.0
    assert parse_yes_no("Nope") is None and parse_yes_no("yesterday") is None
    assert parse_score("Score: 0.2 ... actually Score: 1") == 1.0
    assert parse_score("I give it 0.4") == 0.4
    assert parse_score("Score: 7") is None and parse_score("none") is None


def test_generator_output_count_is_checked(tok):
    verifier = GenerativeVerifier(lambda prompts: [], tok)
    with pytest.raises(ValueError, match="0 outputs for 1"):
        verifier.verify(["q"], ["a"])
