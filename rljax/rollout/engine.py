"""The rollout engine: a host `Scheduler` and a `DeviceStep`, composed.

Single-threaded and synchronous: `add_request` queues a prompt, `step` asks the
scheduler for the next call (`rljax.rollout.scheduler`: admission, pages, preemption,
prefix sharing and caching), has the device step run it (`rljax.rollout.device_step`:
typed inputs, compiled programs, parameters and KV pool) and hands the results back to
the scheduler; a request's `on_done` callback receives its completions when its last
sample finishes. `rljax.rollout.sampler.Sampler` wraps it in a thread with a sync and
an asyncio API.

Partial rollouts: `version` is recorded with every sampled token (`Completion.
policy_versions`) and set by `update_params(..., version=v)`; `recompute=True` there
sends every running sequence back to recompute prompt + tokens so far under the new
parameters (same keys, remaining budget). `unfinished()` reports the requests not yet
delivered as JSON-able `PartialRequest`s, and `add_request(..., resume=partial)`
continues one, on this engine or another with the same parameters, drawing the tokens
an uninterrupted run would have drawn.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from flax import nnx

from rljax.models.transformer import Decoder
from rljax.rollout.config import SamplerConfig
from rljax.rollout.device_step import DeviceStep
from rljax.rollout.kv_cache import CacheShape
from rljax.rollout.params import Completion, PartialRequest, SamplingParams
from rljax.rollout.prefix_cache import PrefixCache
from rljax.rollout.scheduler import Request, Scheduler, SchedulerStats

DoneCallback = Callable[[list[Completion]], None]


@dataclass
class EngineStats(SchedulerStats):
    """The scheduler's counters (`SchedulerStats`) plus what the device side and the pool
    add: cached and total pages, compiled programs and their shapes."""

    num_cached_pages: int = 0  # pages the prefix cache holds now
    decode_wait_s: float = 0.0  # wall time of the calls that left decode-ready sequences waiting
    num_compiled_programs: int = 0  # jit cache entries of the step functions
    programs_compiled: int = 0  # backend compiles of the step functions on this engine's devices
    programs_loaded: int = 0  # step programs loaded from another same-shaped engine's compile
    programs_cached: int = 0  # step programs read from jax's persistent compilation cache
    compile_s: float = 0.0  # seconds spent in those compiles
    program_load_s: float = 0.0  # seconds spent in those loads and reads
    num_pages: int = 0
    page_size: int = 0
    compiled_shapes: list[str] = field(default_factory=list)  # each traced [rows x tokens, W=width]

    def as_dict(self) -> dict:
        return asdict(self)


class Engine:
    """Paged-KV continuous-batching generation for one `Decoder` on one replica."""

    def __init__(self, model: Decoder, config: SamplerConfig):
        self.config = config
        self.device = DeviceStep.for_model(model, config)
        self.scheduler = Scheduler(config, self.device.pool.shape.num_pages, frozenset(model.config.eos_token_ids),
                                   model.config.vocab_size)
        self._on_done: dict[Request, DoneCallback] = {}
        self._decode_wait_s = 0.0

    # ---- requests ----------------------------------------------------------------------

    def add_request(self, request_id: int | str, prompt: list[int], params: SamplingParams,
                    on_done: DoneCallback, resume: PartialRequest | None = None) -> Request:
        """Queue a prompt; `on_done(completions)` is called with its n completions
        (ordered by sample index) once all of them finish. Returns a handle for
        `abort_request`. Raises ValueError for a prompt the engine cannot hold.

        `resume`: continue the request from a `PartialRequest` of the same prompt and
        params (as `unfinished()` reports it; `params.seed` None takes its seed). Its
        finished samples are delivered unchanged; each unfinished one recomputes prompt +
        its tokens so far and continues with the same random keys and the budget that
        remains (`max_tokens` counts the tokens it has). The completions hold the whole
        token lists, log-probs and versions, old and new. A resume whose samples are all
        finished is delivered by the next `step`."""
        request = self.scheduler.add_request(request_id, prompt, params, resume=resume)
        self._on_done[request] = on_done
        return request

    def abort_request(self, handle: Request) -> None:
        """Drop a request's unfinished sequences and free their pages (its callback is
        not called)."""
        self.scheduler.abort_request(handle)
        self._on_done.pop(handle, None)

    def abort_all(self) -> list[Request]:
        """Drop every sequence and free its pages; returns the unfinished requests."""
        self._on_done.clear()
        return self.scheduler.abort_all()

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> None:
        """Run the scheduler's next call, if any, and deliver finished requests."""
        plan = self.scheduler.schedule()
        if plan is None:
            finished = self.scheduler.pop_finished()
        else:
            start = time.perf_counter()
            result = self.device.run(plan)
            if plan.num_waiting_decodes:
                self._decode_wait_s += time.perf_counter() - start
            finished = self.scheduler.apply(plan, result.tokens, result.log_probs, result.experts)
        for request in finished:
            self._on_done.pop(request)(list(request.completions))  # type: ignore[arg-type]

    def unfinished(self) -> list[PartialRequest]:
        """Every request not yet delivered (waiting or running), in arrival order, with
        every sample's tokens, log-probs and versions so far and the seed it runs with;
        JSON-able (`PartialRequest.to_json`). Changes nothing."""
        return self.scheduler.unfinished()

    @property
    def version(self) -> int:
        """The policy version recorded with every token sampled from now on (0 at first)."""
        return self.scheduler.version

    @version.setter
    def version(self, value: int) -> None:
        self.scheduler.version = int(value)

    # ---- parameters, cache, memory -----------------------------------------------------

    def update_params(self, state: nnx.State, copy: bool = False, version: int | None = None,
                      recompute: bool = False) -> None:
        """Use new parameters from the next step on (`DeviceStep.update_params`); the
        prefix cache's keys / values came from the old ones and are dropped. `version`
        (when given) becomes `self.version`, recorded with the tokens sampled from the
        next step on. `recompute`: every running sequence gives up its pages and
        recomputes prompt + tokens so far under the new parameters at its next step,
        then continues (same keys, the budget that remains; its earlier tokens keep their
        log-probs and versions). Without it a running sequence continues over keys /
        values cached by the old parameters."""
        self.device.update_params(state, copy=copy)
        if version is not None:
            self.version = version
        if recompute:
            self.scheduler.recompute_running()
        self.scheduler.clear_prefix_cache()

    def reset_cache(self) -> None:
        """A fresh pool (after a failed step that may have consumed the donated one)."""
        self.device.pool.reset()
        self.scheduler.clear_prefix_cache()

    def set_prefix_caching(self, enabled: bool) -> None:
        """Switch automatic prefix caching on or off between requests (off drops the cache)."""
        self.scheduler.set_prefix_caching(enabled)

    def reset_peak_memory(self) -> None:
        self.scheduler.reset_peak_memory()

    # Read by the benches (`rljax.bench.sampler`, `rljax.bench.agent`).
    @property
    def state(self) -> nnx.State:
        return self.device.state

    @property
    def cache_shape(self) -> CacheShape:
        return self.device.pool.shape

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self.scheduler.prefix_cache

    @property
    def share_prefix(self) -> bool:
        """The n samples of a request share its prompt's pages (may be switched between requests)."""
        return self.scheduler.share_prefix

    @share_prefix.setter
    def share_prefix(self, value: bool) -> None:
        self.scheduler.share_prefix = value

    # ---- introspection -----------------------------------------------------------------

    @property
    def num_compiled_programs(self) -> int:
        return self.device.num_compiled_programs

    def stats_dict(self) -> dict:
        s = self.scheduler
        stats = EngineStats(
            **asdict(s.stats),
            num_cached_pages=s.num_cached_pages,
            decode_wait_s=self._decode_wait_s,
            num_compiled_programs=self.num_compiled_programs,
            **self.device.compile_counts.as_dict(),
            num_pages=self.cache_shape.num_pages,
            page_size=self.cache_shape.page_size,
            compiled_shapes=list(self.device.compiled_shapes),
        )
        return {**stats.as_dict(), "pages_used": s.pages_used, "num_waiting": len(s.waiting),
                "num_running": len(s.running)}
