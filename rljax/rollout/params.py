"""What a caller asks the sampler for (`SamplingParams`, `GenerationRequest`), what it
gets back (`Completion`), and a request in flight taken out of the sampler and put back
in (`PartialRequest`, `PartialSample`). Token ids only: strings never enter the sampler."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample the continuations of one prompt.

    n: number of independent samples of the prompt (they share the prompt's KV pages).
    temperature: logits are divided by it before sampling; 0 means greedy (argmax).
    top_k: keep the k most likely tokens (0 or -1: all).
    top_p: keep the smallest set of most likely tokens whose probability mass reaches
        top_p (1.0: all). Applied after top_k, on the top_k-renormalised distribution.
    min_p: drop tokens whose probability is below min_p times the most likely one's (0: off).
    max_tokens: the most tokens to generate; a sample that reaches it ends with
        finish_reason "length" (so does one that reaches the sampler's max_model_len).
    stop_token_ids: extra tokens that end a sample (finish_reason "stop"). The model's
        EOS ids (from its config) stop too unless `ignore_eos`. The stop token is kept
        as the last token of the completion (it is a token the policy produced).
    seed: makes the request reproducible: sample i draws the token at absolute position
        p from a key derived from (seed, stream, i, p) only (`rljax.rollout.sampling`), so
        it gets the same tokens whatever else is in the batch, after being preempted and
        recomputed, and on whichever replica runs it. None: a seed is drawn from the
        sampler's own generator.
    stream: the request's id among the seed's random streams, an integer in [0, 2**64):
        requests that share a seed must have distinct streams to draw independent noise
        (the RL loop numbers them by (step, prompt); see `rljax.rl.scoring`).
        `Sampler.generate` gives its prompts consecutive streams starting at this one.
        An agent episode keeps one stream for all its turns: a later turn samples at
        later positions, so it continues the stream instead of repeating it.

    Logprobs: every completion carries, per generated token, log_softmax(logits /
    temperature)[token] computed on the full vocabulary BEFORE top-k / top-p / min-p
    filtering, which is how the trainer computes the policy's log_prob of that token at
    the same temperature. At temperature 0 (greedy) the unscaled log_softmax(logits) is
    reported.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    stream: int = 0

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.stream < 2**64:
            raise ValueError(f"stream must be in [0, 2**64), got {self.stream}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (`from_json` inverts)."""
        return {**dataclasses.asdict(self), "stop_token_ids": list(self.stop_token_ids)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SamplingParams:
        return cls(**{**d, "stop_token_ids": tuple(d["stop_token_ids"])})


@dataclass
class PartialSample:
    """One sample of a request in flight: what it generated so far.

    token_ids / log_probs / policy_versions: one entry per generated token (the log-prob
    as in `Completion`; the version: the `Engine.version` of the step that sampled it);
    empty for a sample not started yet. finish_reason: None while the sample runs, else
    as in `Completion` (the sample is done and is delivered as it is). The experts a
    mixture-of-experts model routed to are not kept: a resumed unfinished sample records
    them again on its recompute, a finished one comes back with `expert_ids` None.
    """

    sample_index: int
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    def __post_init__(self):
        if not len(self.token_ids) == len(self.log_probs) == len(self.policy_versions):
            raise ValueError(f"sample {self.sample_index}: token_ids, log_probs and policy_versions differ in "
                             f"length ({len(self.token_ids)}, {len(self.log_probs)}, {len(self.policy_versions)})")
        if self.finish_reason is not None and not self.token_ids:
            raise ValueError(f"sample {self.sample_index}: finished with no tokens")


@dataclass
class PartialRequest:
    """A request not yet delivered, as `Engine.unfinished()` reports it and as
    `Engine.add_request(..., resume=...)` continues it: its prompt, its sampling params
    (with the seed the engine drew when the caller gave none, so that a resumed sample
    draws the same noise; None only for a request that never reached an engine) and all
    n samples in sample-index order. `to_json()` gives plain JSON types (log-probs as
    Python floats, which hold float32 values exactly); `from_json` inverts it."""

    request_id: int | str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    samples: list[PartialSample]

    def __post_init__(self):
        if [s.sample_index for s in self.samples] != list(range(self.sampling_params.n)):
            raise ValueError(f"request {self.request_id!r}: samples must be 0 .. n-1 = "
                             f"{self.sampling_params.n - 1} in order, got {[s.sample_index for s in self.samples]}")

    def to_json(self) -> dict[str, Any]:
        params = self.sampling_params.to_json()
        return {
            "request_id": self.request_id,
            "prompt_token_ids": [int(t) for t in self.prompt_token_ids],
            "sampling_params": params,
            "samples": [{"sample_index": s.sample_index, "token_ids": [int(t) for t in s.token_ids],
                         "log_probs": [float(x) for x in s.log_probs],
                         "policy_versions": [int(v) for v in s.policy_versions],
                         "finish_reason": s.finish_reason} for s in self.samples],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PartialRequest:
        return cls(
            request_id=d["request_id"],
            prompt_token_ids=list(d["prompt_token_ids"]),
            sampling_params=SamplingParams.from_json(d["sampling_params"]),
            samples=[PartialSample(s["sample_index"], list(s["token_ids"]), list(s["log_probs"]),
                                   list(s["policy_versions"]), s["finish_reason"]) for s in d["samples"]],
        )

    @property
    def num_generated(self) -> int:
        """Tokens generated so far over all samples."""
        return sum(len(s.token_ids) for s in self.samples)


@dataclass
class GenerationRequest:
    """One prompt (token ids) and how to sample it; `request_id` comes back on every
    completion (the sampler numbers requests that have none). `resume`: continue this
    request from a `PartialRequest` (see `Engine.add_request`)."""

    prompt_token_ids: Sequence[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    request_id: int | str | None = None
    resume: PartialRequest | None = None


@dataclass
class Completion:
    """One sample of one request.

    request_index: the prompt's index in `Sampler.generate`, or the request's id for
        `generate_async`.
    sample_index: which of the request's n samples this is (0 .. n-1).
    token_ids: the generated tokens (a stop token, when one ended the sample, included).
    log_probs: per generated token, log_softmax(logits / temperature) of that token
        before any top-k / top-p / min-p filtering (see `SamplingParams`).
    finish_reason: "stop" (a stop / EOS token) or "length" (max_tokens or max_model_len).
    expert_ids: with `SamplerConfig.record_routing` on a mixture-of-experts model, the
        experts every token of prompt + response was routed to in each layer, `[P + R, L,
        k]` int32 (row t: the token at position t, the order the trainer sees them); -1
        for the last token, which the sampler samples but never feeds back (its routing
        affects no log-prob of the completion). None otherwise (and for a sample that was
        already finished in the `PartialRequest` it was resumed from).
    policy_versions: per generated token, the `Engine.version` of the step that sampled
        it (the engine always fills it; None only for completions built elsewhere).
    """

    request_index: int | str
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    expert_ids: np.ndarray | None = None
    policy_versions: list[int] | None = None
