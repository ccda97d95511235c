"""The random stream of every request an RL run sends to the sampler
(`SamplingParams.stream`): a function of (purpose, step, index) only, so a request draws
the same noise on any replica, after preemption and after a resume."""

from __future__ import annotations

TRAIN, VALIDATION = 0, 1  # the purposes a run samples for


def request_stream(purpose: int, step: int, index: int) -> int:
    """The 64-bit stream of one request: the purpose in bit 63, the RL step in bits 32-62,
    the request's index within the step in bits 0-31. Unique within a run and computed
    from data every process has."""
    if not (0 <= step < 2**31 and 0 <= index < 2**32):
        raise ValueError(f"request stream out of range: step {step}, index {index}")
    return (purpose << 63) | (step << 32) | index
