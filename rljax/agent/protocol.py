"""The one interface between the agent loop and a sampler.

The agent loop talks to the sampler only through `AsyncSampler.generate_async`, one request
per assistant turn, with token ids in and token ids out. A sampler with continuous batching
(`rljax.rollout`) serves many such requests at once; the agent loop keeps hundreds of them in
flight because every episode awaits its own request.

Conventions (the real sampler adapts to these; field names are part of the contract):

- `TurnRequest.prompt_token_ids` is the episode's whole token buffer so far (prompt plus
  every sampled and observation token), never a re-rendered chat.
- `TurnRequest.sampling_params` is passed through opaquely. The loop only sets
  `max_tokens` (to the per-turn budget; the caller's value is replaced) and reads
  `stop_token_ids`; it works with a `dict` or with any object with those attributes (a
  dataclass is copied with `dataclasses.replace`; the caller's object is never mutated).
- `TurnOutput.token_ids` are the sampled ids *including* the stop token when generation
  stopped on one (`finish_reason == "stop"`), exactly as sampled; `TurnOutput.log_probs[i]` is
  the sampling-time log_prob of `token_ids[i]` (same length).
- `finish_reason` is `"stop"` (a stop token was sampled) or `"length"` (hit `max_tokens`).
- `TurnOutput.expert_ids` (optional; mixture-of-experts samplers recording routing for
  `actor.router_replay`): the experts every token of prompt + sampled tokens was routed to
  per layer, `[len(prompt_token_ids) + len(token_ids), L, k]`, -1 where not computed; the
  loop stitches the turns' records into the trajectory's (`rljax.agent.trajectory`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

FINISH_REASONS = ("stop", "length")


@dataclass
class TurnRequest:
    """One generation request: the full token buffer and opaque sampling parameters."""

    prompt_token_ids: list[int]
    sampling_params: Any = field(default_factory=dict)


@dataclass
class TurnOutput:
    """What the sampler returns for one request (see module docstring for conventions)."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    expert_ids: Any = None  # [P + R, L, k] int32 routing record, or None (see module docstring)

    def validate(self, max_tokens: int | None = None) -> None:
        validate_completion(self, max_tokens)


@runtime_checkable
class AsyncSampler(Protocol):
    """Anything with an awaitable `generate_async(request) -> TurnOutput`."""

    async def generate_async(self, request: TurnRequest) -> TurnOutput: ...


def get_param(params: Any, name: str, default: Any = None) -> Any:
    """Read `name` from opaque sampling params (a mapping or an object)."""
    if params is None:
        return default
    if isinstance(params, Mapping):
        return params.get(name, default)
    return getattr(params, name, default)


def with_max_tokens(params: Any, max_tokens: int) -> Any:
    """A copy of opaque sampling params with `max_tokens` set; the input is not mutated."""
    if params is None:
        return {"max_tokens": max_tokens}
    if isinstance(params, Mapping):
        out = dict(params)
        out["max_tokens"] = max_tokens
        return out
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        return dataclasses.replace(params, max_tokens=max_tokens)
    out = copy.copy(params)
    setattr(out, "max_tokens", max_tokens)
    return out


def validate_completion(completion: Any, max_tokens: int | None = None) -> None:
    """Raise `ValueError` when a completion breaks the protocol.

    Duck-typed: works on any object with ``token_ids``, ``log_probs`` and ``finish_reason``.
    """
    n_tok, n_lp = len(completion.token_ids), len(completion.log_probs)
    if n_tok != n_lp:
        raise ValueError(f"TurnOutput has {n_tok} token_ids but {n_lp} log_probs")
    if completion.finish_reason not in FINISH_REASONS:
        raise ValueError(
            f"TurnOutput.finish_reason must be one of {FINISH_REASONS}, got {completion.finish_reason!r}"
        )
    if max_tokens is not None and n_tok > max_tokens:
        raise ValueError(f"sampler returned {n_tok} tokens for max_tokens={max_tokens}")
