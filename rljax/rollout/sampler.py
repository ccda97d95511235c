"""The public sampler: token ids in, token ids + log_probs out, sync and asyncio.

One engine loop runs in a background thread and batches every pending request
together, whoever sent it: `Sampler.generate` (blocking, a list of prompts) and
`await Sampler.generate_async(request)` (one prompt; many concurrent callers, e.g. the
agent loop's episodes) feed the same queue.

    sampler = Sampler(model, SamplerConfig(max_num_seqs=64))
    completions = sampler.generate([[1, 2, 3], [4, 5]], SamplingParams(n=4, temperature=1.0, seed=0))
    result = await sampler.generate_async(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=32)))
    sampler.update_params(trainer_state)   # the trainer's arrays, no host round-trip

Partial rollouts: `update_params(state, version=v, recompute=True)` switches weights
mid-flight (running sequences recompute prompt + tokens so far under the new ones);
`unfinished()` returns the requests not yet delivered as JSON-able `PartialRequest`s and
`submit(GenerationRequest(..., resume=partial))` continues one. `Sampler(model, config,
manual=True)` never steps on its own: `step(k)` runs k engine steps, so a driver decides
exactly where submissions, weight updates and checkpoints fall.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import queue
import threading
from typing import Sequence

from flax import nnx

from rljax.models.transformer import Decoder
from rljax.rollout.config import SamplerConfig
from rljax.rollout.engine import Engine
from rljax.rollout.params import Completion, GenerationRequest, PartialRequest, PartialSample, SamplingParams

_Item = tuple[GenerationRequest | None, concurrent.futures.Future]  # None: a cancellation notice


class Sampler:
    """Generation for a `Decoder` with a paged KV cache and continuous batching.

    Thread-safe: any thread may call `generate`, `submit`, `update_params`; coroutines
    on any event loop may await `generate_async`. Cancelling a caller (its asyncio task
    or its future) drops its sequences and frees their pages. `close()` (or a `with`
    block) stops the engine thread; requests still in flight then fail with RuntimeError.

    `manual=True`: no engine thread; the engine runs only inside `step(k)`, on the
    caller's thread (so a blocking `generate` needs another thread to call `step`).
    """

    def __init__(self, model: Decoder, config: SamplerConfig | None = None, manual: bool = False):
        self.config = config or SamplerConfig()
        self.engine = Engine(model, self.config)
        self.manual = manual
        self._inbox: queue.Queue[list[_Item] | None] = queue.Queue()
        self._lock = threading.Lock()  # held while the engine steps or params change
        self._ids = itertools.count()
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._handles: dict[int, object] = {}  # future id -> engine request handle
        self._queue_lock = threading.Lock()  # guards _queued
        self._queued: dict[int, _Item] = {}  # future id -> a submitted request not yet in the engine
        self._closed = False
        self._thread: threading.Thread | None = None
        if not manual:
            self._thread = threading.Thread(target=self._loop, name="rljax-sampler", daemon=True)
            self._thread.start()

    # ---- API ---------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], sampling_params: SamplingParams | None = None
    ) -> list[Completion]:
        """Sample every prompt; returns len(prompts) * n completions ordered by (prompt
        index, sample index), `request_index` being the prompt's index. Prompt i samples
        from random stream `sampling_params.stream + i`, so identical prompts get
        independent samples."""
        params = sampling_params or SamplingParams()
        requests = [GenerationRequest(list(p), dataclasses.replace(params, stream=params.stream + i), request_id=i)
                    for i, p in enumerate(prompt_token_ids)]
        futures = self.submit_many(requests)
        return [c for f in futures for c in f.result()]

    async def generate_async(
        self, request: GenerationRequest | Sequence[int], sampling_params: SamplingParams | None = None
    ) -> list[Completion]:
        """Sample one prompt (a `GenerationRequest`, or token ids plus `sampling_params`);
        returns its n completions. Concurrent callers are batched together."""
        if not isinstance(request, GenerationRequest):
            request = GenerationRequest(list(request), sampling_params or SamplingParams())
        return await asyncio.wrap_future(self.submit(request))

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        """Queue one request; the future resolves to its completions. With
        `request.resume` (a `PartialRequest` of the same prompt and params) the request
        continues from it (`Engine.add_request`); its id defaults to the resume's."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: list[GenerationRequest]) -> list[concurrent.futures.Future]:
        """Queue requests so that they enter the engine together."""
        if self._closed:
            raise RuntimeError("the sampler is closed")
        items = []
        for r in requests:
            if r.request_id is None:
                r.request_id = r.resume.request_id if r.resume is not None else f"req-{next(self._ids)}"
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.add_done_callback(self._on_done)
            items.append((r, future))
        with self._queue_lock:
            for item in items:
                self._queued[id(item[1])] = item
        self._inbox.put(items)
        return [f for _, f in items]

    def _on_done(self, future: concurrent.futures.Future) -> None:
        if future.cancelled() and not self._closed:
            self._inbox.put([(None, future)])  # the engine thread frees its pages

    def update_params(self, params_state: nnx.State | Decoder, copy: bool = False, version: int | None = None,
                      recompute: bool = False) -> None:
        """Sample with new parameters from the next engine step on: an nnx.State of the
        same Decoder (e.g. the trainer's), or a Decoder. The arrays stay on device and
        are re-sharded / cast to the sampler's layout with `jax.device_put` when it
        differs. Pass `copy=True` when the trainer donates (and so deletes) its
        parameter buffers in its next step. `version` (when given) is recorded with every
        token sampled from then on (`Completion.policy_versions`). A sequence in flight
        continues with the new weights over keys / values cached by the old, unless
        `recompute`: then it recomputes prompt + tokens so far under the new ones first
        (`Engine.update_params`). Takes effect between two engine steps."""
        state = nnx.state(params_state) if isinstance(params_state, nnx.Module) else params_state
        with self._lock:
            self.engine.update_params(state, copy=copy, version=version, recompute=recompute)

    @property
    def version(self) -> int:
        """The policy version recorded with the tokens sampled from now on."""
        return self.engine.version

    def unfinished(self) -> list[PartialRequest]:
        """Every submitted request not yet delivered, JSON-able (`PartialRequest`): those
        in the engine (`Engine.unfinished`, with their tokens so far and the seed they
        run with), then those submitted but not yet taken in (no tokens; their own
        `resume` when they carry one), in submission order. Between two engine steps;
        changes nothing. Cancelled requests are left out."""
        with self._lock:
            cancelled = {id(self._handles[key]) for key, future in self._pending.items()
                         if future.cancelled() and key in self._handles}
            out = [partial for request, partial in self.engine.scheduler.unfinished_requests()
                   if id(request) not in cancelled]
            with self._queue_lock:
                queued = list(self._queued.values())
        for request, future in queued:
            if request is None or future.done():
                continue
            if request.resume is not None:
                out.append(dataclasses.replace(request.resume, request_id=request.request_id))
            else:
                params = request.sampling_params
                out.append(PartialRequest(request.request_id, [int(t) for t in request.prompt_token_ids], params,
                                          [PartialSample(i) for i in range(params.n)]))
        return out

    def step(self, k: int) -> int:
        """Manual mode: take in the submitted requests (in submission order) and
        cancellations, then run at most `k` engine steps (fewer when the engine runs out
        of work). Returns once they ran and every request that finished in them has its
        future resolved; returns the number of steps run. A step that raises fails the
        requests in flight (as the engine thread does) and counts as run."""
        if not self.manual:
            raise RuntimeError("step() drives a manual sampler: Sampler(model, config, manual=True)")
        if self._closed:
            raise RuntimeError("the sampler is closed")
        with self._lock:
            self._take_in(self._drain_inbox())
            ran = 0
            while ran < k and self.engine.has_work():
                ran += 1
                self._step_engine()
            return ran

    @property
    def num_compiled_programs(self) -> int:
        return self.engine.num_compiled_programs

    def stats(self) -> dict:
        """Engine counters: steps, tokens, preemptions, compiled programs, pages."""
        with self._lock:
            return self.engine.stats_dict()

    def reset_peak_memory(self) -> None:
        with self._lock:
            self.engine.reset_peak_memory()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._thread is not None:
                self._inbox.put(None)
                self._thread.join()
            else:
                with self._lock:
                    self._close_with(self._drain_inbox())

    def __enter__(self) -> "Sampler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the engine thread -------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            # Block for new work only when the engine is idle; else take what is queued.
            items = []
            block = not self.engine.has_work()
            while True:
                try:
                    got = self._inbox.get(block=block)
                except queue.Empty:
                    break
                if got is None:
                    self._close_with(items)
                    return
                items.extend(got)
                block = False
            with self._lock:
                self._take_in(items)
                if not self.engine.has_work():
                    continue
                self._step_engine()

    def _drain_inbox(self) -> list[_Item]:
        items: list[_Item] = []
        while True:
            try:
                got = self._inbox.get(block=False)
            except queue.Empty:
                return items
            if got is not None:
                items.extend(got)

    def _take_in(self, items: list[_Item]) -> None:
        for request, future in items:
            if request is None:  # a cancellation notice
                self._cancel(id(future))
            else:
                self._add(request, future)

    def _step_engine(self) -> None:
        try:
            self.engine.step()
        except Exception as e:  # noqa: BLE001 - fail the callers, keep serving
            self._fail_all(e)
            self.engine.reset_cache()

    def _close_with(self, items: list[_Item]) -> None:
        error = RuntimeError("the sampler was closed")
        for request, future in items:
            if request is not None:
                _resolve(future, error=error)
        with self._queue_lock:
            self._queued.clear()
        self._fail_all(error)

    def _add(self, request: GenerationRequest, future: concurrent.futures.Future) -> None:
        key = id(future)
        with self._queue_lock:
            self._queued.pop(key, None)
        if future.cancelled():
            return  # cancelled before it reached the engine

        def done(completions: list[Completion]) -> None:
            self._pending.pop(key, None)
            self._handles.pop(key, None)
            _resolve(future, result=completions)

        try:
            handle = self.engine.add_request(
                request.request_id, list(request.prompt_token_ids), request.sampling_params, done,
                resume=request.resume,
            )
        except Exception as e:  # noqa: BLE001 - a bad request fails alone
            _resolve(future, error=e)
            return
        self._pending[key] = future
        self._handles[key] = handle

    def _cancel(self, key: int) -> None:
        """A caller gave up (e.g. its asyncio task was cancelled): free its sequences."""
        self._pending.pop(key, None)
        handle = self._handles.pop(key, None)
        if handle is not None:
            self.engine.abort_request(handle)

    def _fail_all(self, error: Exception) -> None:
        self.engine.abort_all()
        for future in self._pending.values():
            _resolve(future, error=error)
        self._pending.clear()
        self._handles.clear()


def _resolve(future: concurrent.futures.Future, result=None, error: BaseException | None = None) -> None:
    """Complete a future unless its caller already cancelled it (a race we lose quietly)."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass
