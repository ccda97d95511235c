"""Rollout: a native-JAX sampler with a paged KV cache and continuous batching.

`Sampler(model, SamplerConfig(...))` takes token ids and returns `Completion`s (token
ids, per-token log_probs, finish reason), synchronously (`generate`) or to many
concurrent asyncio callers (`generate_async`), and takes the trainer's parameters with
`update_params`. Module map: params.py (requests / results), config.py, buckets.py
(compiled sizes), pages.py (page allocator + tables, host), prefix_cache.py,
scheduler.py (admission, pages, preemption: host code, no JAX), kv_cache.py (the device
pool), attention.py (paged attention: references, Pallas and TPU kernels), sampling.py
(temperature / top-k / top-p / min-p), step_inputs.py (typed, padded call inputs),
forward.py (the paged forward), device_step.py (parameters + pool + compiled
programs), engine.py (scheduler + device step), sampler.py (public API, engine thread).
"""

from rljax.rollout.config import KVCacheConfig, SamplerConfig
from rljax.rollout.engine import Engine, EngineStats
from rljax.rollout.pages import OutOfPagesError, PageAllocator, PageTable
from rljax.rollout.params import Completion, GenerationRequest, PartialRequest, PartialSample, SamplingParams
from rljax.rollout.sampler import Sampler

__all__ = [
    "Completion",
    "Engine",
    "EngineStats",
    "GenerationRequest",
    "KVCacheConfig",
    "OutOfPagesError",
    "PageAllocator",
    "PageTable",
    "PartialRequest",
    "PartialSample",
    "Sampler",
    "SamplerConfig",
    "SamplingParams",
]
