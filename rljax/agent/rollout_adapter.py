"""Adapter from `rljax.rollout.Sampler` to the agent's `AsyncSampler` protocol.

The rollout sampler's ``generate_async(GenerationRequest)`` returns a *list* of completions
(one per sample, ``n`` of them) and takes its own `SamplingParams`. The agent loop asks for
one continuation per request, so this adapter converts the request (a params ``dict`` becomes
``SamplingParams(**dict)``; a `SamplingParams` passes through; ``n`` must be 1) and returns
the single completion as the agent's `TurnOutput` (with its routing record, `expert_ids`,
when the sampler recorded one). `rljax.rollout` is imported lazily, so the
agent package does not depend on it (or on JAX) at import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rljax.agent.protocol import TurnOutput, TurnRequest


class RolloutSamplerAdapter:
    """Wraps a sampler whose ``generate_async`` takes a ``GenerationRequest`` and returns a list."""

    def __init__(self, sampler: Any):
        self.sampler = sampler

    async def generate_async(self, request: TurnRequest) -> TurnOutput:
        from rljax.rollout.params import GenerationRequest, SamplingParams

        params: Any = request.sampling_params
        if params is None or isinstance(params, Mapping):
            params = SamplingParams(**dict(params or {}))
        if getattr(params, "n", 1) != 1:
            raise ValueError("the agent loop samples one continuation per request (n must be 1)")
        out = await self.sampler.generate_async(
            GenerationRequest(list(request.prompt_token_ids), params)
        )
        if isinstance(out, (list, tuple)):
            if len(out) != 1:
                raise ValueError(f"expected one completion, got {len(out)}")
            out = out[0]
        return TurnOutput(list(out.token_ids), [float(x) for x in out.log_probs], str(out.finish_reason),
                          getattr(out, "expert_ids", None))
