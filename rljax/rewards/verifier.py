"""A generative verifier: a second model grades each answer; its verdict is the reward.

As in self-verification / LLM-as-judge recipes: for every sample the `prompt_template` is
filled with the question, the response and (optionally) the reference answer, rendered
with the verifier tokenizer's chat template (generation prompt added), and sent to
`generate_fn` — any token-in-token-out generator, ``list[list[int]] -> list[list[int]]``
(e.g. the rljax sampler with greedy sampling). The decoded output is parsed by `parse_fn`
into a score (``"Yes"`` -> 1.0, ``"No"`` -> 0.0 with `parse_yes_no`; a number in [0, 1]
with `parse_score`); an unparseable verdict scores `failure_score` and is counted in
``verifier/parse_failures``.

The question of a batch item is ``item["question"]``, else ``extra_info["question"]``
(what `rljax.data.synthetic` writes), else the last user message of ``item["prompt"]``.
"""

from __future__ import annotations

import re
import string
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rljax.rewards.result import RewardResult

GenerateFn = Callable[[list[list[int]]], list[list[int]]]
ParseFn = Callable[[str], "float | None"]

DEFAULT_TEMPLATE = (
    "You are grading an answer to a question.\n\n"
    "Question:\n{question}\n\n"
    "Reference answer:\n{ground_truth}\n\n"
    "Student answer:\n{answer}\n\n"
    "Is the student answer correct? Reply with Yes or No."
)
TEMPLATE_FIELDS = frozenset({"question", "answer", "ground_truth"})

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_SCORE = re.compile(r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_yes_no(text: str) -> float | None:
    """1.0 / 0.0 for the last standalone "yes" / "no" (any case) outside ``<think>``."""
    words = _YES_NO.findall(_THINK.sub(" ", text))
    if not words:
        return None
    return 1.0 if words[-1].lower() == "yes" else 0.0


def parse_score(text: str) -> float | None:
    """The last ``Score: x`` (else the last number) outside ``<think>``, if in [0, 1]."""
    text = _THINK.sub(" ", text)
    found = _SCORE.findall(text) or _NUMBER.findall(text)
    if not found:
        return None
    value = float(found[-1])
    return value if 0.0 <= value <= 1.0 else None


def _question_of(item: Mapping[str, Any]) -> str:
    if item.get("question") is not None:
        return str(item["question"])
    extra = item.get("extra_info") or {}
    if isinstance(extra, Mapping) and extra.get("question") is not None:
        return str(extra["question"])
    prompt = item.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return str(users[-1])
    raise ValueError("verifier: a batch item needs 'question', extra_info['question'] or a chat 'prompt'")


class GenerativeVerifier:
    """``verifier(batch) -> RewardResult`` (see the module docstring).

    `prompt_template`: a ``str.format`` template over ``{question}``, ``{answer}``,
    ``{ground_truth}`` (write literal braces as ``{{ }}``), or a callable
    ``(question, answer, ground_truth) -> str`` giving the user message.
    """

    def __init__(
        self,
        generate_fn: GenerateFn,
        tokenizer: Any,
        prompt_template: str | Callable[[str, str, Any], str] = DEFAULT_TEMPLATE,
        parse_fn: ParseFn = parse_yes_no,
        *,
        system_prompt: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        failure_score: float = 0.0,
    ):
        if isinstance(prompt_template, str):
            fields = {f for _, f, _, _ in string.Formatter().parse(prompt_template) if f is not None}
            unknown = fields - TEMPLATE_FIELDS
            if unknown:
                raise ValueError(
                    f"verifier prompt_template: unknown field(s) {sorted(unknown)}; use {sorted(TEMPLATE_FIELDS)} "
                    "and write literal braces as {{ }}"
                )
        from rljax.data.chat import ChatRenderer

        self.generate_fn = generate_fn
        self.tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer, chat_template_kwargs)
        self.prompt_template = prompt_template
        self.parse_fn = parse_fn
        self.system_prompt = system_prompt
        self.failure_score = float(failure_score)

    def grading_message(self, question: str, answer: str, ground_truth: Any = None) -> str:
        if callable(self.prompt_template):
            return str(self.prompt_template(question, answer, ground_truth))
        truth = "" if ground_truth is None else str(ground_truth)
        return self.prompt_template.format(question=question, answer=answer, ground_truth=truth)

    def grading_prompt(self, question: str, answer: str, ground_truth: Any = None) -> list[int]:
        """Token ids of the grading prompt (chat template, generation prompt added)."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": self.grading_message(question, answer, ground_truth)})
        return self.renderer.render_prompt(messages)

    def verify(self, questions: Sequence[str], answers: Sequence[str], ground_truths: Sequence[Any] | None = None):
        """(scores float32 [N], decoded verdicts, parse-failure flags)."""
        if len(questions) != len(answers) or (ground_truths is not None and len(ground_truths) != len(answers)):
            raise ValueError("verifier: questions, answers and ground_truths differ in length")
        truths = list(ground_truths) if ground_truths is not None else [None] * len(answers)
        prompts = [self.grading_prompt(q, a, t) for q, a, t in zip(questions, answers, truths)]
        outputs = self.generate_fn(prompts) if prompts else []
        if len(outputs) != len(prompts):
            raise ValueError(f"verifier: generate_fn returned {len(outputs)} outputs for {len(prompts)} prompts")
        verdicts = [self.tokenizer.decode(list(o), skip_special_tokens=True) for o in outputs]
        parsed = [self.parse_fn(v) for v in verdicts]
        failed = [p is None for p in parsed]
        scores = np.array([self.failure_score if p is None else float(p) for p in parsed], dtype=np.float32)
        return scores, verdicts, failed

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> RewardResult:
        """Score RewardManager-style items (``solution_str``, ``ground_truth``, question)."""
        questions = [_question_of(item) for item in batch]
        answers = [str(item["solution_str"]) for item in batch]
        truths = [item.get("ground_truth") for item in batch]
        scores, verdicts, failed = self.verify(questions, answers, truths)
        metrics = {
            "verifier/parse_failures": float(sum(failed)),
            "verifier/score/mean": float(scores.mean()) if len(scores) else 0.0,
        }
        errors = {i: f"unparseable verdict: {verdicts[i][:200]!r}" for i, f in enumerate(failed) if f}
        return RewardResult(scores, {"verifier_output": verdicts}, metrics, errors)
