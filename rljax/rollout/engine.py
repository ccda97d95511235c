"""The rollout engine: a scheduler over a paged KV cache and the jitted step it drives.

Single-threaded and synchronous: `add_request` queues a prompt, `step` runs one
prefill or decode step for a batch of sequences, and a request's `on_done` callback
receives its completions when its last sample finishes. `rljax.rollout.sampler.Sampler`
wraps it in a thread with a sync and an asyncio API.

Scheduling (continuous batching):
- Sequences wait in a FIFO queue and are admitted while the running set has fewer than
  `max_num_seqs` slots taken and the free pages hold the sequence's known tokens.
- Each step is a prefill step when some running sequence has more than one token to
  compute (a new prompt, or a preempted sequence being recomputed): chunks of those
  sequences, padded to `[rows bucket, chunk bucket]` within `max_num_batched_tokens`.
  Otherwise it is a decode call over every running sequence, padded to a batch bucket,
  that runs up to `num_scheduler_steps` decode steps on device (each step's token feeds
  the next); the host then appends the tokens and stops a sequence at its first stop
  token or its max_tokens (tokens computed past that point are dropped).
- A sequence that needs a page when none is free preempts the most recently admitted
  running sequence (itself, if it is the most recent): its pages are released and it
  goes back to the front of the queue with its tokens so far; on re-admission it
  recomputes them (prompt + generated) as a prefill and continues. Its random keys
  depend on (seed, stream, sample index, position) only, so it produces the same tokens
  it would have produced without the interruption.
- A finished sequence releases its pages at once; its slot goes to the next waiter
  (admission happens before every call, so within `num_scheduler_steps` tokens).

Prefix sharing: the n samples of a request share the prompt's full pages. A "prefix"
sequence (no sampling) computes the prompt's first `floor((len - 1) / page_size)` pages
and is then forked into n samples that hold references to those pages; each sample
computes the remaining 1..page_size prompt tokens into a page of its own (so the last
partial page is per-sample and nothing shared is ever written: copy-on-write realised
by recomputing at most one page of tokens, which also gives each sample the prompt's
last logits). Memory for a group grows with n responses, not n prompts.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import asdict, dataclass, field
from typing import Callable

import jax
import numpy as np
from flax import nnx

from rljax.models.transformer import Decoder
from rljax.rollout.attention import decode_attention, paged_attention_reference
from rljax.rollout.config import SamplerConfig
from rljax.rollout.forward import make_decode_fn, make_prefill_fn
from rljax.rollout.kv_cache import (
    OutOfPagesError,
    PageAllocator,
    PageTable,
    allocate_pools,
    cache_sharding,
    pages_for,
    plan_cache,
)
from rljax.rollout.params import Completion, SamplingParams
from rljax.rollout.prefix_cache import PrefixCache

DoneCallback = Callable[[list[Completion]], None]


@dataclass
class EngineStats:
    """Counters since the engine was built (`peak_pages_used` since the last reset)."""

    num_prefill_steps: int = 0
    num_decode_calls: int = 0
    num_decode_steps: int = 0
    num_prefill_tokens: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_finished_requests: int = 0
    num_cached_prompt_tokens: int = 0  # tokens a new sequence found in the prefix cache
    num_cached_pages: int = 0  # pages the prefix cache holds now
    num_compiled_programs: int = 0  # jit cache entries of the step functions
    peak_pages_used: int = 0  # includes pages the prefix cache keeps
    num_pages: int = 0
    page_size: int = 0
    compiled_shapes: list[str] = field(default_factory=list)  # each traced [rows x tokens, W=width]

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Request:
    request_id: int | str
    prompt: list[int]
    params: SamplingParams
    seed: int
    max_tokens: int
    stop_ids: frozenset[int]
    on_done: DoneCallback
    completions: list[Completion | None]
    remaining: int


class _Sequence:
    """One sample being generated (or, with `is_prefix`, a request's shared prompt prefix)."""

    def __init__(self, seq_id: int, request: _Request, sample_index: int, tokens: list[int],
                 allocator: PageAllocator, is_prefix: bool = False, slots: int = 1):
        self.seq_id = seq_id
        self.request = request
        self.sample_index = sample_index
        self.tokens = tokens
        self.prompt_len = len(request.prompt)
        self.num_computed = 0
        self.table = PageTable(allocator)
        self.logprobs: list[float] = []
        self.is_prefix = is_prefix
        self.slots = slots

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def needs_prefill(self) -> bool:
        """More than the one token a decode step computes (a prefix: any token left)."""
        left = len(self.tokens) - self.num_computed
        return left > 0 if self.is_prefix else left > 1


def _bucket(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


class Engine:
    """Paged-KV continuous-batching generation for one `Decoder`."""

    def __init__(self, model: Decoder, config: SamplerConfig):
        self.config = config
        self.model_config = model.config
        graphdef, state = nnx.split(model)
        # Commit the parameters where they are, so that the trainer's arrays placed here
        # by `update_params` hit the same compiled programs (no copy: same buffers).
        self.state = jax.tree.map(lambda a: jax.device_put(a, a.sharding), state)
        self.cache_shape = plan_cache(model.config, config, model.policy.compute)
        self.cache_sharding = cache_sharding(state, model.config.num_key_value_heads)
        self.k_cache, self.v_cache = allocate_pools(self.cache_shape, self.cache_sharding)
        self.allocator = PageAllocator(self.cache_shape.num_pages)
        self.page_size = config.kv_cache.page_size
        self.prefix_cache = PrefixCache(self.allocator, self.page_size) if config.enable_prefix_caching else None
        self.eos_ids = frozenset(model.config.eos_token_ids)
        self.stats = EngineStats(num_pages=self.cache_shape.num_pages, page_size=self.page_size)
        self._decode_buckets = config.decode_buckets()
        self._chunk_buckets = config.chunk_buckets()
        self._width_buckets = config.width_buckets()
        self._rng = np.random.default_rng(config.seed)
        self._seq_ids = itertools.count()
        self.waiting: collections.deque[_Sequence] = collections.deque()
        self.running: list[_Sequence] = []
        self._trace_kind = ""
        self._idle_steps = 0
        self.share_prefix = config.share_prefix  # may be switched between requests

        def traced(kind: str):
            def on_trace():
                self.stats.compiled_shapes.append(kind + self._trace_kind)

            return on_trace

        self._decode_steps = config.num_scheduler_steps
        attention = decode_attention(config.attention, model.config.head_dim, self.page_size)
        decode = make_decode_fn(graphdef, self.page_size, attention, self._decode_steps, traced("decode"))
        prefill = make_prefill_fn(graphdef, self.page_size, paged_attention_reference, traced("prefill"))
        self._decode_fn = jax.jit(decode, donate_argnums=(1, 2))
        self._prefill_fn = jax.jit(prefill, donate_argnums=(1, 2))

    # ---- requests ----------------------------------------------------------------------

    def add_request(self, request_id: int | str, prompt: list[int], params: SamplingParams,
                    on_done: DoneCallback) -> object:
        """Queue a prompt; `on_done(completions)` is called with its n completions
        (ordered by sample index) once all of them finish. Returns a handle for
        `abort_request`. Raises ValueError for a prompt the engine cannot hold."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= self.config.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt)} tokens leaves no room to generate within max_model_len="
                f"{self.config.max_model_len}"
            )
        vocab = self.model_config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        seed = params.seed if params.seed is not None else int(self._rng.integers(0, 2**31 - 1))
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        req = _Request(
            request_id=request_id,
            prompt=prompt,
            params=params,
            seed=seed,
            max_tokens=min(params.max_tokens, self.config.max_model_len - len(prompt)),
            stop_ids=frozenset(stop),
            on_done=on_done,
            completions=[None] * params.n,
            remaining=params.n,
        )
        shared_len = (len(prompt) - 1) // self.page_size * self.page_size
        if params.n > 1 and self.share_prefix and shared_len > 0 and params.n <= self.config.max_num_seqs:
            prefix = self._new_seq(req, -1, prompt[:shared_len], is_prefix=True, slots=params.n)
            self.waiting.append(prefix)
        else:
            for i in range(params.n):
                self.waiting.append(self._new_seq(req, i, list(prompt)))
        return req

    def set_prefix_caching(self, enabled: bool) -> None:
        """Switch automatic prefix caching on or off between requests (off drops the cache)."""
        if not enabled and self.prefix_cache is not None:
            self.prefix_cache.clear()
            self.prefix_cache = None
        elif enabled and self.prefix_cache is None:
            self.prefix_cache = PrefixCache(self.allocator, self.page_size)

    def abort_request(self, handle: object) -> None:
        """Drop a request's unfinished sequences and free their pages (its callback is
        not called)."""
        for queue in (self.running, self.waiting):
            for seq in [s for s in queue if s.request is handle]:
                if seq.table.pages:
                    seq.table.free()
                queue.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort_all(self) -> list[_Request]:
        """Drop every sequence and free its pages; returns the unfinished requests."""
        requests: dict[int, _Request] = {}
        for seq in list(self.running) + list(self.waiting):
            if seq.table.pages:
                seq.table.free()
            requests[id(seq.request)] = seq.request
        self.running.clear()
        self.waiting.clear()
        return list(requests.values())

    def reset_cache(self) -> None:
        """Fresh pools (after a failed step that may have consumed the donated ones)."""
        self.k_cache, self.v_cache = allocate_pools(self.cache_shape, self.cache_sharding)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def update_params(self, state: nnx.State, copy: bool = False) -> None:
        """Use new parameters (an nnx.State of the same Decoder) from the next step on.
        Arrays are placed with the sampler's shardings and dtypes by `jax.device_put`
        on device (no host round-trip; no copy when they already match). `copy=True`
        forces a device copy, for a trainer that donates its parameter buffers."""
        old_paths, old_tree = jax.tree_util.tree_flatten_with_path(self.state)
        new_paths, _ = jax.tree_util.tree_flatten_with_path(state)
        old_keys = [jax.tree_util.keystr(p) for p, _ in old_paths]
        new_keys = [jax.tree_util.keystr(p) for p, _ in new_paths]
        if old_keys != new_keys:  # compare names only: variable metadata may differ
            missing = sorted(set(old_keys) - set(new_keys))[:4]
            extra = sorted(set(new_keys) - set(old_keys))[:4]
            raise ValueError(f"update_params: the state does not match the sampler's model "
                             f"(missing {missing}, unexpected {extra})")
        old_leaves = [leaf for _, leaf in old_paths]
        new_leaves = [leaf for _, leaf in new_paths]
        placed = []
        for new, old in zip(new_leaves, old_leaves):
            if new.shape != old.shape:
                raise ValueError(f"update_params: shape {new.shape} where the sampler has {old.shape}")
            if new.dtype != old.dtype:
                new = new.astype(old.dtype)
            placed.append(jax.device_put(new, old.sharding, may_alias=False if copy else None))
        self.state = jax.tree.unflatten(old_tree, placed)
        if self.prefix_cache is not None:  # cached keys / values came from the old parameters
            self.prefix_cache.clear()

    # ---- one step ----------------------------------------------------------------------

    def step(self) -> None:
        """Admit waiting sequences, then run one prefill step or one decode step."""
        self._admit()
        rows = self._schedule_prefill()
        if rows:
            self._run(rows, prefill=True)
        elif decode_rows := self._schedule_decode():
            self._run(decode_rows, prefill=False)
        elif self.has_work():
            # Only a step in which every candidate preempted itself does nothing; the
            # next one re-admits them. More than a few in a row is a scheduler bug.
            self._idle_steps += 1
            if self._idle_steps > 3:
                raise RuntimeError(f"the scheduler made no progress: {self.stats_dict()}")
            return
        self._idle_steps = 0

    def _new_seq(self, req: _Request, sample_index: int, tokens: list[int], is_prefix: bool = False,
                 slots: int = 1) -> _Sequence:
        return _Sequence(next(self._seq_ids), req, sample_index, tokens, self.allocator, is_prefix, slots)

    def _slots_used(self) -> int:
        return sum(s.slots for s in self.running)

    def _admit(self) -> None:
        while self.waiting:
            seq = self.waiting[0]
            if self._slots_used() + seq.slots > self.config.max_num_seqs:
                return
            need = pages_for(len(seq.tokens), self.page_size) - len(seq.table)
            if self.running and need > self.allocator.num_free and need > self._num_available_pages():
                return
            self.running.append(self.waiting.popleft())
            if self.prefix_cache is not None and not seq.table.pages and seq.num_computed == 0:
                seq.table.adopt(self.prefix_cache.lookup(seq.tokens))
                seq.num_computed = len(seq.table) * self.page_size
                self.stats.num_cached_prompt_tokens += seq.num_computed

    def _num_available_pages(self) -> int:
        """Free pages plus the cached pages nobody holds (evicted on demand)."""
        evictable = self.prefix_cache.num_evictable if self.prefix_cache is not None else 0
        return self.allocator.num_free + evictable

    def _release(self, seq: _Sequence) -> None:
        """Give up a sequence's pages, keeping its full computed pages in the prefix cache."""
        if self.prefix_cache is not None:
            self.prefix_cache.register(seq.tokens, seq.table.pages, seq.num_computed)
        seq.table.free()

    def _preempt(self, seq: _Sequence) -> None:
        self._release(seq)
        seq.num_computed = 0
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        self.stats.num_preemptions += 1

    def _reserve(self, seq: _Sequence, num_tokens: int) -> bool:
        """Give `seq` pages for `num_tokens` tokens, preempting later-admitted sequences
        when the pool is dry. False when `seq` itself had to be preempted."""
        need = pages_for(num_tokens, self.page_size)
        while True:
            try:
                seq.table.grow_to(need)
                return True
            except OutOfPagesError:
                short = need - len(seq.table) - self.allocator.num_free
                if self.prefix_cache is not None and self.prefix_cache.evict(short) == short:
                    continue
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    return False

    def _rows_bucket(self, n: int) -> int:
        return _bucket(n, self._decode_buckets)

    def _schedule_prefill(self) -> list[tuple[_Sequence, int]]:
        budget = self.config.max_num_batched_tokens
        fitting = [c for c in self._chunk_buckets if self._rows_bucket(1) * c <= budget] or [self._chunk_buckets[0]]
        rows: list[tuple[_Sequence, int]] = []
        chunk = 0
        for seq in [s for s in self.running if s.needs_prefill]:
            if seq not in self.running:  # preempted while reserving for an earlier row
                continue
            left = len(seq.tokens) - seq.num_computed
            if not rows:
                chunk = next((c for c in fitting if c >= left), fitting[-1])
            if rows and (
                len(rows) + 1 > self._decode_buckets[-1] or self._rows_bucket(len(rows) + 1) * chunk > budget
            ):
                break
            n = min(left, chunk)
            if self._reserve(seq, seq.num_computed + n):
                rows.append((seq, n))
        return rows

    def _schedule_decode(self) -> list[tuple[_Sequence, int]]:
        """Every decode-ready running sequence, with the number of steps it runs in this
        call (up to `num_scheduler_steps`, never past its max_tokens) and pages for them."""
        rows = []
        for seq in list(self.running):
            if seq not in self.running or seq.needs_prefill:
                continue
            n = min(self._decode_steps, seq.request.max_tokens - seq.num_generated)
            if self._reserve(seq, len(seq.tokens) - 1 + n):
                rows.append((seq, n))
        return [(s, n) for s, n in rows if s in self.running]

    def _batch(self, rows: list[tuple[_Sequence, int]], chunk: int, decode: bool) -> dict[str, np.ndarray]:
        """Host arrays for one call. Prefill: row i computes its next n tokens (a chunk).
        Decode: row i feeds its last token and runs n steps."""
        b = self._rows_bucket(len(rows))
        w = _bucket(max(len(s.table) for s, _ in rows), self._width_buckets)
        tokens = np.zeros((b, chunk), np.int32)
        positions = np.zeros((b, chunk), np.int32)
        valid = np.zeros((b, chunk), bool)
        page_table = np.zeros((b, w), np.int32)
        kv_lens = np.zeros(b, np.int32)
        last_index = np.zeros(b, np.int32)
        n_steps = np.zeros(b, np.int32)
        temperature = np.zeros(b, np.float32)
        top_p = np.ones(b, np.float32)
        min_p = np.zeros(b, np.float32)
        top_k = np.zeros(b, np.int32)
        seeds = np.zeros(b, np.uint32)
        streams = np.zeros((b, 2), np.uint32)
        sample_index = np.zeros(b, np.int32)
        for i, (seq, n) in enumerate(rows):
            start = seq.num_computed
            assert seq.table.writable(start // self.page_size), "a step would write a shared page"
            page_table[i, : len(seq.table)] = seq.table.pages
            if decode:
                tokens[i, 0] = seq.tokens[-1]
                positions[i, 0] = start
                valid[i, 0] = True
                n_steps[i] = n
            else:
                tokens[i, :n] = seq.tokens[start:start + n]
                positions[i, :n] = np.arange(start, start + n)
                positions[i, n:] = start + n - 1
                valid[i, :n] = True
                kv_lens[i] = start + n
                last_index[i] = n - 1
            p = seq.request.params
            temperature[i] = p.temperature
            top_p[i] = p.top_p
            min_p[i] = p.min_p
            top_k[i] = p.top_k
            seeds[i] = seq.request.seed % 2**32
            streams[i] = divmod(p.stream, 2**32)
            sample_index[i] = max(seq.sample_index, 0)
        batch = dict(
            tokens=tokens, positions=positions, page_table=page_table, temperature=temperature, top_p=top_p,
            min_p=min_p, top_k=top_k, seeds=seeds, streams=streams, sample_index=sample_index,
        )
        if decode:
            batch["n_steps"] = n_steps
        else:
            batch.update(valid=valid, kv_lens=kv_lens, last_index=last_index)
        return batch

    def _run(self, rows: list[tuple[_Sequence, int]], prefill: bool) -> None:
        chunk = _bucket(max(n for _, n in rows), self._chunk_buckets) if prefill else 1
        batch = self._batch(rows, chunk, decode=not prefill)
        fn = self._prefill_fn if prefill else self._decode_fn
        self._trace_kind = f"[{batch['tokens'].shape[0]}x{chunk}, W={batch['page_table'].shape[1]}]"
        self.k_cache, self.v_cache, tokens, logprobs = fn(self.state, self.k_cache, self.v_cache, batch)
        tokens, logprobs = jax.device_get((tokens, logprobs))
        self.stats.peak_pages_used = max(self.stats.peak_pages_used, self.allocator.peak_used)
        if prefill:
            self.stats.num_prefill_steps += 1
            self.stats.num_prefill_tokens += sum(n for _, n in rows)
            for i, (seq, n) in enumerate(rows):
                seq.num_computed += n
                if seq.num_computed < len(seq.tokens):
                    continue  # mid-prompt chunk: nothing to sample yet
                if seq.is_prefix:
                    self._fork(seq)
                else:
                    self._append(seq, int(tokens[i]), float(logprobs[i]))
        else:
            self.stats.num_decode_calls += 1
            self.stats.num_decode_steps += max(n for _, n in rows)
            for i, (seq, n) in enumerate(rows):
                for j in range(n):
                    seq.num_computed += 1
                    if self._append(seq, int(tokens[i, j]), float(logprobs[i, j])):
                        break

    def _fork(self, prefix: _Sequence) -> None:
        req = prefix.request
        children = []
        for i in range(req.params.n):
            child = self._new_seq(req, i, list(req.prompt))
            child.table.share_from(prefix.table, len(prefix.table))
            child.num_computed = prefix.num_computed
            children.append(child)
        if self.prefix_cache is not None:  # the prompt's full pages, for later requests
            self.prefix_cache.register(prefix.tokens, prefix.table.pages, prefix.num_computed)
        prefix.table.free()
        at = self.running.index(prefix)
        self.running[at:at + 1] = children

    def _append(self, seq: _Sequence, token: int, logprob: float) -> bool:
        """Add a sampled token; True when it finished the sequence."""
        seq.tokens.append(token)
        seq.logprobs.append(logprob)
        self.stats.num_generated_tokens += 1
        req = seq.request
        if token in req.stop_ids:
            self._finish(seq, "stop")
        elif seq.num_generated >= req.max_tokens:
            self._finish(seq, "length")
        else:
            return False
        return True

    def _finish(self, seq: _Sequence, reason: str) -> None:
        self._release(seq)
        self.running.remove(seq)
        req = seq.request
        req.completions[seq.sample_index] = Completion(
            request_index=req.request_id,
            sample_index=seq.sample_index,
            prompt_token_ids=req.prompt,
            token_ids=seq.tokens[seq.prompt_len:],
            logprobs=seq.logprobs,
            finish_reason=reason,  # type: ignore[arg-type]
        )
        req.remaining -= 1
        if req.remaining == 0:
            self.stats.num_finished_requests += 1
            req.on_done(list(req.completions))  # type: ignore[arg-type]

    # ---- introspection -----------------------------------------------------------------

    @property
    def num_compiled_programs(self) -> int:
        """Executables in the step functions' jit caches (one per shape / sharding)."""
        return self._decode_fn._cache_size() + self._prefill_fn._cache_size()

    def stats_dict(self) -> dict:
        self.stats.num_compiled_programs = self.num_compiled_programs
        self.stats.num_cached_pages = len(self.prefix_cache) if self.prefix_cache is not None else 0
        d = self.stats.as_dict()
        # pages_used: held by sequences (cached pages nobody holds are free on demand)
        evictable = self.prefix_cache.num_evictable if self.prefix_cache is not None else 0
        d.update(pages_used=self.allocator.num_used - evictable, num_waiting=len(self.waiting),
                 num_running=len(self.running))
        return d

