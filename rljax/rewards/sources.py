"""Reward sources and the combiner that turns them into one score per sample.

A reward source scores a `RewardBatch` (the samples of a rollout) and returns a
`RewardResult`: float32 scores, per-sample extras, batch metrics and per-sample errors.
The sources:

    FunctionSource     a `RewardManager`: the rule-based scorers by ``data_source``
                       (the registry) or a custom reward function, contained in worker
                       processes (`rljax.rewards.manager`)
    RewardModelSource  a reward model's scalar score of each sample's tokens
    VerifierSource     a generative verifier's parsed verdict on each final answer

`RewardSources` applies the configured sources in order, each folded into the running
score by its `Combine` (``replace``: ``weight * score``; ``add``: ``running + weight *
score``; the running score starts at 0). Every source's scores and the running score must
be finite in float32, the dtype rewards are trained in: otherwise `score` raises
`NonFiniteRewardError` naming the source and the sample, before anything trains on it.

Each source names the metrics it emits and their reduction (`reductions`, fnmatch
patterns); the combiner checks every emitted metric against that declaration and against
`rljax.metrics.reduction_of`, so a metric whose reduction is undeclared or different is
an error where it is produced, not a wrong number after several rollouts are combined.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

import numpy as np

from rljax.metrics import Reduction, reduction_of
from rljax.rewards.manager import NonFiniteRewardError, describe_reward_fn, describe_sample
from rljax.rewards.registry import has_reward_fn
from rljax.rewards.result import RewardResult, collect_extras
from rljax.rewards.verifier import GenerativeVerifier


@dataclass(frozen=True)
class RewardBatch:
    """The samples a rollout scores, as each source needs them.

    `items`: RewardManager items (``data_source``, ``solution_str`` (the decoded final
    answer), ``ground_truth``, ``extra_info``, and ``uid``, the sample's prompt group).
    `sequences`: per sample the exact ``prompt + response`` token ids that are trained on.
    `prompts`: per sample the chat messages of its prompt (None when the data has none)."""

    items: Sequence[Mapping[str, Any]]
    sequences: Sequence[Sequence[int]]
    prompts: Sequence[Any] | None = None

    def __len__(self) -> int:
        return len(self.items)


class RewardSource(Protocol):
    """What `RewardSources` combines. `name`: what messages call it; `reductions`: fnmatch
    pattern -> reduction of every metric it emits (`rljax.metrics`)."""

    name: str
    reductions: Mapping[str, Reduction]

    def score(self, batch: RewardBatch) -> RewardResult: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Combine:
    """How a source's scores enter the running score (`reward.reward_model.combine` /
    `weight`, `reward.verifier.combine` / `weight`)."""

    mode: Literal["replace", "add"] = "replace"  # weight * score | running + weight * score
    weight: float = 1.0

    def __call__(self, running: np.ndarray, scores: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # an overflow to inf is the combiner's error to report
            if self.mode == "replace":
                return (self.weight * scores).astype(np.float32)
            if self.mode == "add":
                return (running + self.weight * scores).astype(np.float32)
        raise ValueError(f"combine must be 'replace' or 'add', got {self.mode!r}")


class FunctionSource:
    """A `RewardManager`'s scores (registry or custom function). `zero_where_no_rule`: a
    sample whose ``data_source`` has no registered function (and no custom function
    applies) scores 0 with no extras instead of failing the batch; said once per name
    (`has_reward_fn`). For a rule combined with model sources."""

    reductions = {"reward/errors": "sum", "reward/timeouts": "sum", "reward/*/mean": "mean"}

    def __init__(self, manager, zero_where_no_rule: bool = False):
        self.manager = manager
        self.zero_where_no_rule = zero_where_no_rule
        described = describe_reward_fn(manager.fn)
        self.name = described if getattr(manager, "uses_registry", False) else f"reward function {described}"

    def with_manager(self, manager) -> "FunctionSource":
        """The same source scoring through `manager` (e.g. a proxy that calls on another thread)."""
        return FunctionSource(manager, self.zero_where_no_rule)

    def score(self, batch: RewardBatch) -> RewardResult:
        items = batch.items
        if not self.zero_where_no_rule:
            return self.manager.score(items)
        if getattr(self.manager, "uses_registry", False):
            # a data source with no rule scores 0 here: `has_reward_fn` says so once, loudly
            applies = [i for i, item in enumerate(items) if has_reward_fn(item["data_source"])]
        else:
            applies = list(range(len(items)))
        if len(applies) == len(items):
            return self.manager.score(items)
        scores = np.zeros(len(items), np.float32)
        per_sample: list[dict[str, Any] | None] = [None] * len(items)
        metrics: dict[str, float] = {}
        errors: dict[int, str] = {}
        if applies:
            sub = self.manager.score([items[i] for i in applies])
            scores[applies] = sub.scores
            for k, i in enumerate(applies):
                per_sample[i] = {key: values[k] for key, values in sub.extras.items()}
            metrics = dict(sub.metrics)
            errors = {applies[k]: message for k, message in sub.errors.items()}
        return RewardResult(scores, collect_extras(per_sample, len(items)), metrics, errors)

    def close(self) -> None:
        self.manager.close()


class RewardModelSource:
    """A reward model's score of each sample. `scorer` (`RewardModelScorer`): token ids in,
    float32 scores out; `reuses_ids`: score the policy's token ids as they are (same
    vocabulary), else re-render each chat (prompt messages + the decoded response) with
    `scorer.score_messages`. Extra ``reward_model_score``; metrics
    ``reward_model/score/{mean,max,min}``."""

    name = "reward model (reward.reward_model)"
    reductions = {"reward_model/score/mean": "mean", "reward_model/score/max": "max",
                  "reward_model/score/min": "min"}

    def __init__(self, scorer, reuses_ids: bool = True):
        self.scorer, self.reuses_ids = scorer, reuses_ids

    def score(self, batch: RewardBatch) -> RewardResult:
        if self.reuses_ids:
            rm = np.asarray(self.scorer.score([list(s) for s in batch.sequences]), np.float32)
        else:
            if batch.prompts is None:
                raise ValueError("reward model with its own tokenizer: the batch has no raw_prompt to re-render")
            chats = [list(raw) + [{"role": "assistant", "content": item["solution_str"]}]
                     for raw, item in zip(batch.prompts, batch.items)]
            rm = np.asarray(self.scorer.score_messages(chats), np.float32)
        metrics = {}
        if rm.size:
            metrics = {"reward_model/score/mean": float(rm.mean()), "reward_model/score/max": float(rm.max()),
                       "reward_model/score/min": float(rm.min())}
        return RewardResult(rm, {"reward_model_score": [float(v) for v in rm]}, metrics)

    def close(self) -> None:
        pass


class VerifierSource:
    """A `GenerativeVerifier`'s verdict on each sample (graded with its prompt messages,
    when the batch has them). `before_verify` runs before each verification rollout (the
    self-verifier loads the current policy weights there); `closers` release its sampler.
    Extras ``verifier_score``, ``verifier_output``; metrics ``verifier/parse_failures``,
    ``verifier/score/mean``; an unparseable verdict is an error ``verifier: ...``."""

    name = "generative verifier (reward.verifier)"
    reductions = {"verifier/parse_failures": "sum", "verifier/score/mean": "mean"}

    def __init__(self, verifier: GenerativeVerifier, before_verify: Callable[[], None] | None = None,
                 closers: Sequence[Callable[[], None]] = ()):
        self.verifier, self.before_verify = verifier, before_verify
        self._closers = list(closers)

    def score(self, batch: RewardBatch) -> RewardResult:
        if self.before_verify is not None:
            self.before_verify()
        prompts = batch.prompts if batch.prompts is not None else [None] * len(batch)
        graded = [dict(item) if batch.prompts is None else {**item, "prompt": raw}
                  for item, raw in zip(batch.items, prompts)]
        verdict = self.verifier(graded)
        extras = {"verifier_score": [float(v) for v in verdict.scores],
                  "verifier_output": list(verdict.extras["verifier_output"])}
        errors = {i: f"verifier: {message}" for i, message in verdict.errors.items()}
        return RewardResult(np.asarray(verdict.scores, np.float32), extras, dict(verdict.metrics), errors)

    def close(self) -> None:
        for close in self._closers:
            close()
        self._closers = []


class RewardSources:
    """The combiner (module docstring): `score(batch)` applies `steps` ((source, Combine)
    pairs) in order and returns the combined `RewardResult`: the running scores, every
    source's extras and metrics (in order), and per sample the first source's error."""

    def __init__(self, steps: Sequence[tuple[RewardSource, Combine]]):
        if not steps:
            raise ValueError("RewardSources: no reward source")
        self.steps = list(steps)

    @property
    def sources(self) -> list[RewardSource]:
        return [source for source, _ in self.steps]

    def with_function_managers(self, wrap: Callable[[Any], Any]) -> "RewardSources":
        """The same sources, every `FunctionSource` scoring through `wrap(its manager)`."""
        return RewardSources([(source.with_manager(wrap(source.manager)) if isinstance(source, FunctionSource)
                               else source, how) for source, how in self.steps])

    def split(self, k: int) -> tuple["RewardSources", "RewardSources | None"]:
        """The first `k` steps and the rest (None when nothing is left), sharing the sources:
        scoring a batch with the first, then with the rest from the first's running score
        (`score(batch, running=)`), gives what scoring it with all of them gives."""
        return RewardSources(self.steps[:k]), (RewardSources(self.steps[k:]) if self.steps[k:] else None)

    def score(self, batch: RewardBatch, running: np.ndarray | None = None) -> RewardResult:
        """`running`: the score so far (an earlier part's, `split`); None starts at 0."""
        first = running is None
        running = np.zeros(len(batch), np.float32) if first else np.asarray(running, np.float32)
        extras: dict[str, list[Any]] = {}
        metrics: dict[str, float] = {}
        errors: dict[int, str] = {}
        for k, (source, how) in enumerate(self.steps):
            result = source.score(batch)
            scores = np.asarray(result.scores, np.float32)
            if scores.shape != (len(batch),):
                raise ValueError(f"{source.name} returned scores of shape {scores.shape} for {len(batch)} samples")
            check_finite(scores, batch, source.name)
            check_reductions(source, result.metrics)
            # the first source's scores are the running score as they are (bit for bit)
            running = scores if first and k == 0 and how == Combine() else how(running, scores)
            check_finite(running, batch, f"the combined reward (after {source.name}, {how.mode} x {how.weight:g})")
            extras.update(result.extras)
            metrics.update(result.metrics)
            for i, message in result.errors.items():
                errors.setdefault(i, message)
        return RewardResult(running, extras, metrics, errors)

    def close(self) -> None:
        """Close every source, even if one fails (the first error is raised)."""
        first = None
        for source in self.sources:
            try:
                source.close()
            except BaseException as e:  # noqa: PERF203
                first = first or e
        if first is not None:
            raise first


def check_finite(scores: np.ndarray, batch: RewardBatch, what: str) -> None:
    """`NonFiniteRewardError` naming `what` and the first sample whose score is not finite."""
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        i = int(bad[0])
        raise NonFiniteRewardError(
            f"{what} gave {float(scores[i])!r} for {describe_sample(batch.items[i], i, len(batch))} "
            f"({bad.size} non-finite of {len(batch)}): a reward must be finite in float32, the dtype it is trained in")


def check_reductions(source: RewardSource, metrics: Mapping[str, float]) -> None:
    """Every metric `source` emitted is declared by it, with the reduction
    `rljax.metrics` gives its name."""
    for name in metrics:
        declared = next((r for pattern, r in source.reductions.items() if fnmatch.fnmatchcase(name, pattern)), None)
        if declared is None:
            raise KeyError(f"{source.name} emitted metric {name!r}, which it does not declare in its reductions")
        if reduction_of(name) != declared:
            raise ValueError(f"{source.name} declares metric {name!r} as {declared!r}, rljax.metrics reduces it "
                             f"as {reduction_of(name)!r}")


__all__ = ["Combine", "FunctionSource", "RewardBatch", "RewardModelSource", "RewardSource", "RewardSources",
           "VerifierSource", "check_finite", "check_reductions"]
