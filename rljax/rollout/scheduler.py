"""The rollout scheduler: which sequences run in the next call, and in which KV pages.

Pure host code (no JAX): admission, page reservation, preemption, prefix sharing and the
prefix cache. Its contract, one call at a time:

    request = scheduler.add_request(request_id, prompt, params)   # a handle
    plan = scheduler.schedule()          # a StepPlan, or None when nothing can run
    # ... a device step runs the plan: per row, tokens / log_probs [rows, steps] ...
    finished = scheduler.apply(plan, tokens, log_probs)   # requests whose n samples are done
    # (with `record_routing`: apply(plan, tokens, log_probs, experts), the programs' routing)

Scheduling (continuous batching):
- Sequences wait in a FIFO queue and are admitted while the running set has fewer than
  `max_num_seqs` slots taken and the free pages hold the sequence's known tokens.
- When some running sequence has more than one token to compute (a new prompt, an
  agent's next turn, or a preempted sequence being recomputed), the call computes chunks
  of those sequences, sized so that the padded `[rows bucket, chunk bucket]` fits the
  token budget `max_num_batched_tokens`. With `mixed_steps` every decode-ready running
  sequence rides along in the same call (a mixed step: one decode token each, taken from
  the budget first, the chunks filling the rest, after which the decode rows run the
  rest of their `num_scheduler_steps` steps), so no decode waits on a prefill; without it
  the call is a prefill step and the decodes wait (`num_stalled_calls`).
- Otherwise it is a decode call over every running sequence that runs up to
  `num_scheduler_steps` decode steps on device (each step's token feeds the next);
  `apply` then appends the tokens and stops a sequence at its first stop token or its
  max_tokens (tokens computed past that point are dropped).
- A sequence that needs a page when none is free first evicts unreferenced prefix-cache
  pages, then preempts the most recently admitted running sequence (itself, if it is the
  most recent): its pages are released and it goes back to the front of the queue with
  its tokens so far; on re-admission it recomputes them (prompt + generated) as a
  prefill and continues. Its random keys depend on (seed, stream, sample index,
  position) only, so it produces the same tokens it would have produced without the
  interruption.
- A finished sequence releases its pages at once; its slot goes to the next waiter
  (admission happens before every call, so within `num_scheduler_steps` tokens).

Prefix sharing: the n samples of a request share the prompt's full pages. A "prefix"
sequence (no sampling) computes the prompt's first `floor((len - 1) / page_size)` pages
and is then forked into n samples that hold references to those pages; each sample
computes the remaining 1..page_size prompt tokens into a page of its own (so the last
partial page is per-sample and nothing shared is ever written: copy-on-write realised
by recomputing at most one page of tokens, which also gives each sample the prompt's
last logits). Memory for a group grows with n responses, not n prompts.

Policy versions and partial requests: every sampled token records `version` (the engine
sets it with new parameters). `recompute_running` preempts every running sequence, so
each recomputes prompt + tokens so far (under new parameters) and continues with the same
keys. `unfinished` reports the requests not yet delivered as `PartialRequest`s (every
sample's tokens, log-probs and versions so far), and `add_request(..., resume=...)`
continues one: finished samples are kept as they are, unfinished ones are queued as
prompt + tokens so far, like a preempted sequence, so they draw the same keys; a
sample's `max_tokens` counts the tokens it already has.

Routing record (`SamplerConfig.record_routing`, MoE models): each sequence keeps the
experts of every computed position (`_Routing`), written from each call's `experts` at
the positions the call computed, so a preempted sequence's recompute overwrites its
earlier record as it overwrites its keys / values; forked samples copy the shared
prefix's record; the prefix cache is not read (its pages' routing was not recorded).

Everything here is local to one scheduler (its own allocator over its own pool's page
ids), so a data-parallel rollout runs one scheduler per replica.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
from dataclasses import asdict, dataclass

import numpy as np

from rljax.rollout.buckets import Buckets
from rljax.rollout.config import SamplerConfig
from rljax.rollout.pages import OutOfPagesError, PageAllocator, PageTable, pages_for
from rljax.rollout.params import Completion, PartialRequest, PartialSample, SamplingParams
from rljax.rollout.prefix_cache import PrefixCache


class StepKind(enum.Enum):
    PREFILL = "prefill"  # rows compute a chunk of known tokens; a finished prompt samples one
    DECODE = "decode"  # rows feed their last token and sample up to num_scheduler_steps
    MIXED = "mixed"  # decode rows and prefill chunks in one step, then the decode rows' further steps


@dataclass(frozen=True)
class Row:
    """One sequence's part of a call."""

    tokens: tuple[int, ...]  # prefill: the chunk to compute; decode: the last token (one)
    start: int  # absolute position of tokens[0] (the tokens before it are in the cache)
    num_steps: int  # decode: steps this row runs (<= num_scheduler_steps); prefill: 1
    pages: tuple[int, ...]  # the page table; pages from start // page_size on are its own
    params: SamplingParams
    seed: int
    sample_index: int  # >= 0 (a request's shared prefix samples as 0; its token is unused)


@dataclass(frozen=True)
class StepPlan:
    """The scheduler's decision for one call; rows in the order results come back."""

    kind: StepKind
    rows: tuple[Row, ...]
    num_decode_rows: int = 0  # the first rows decode (all of a decode call's, none of a prefill's)
    num_waiting_decodes: int = 0  # decode-ready running sequences this call leaves without a token


@dataclass
class SchedulerStats:
    """Counters of one scheduler since it was built (`peak_pages_used`: since the last
    `reset_peak_memory`, including pages the prefix cache keeps)."""

    num_prefill_steps: int = 0
    num_decode_calls: int = 0
    num_mixed_steps: int = 0  # calls carrying decode rows and prefill chunks together
    num_stalled_calls: int = 0  # calls that left decode-ready sequences waiting (a prefill-only step)
    num_decode_steps: int = 0
    num_prefill_tokens: int = 0
    num_generated_tokens: int = 0
    num_preemptions: int = 0
    num_recomputed_sequences: int = 0  # running sequences sent back to recompute (`recompute_running`)
    num_finished_requests: int = 0
    num_cached_prompt_tokens: int = 0  # tokens a new sequence found in the prefix cache
    peak_pages_used: int = 0


@dataclass(eq=False)
class Request:
    """A queued prompt and its samples' results so far; the handle `abort_request` takes."""

    request_id: int | str
    prompt: list[int]
    params: SamplingParams
    seed: int
    max_tokens: int
    stop_ids: frozenset[int]
    completions: list[Completion | None]
    remaining: int
    resume: PartialRequest | None = None  # what the request's samples start from


class _Routing:
    """The recorded experts of one sequence by position: `[capacity, L, k]` int32, -1
    where nothing was recorded; grows by doubling."""

    def __init__(self):
        self.ids: np.ndarray | None = None

    def write(self, start: int, ids: np.ndarray) -> None:
        """Record `ids` `[n, L, k]` at positions start .. start + n - 1."""
        end = start + len(ids)
        if self.ids is None:
            self.ids = np.full((max(end, 16), *ids.shape[1:]), -1, np.int32)
        elif end > len(self.ids):
            grown = np.full((max(end, 2 * len(self.ids)), *self.ids.shape[1:]), -1, np.int32)
            grown[: len(self.ids)] = self.ids
            self.ids = grown
        self.ids[start:end] = ids

    def copy(self) -> _Routing:
        other = _Routing()
        other.ids = None if self.ids is None else self.ids.copy()
        return other

    def first(self, n: int) -> np.ndarray | None:
        """Positions 0 .. n - 1, `[n, L, k]` (-1 where unrecorded); None if nothing was."""
        if self.ids is None:
            return None
        out = np.full((n, *self.ids.shape[1:]), -1, np.int32)
        m = min(n, len(self.ids))
        out[:m] = self.ids[:m]
        return out


class _Sequence:
    """One sample being generated (or, with `is_prefix`, a request's shared prompt prefix)."""

    def __init__(self, seq_id: int, request: Request, sample_index: int, tokens: list[int],
                 allocator: PageAllocator, is_prefix: bool = False, slots: int = 1):
        self.seq_id = seq_id
        self.request = request
        self.sample_index = sample_index
        self.tokens = tokens
        self.prompt_len = len(request.prompt)
        self.num_computed = 0
        self.table = PageTable(allocator)
        self.log_probs: list[float] = []
        self.versions: list[int] = []  # the policy version of each generated token
        self.is_prefix = is_prefix
        self.slots = slots
        self.routing = _Routing()  # with record_routing: experts per computed position

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def needs_prefill(self) -> bool:
        """More than the one token a decode step computes (a prefix: any token left)."""
        left = len(self.tokens) - self.num_computed
        return left > 0 if self.is_prefix else left > 1


class Scheduler:
    """Continuous batching over one pool of `num_pages` KV pages (see the module docstring)."""

    def __init__(self, config: SamplerConfig, num_pages: int, eos_ids: frozenset[int], vocab_size: int):
        self.config = config
        self.page_size = config.kv_cache.page_size
        self.buckets = Buckets.from_config(config)
        self.allocator = PageAllocator(num_pages)
        self.prefix_cache = PrefixCache(self.allocator, self.page_size) if config.enable_prefix_caching else None
        self.eos_ids = eos_ids
        self.vocab_size = vocab_size
        self.share_prefix = config.share_prefix  # may be switched between requests
        self.record_routing = config.record_routing
        self.stats = SchedulerStats()
        self.waiting: collections.deque[_Sequence] = collections.deque()
        self.running: list[_Sequence] = []
        self._rng = np.random.default_rng(config.seed)  # seeds for requests that bring none
        self._seq_ids = itertools.count()
        self._idle_steps = 0
        self._in_flight: tuple[StepPlan, list[tuple[_Sequence, int]]] | None = None
        self._finished: list[Request] = []  # complete, not yet returned by `apply` / `pop_finished`
        self._requests: dict[int, Request] = {}  # id -> every request not yet returned, in arrival order
        self.version = 0  # recorded with every sampled token

    # ---- requests ----------------------------------------------------------------------

    def add_request(self, request_id: int | str, prompt: list[int], params: SamplingParams,
                    resume: PartialRequest | None = None) -> Request:
        """Queue a prompt's n samples; `apply` returns the request once all of them
        finish (completions ordered by sample index). Raises ValueError for a prompt the
        scheduler cannot hold.

        `resume`: continue the request from a `PartialRequest` of the same prompt and
        params (`params.seed` None takes the resume's seed). Its finished samples are
        kept; an unfinished one continues from prompt + its tokens, with the same keys
        and `max_tokens` minus the tokens it has (one that already ends in a stop token
        or has its `max_tokens` finishes at once). A request whose samples are all
        finished is returned by the next `pop_finished`."""
        prompt = [int(t) for t in prompt]
        if resume is not None:
            params = self._check_resume(prompt, params, resume)
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= self.config.max_model_len:
            raise ValueError(
                f"prompt of {len(prompt)} tokens leaves no room to generate within max_model_len="
                f"{self.config.max_model_len}"
            )
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        seed = params.seed if params.seed is not None else int(self._rng.integers(0, 2**31 - 1))
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        req = Request(
            request_id=request_id,
            prompt=prompt,
            params=params,
            seed=seed,
            max_tokens=min(params.max_tokens, self.config.max_model_len - len(prompt)),
            stop_ids=frozenset(stop),
            completions=[None] * params.n,
            remaining=params.n,
            resume=resume,
        )
        self._requests[id(req)] = req
        if resume is not None:
            for sample in resume.samples:
                reason = sample.finish_reason
                if reason is None and sample.token_ids:
                    if sample.token_ids[-1] in req.stop_ids:
                        reason = "stop"
                    elif len(sample.token_ids) >= req.max_tokens:
                        reason = "length"
                if reason is not None:
                    self._complete(req, sample.sample_index, list(sample.token_ids), list(sample.log_probs),
                                   list(sample.policy_versions), reason, None)
        pending = [i for i in range(params.n) if req.completions[i] is None]
        shared_len = (len(prompt) - 1) // self.page_size * self.page_size
        if len(pending) > 1 and self.share_prefix and shared_len > 0 and len(pending) <= self.config.max_num_seqs:
            self.waiting.append(self._new_seq(req, -1, prompt[:shared_len], is_prefix=True, slots=len(pending)))
        else:
            for i in pending:
                self.waiting.append(self._sample_seq(req, i))
        return req

    def _check_resume(self, prompt: list[int], params: SamplingParams, resume: PartialRequest) -> SamplingParams:
        """The params a resumed request runs with (the resume's); ValueError when the
        resume is not this request's."""
        if [int(t) for t in resume.prompt_token_ids] != prompt:
            raise ValueError(f"resume of request {resume.request_id!r}: its prompt is not the request's")
        if params.seed is None and resume.sampling_params.seed is not None:
            params = dataclasses.replace(params, seed=resume.sampling_params.seed)
        if params != resume.sampling_params:
            raise ValueError(f"resume of request {resume.request_id!r}: sampling params {resume.sampling_params} "
                             f"differ from the request's {params}")
        for sample in resume.samples:
            if sample.token_ids and (min(sample.token_ids) < 0 or max(sample.token_ids) >= self.vocab_size):
                raise ValueError(f"resume of request {resume.request_id!r}: sample {sample.sample_index} has token "
                                 f"ids outside [0, {self.vocab_size})")
        return params

    def _sample_seq(self, req: Request, sample_index: int) -> _Sequence:
        """Sample `sample_index` of `req` from its start: the prompt, plus its tokens so
        far when the request is resumed."""
        seq = self._new_seq(req, sample_index, list(req.prompt))
        if req.resume is not None:
            sample = req.resume.samples[sample_index]
            seq.tokens.extend(int(t) for t in sample.token_ids)
            seq.log_probs = [float(x) for x in sample.log_probs]
            seq.versions = [int(v) for v in sample.policy_versions]
        return seq

    def abort_request(self, request: Request) -> None:
        """Drop a request's unfinished sequences and free their pages."""
        for queue in (self.running, self.waiting):
            for seq in [s for s in queue if s.request is request]:
                if seq.table.pages:
                    seq.table.free()
                queue.remove(seq)
        self._requests.pop(id(request), None)
        if request in self._finished:
            self._finished.remove(request)

    def abort_all(self) -> list[Request]:
        """Drop every sequence (and the plan in flight) and free its pages; returns the
        unfinished requests."""
        for seq in list(self.running) + list(self.waiting):
            if seq.table.pages:
                seq.table.free()
        requests = list(self._requests.values())
        self.running.clear()
        self.waiting.clear()
        self._finished.clear()
        self._requests.clear()
        self._in_flight = None
        return requests

    def has_work(self) -> bool:
        """Sequences to run, or finished requests not yet returned."""
        return bool(self.waiting or self.running or self._finished)

    def pop_finished(self) -> list[Request]:
        """The requests that finished outside a call (a resume whose samples were all
        done), to deliver; `apply` returns the others."""
        finished, self._finished = self._finished, []
        for req in finished:
            self._requests.pop(id(req), None)
        return finished

    # ---- policy versions and partial requests ----------------------------------------------

    def recompute_running(self) -> None:
        """Send every running sequence back to the front of the queue (in running order)
        with its pages freed, so its next step recomputes prompt + tokens so far (new
        parameters' keys / values) and then continues. Pages are not offered to the
        prefix cache: their keys / values belong to the parameters being replaced."""
        if self._in_flight is not None:
            raise RuntimeError("recompute_running() while a plan is in flight")
        for seq in reversed(self.running):
            seq.table.free()
            seq.num_computed = 0
            self.waiting.appendleft(seq)
            self.stats.num_recomputed_sequences += 1
        self.running.clear()

    def unfinished(self) -> list[PartialRequest]:
        """Every request not yet returned, in arrival order, with each sample's tokens,
        log-probs and versions so far; changes nothing. The params carry the seed the
        request runs with."""
        return [partial for _, partial in self.unfinished_requests()]

    def unfinished_requests(self) -> list[tuple[Request, PartialRequest]]:
        """`unfinished`, each with its request handle."""
        seqs = {(id(s.request), s.sample_index): s for s in list(self.running) + list(self.waiting)}
        out = []
        for req in self._requests.values():
            samples = []
            for i in range(req.params.n):
                done, seq = req.completions[i], seqs.get((id(req), i))
                if done is not None:
                    sample = PartialSample(i, list(done.token_ids), list(done.log_probs),
                                           list(done.policy_versions or []), done.finish_reason)
                elif seq is not None:
                    sample = PartialSample(i, seq.tokens[seq.prompt_len:], list(seq.log_probs), list(seq.versions))
                elif req.resume is not None:  # not forked from its shared prefix yet
                    r = req.resume.samples[i]
                    sample = PartialSample(i, list(r.token_ids), list(r.log_probs), list(r.policy_versions))
                else:
                    sample = PartialSample(i)
                samples.append(sample)
            out.append((req, PartialRequest(req.request_id, list(req.prompt),
                                            dataclasses.replace(req.params, seed=req.seed), samples)))
        return out

    # ---- the prefix cache and memory -----------------------------------------------------

    def set_prefix_caching(self, enabled: bool) -> None:
        """Switch automatic prefix caching on or off between requests (off drops the cache)."""
        if not enabled and self.prefix_cache is not None:
            self.prefix_cache.clear()
            self.prefix_cache = None
        elif enabled and self.prefix_cache is None:
            self.prefix_cache = PrefixCache(self.allocator, self.page_size)

    def clear_prefix_cache(self) -> None:
        """Forget the cached pages (their keys / values are stale or gone)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    @property
    def num_cached_pages(self) -> int:
        return len(self.prefix_cache) if self.prefix_cache is not None else 0

    @property
    def pages_used(self) -> int:
        """Pages held by sequences (cached pages nobody holds are free on demand)."""
        return self.allocator.num_used - self._num_evictable()

    def reset_peak_memory(self) -> None:
        self.allocator.reset_peak()
        self.stats.peak_pages_used = self.allocator.num_used

    # ---- deciding a call -----------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """Admit waiting sequences, then plan one prefill step or one decode call. None
        when nothing runs: no work, or every candidate preempted itself (the next call
        re-admits them; more than a few such calls in a row is a scheduler bug)."""
        if self._in_flight is not None:
            raise RuntimeError("schedule() called before the previous plan was applied")
        self._admit()
        decode, prefill = self._plan_call()
        if not decode and not prefill:
            if self.waiting or self.running:
                self._idle_steps += 1
                if self._idle_steps > 3:
                    raise RuntimeError(f"the scheduler made no progress: {asdict(self.stats)}, "
                                       f"{len(self.waiting)} waiting, {len(self.running)} running")
            else:
                self._idle_steps = 0
            return None
        self._idle_steps = 0
        # split steps never pair decode rows with chunks; with mixed steps every prefill call is mixed
        kind = (StepKind.MIXED if self.config.mixed_steps else StepKind.PREFILL) if prefill else StepKind.DECODE
        waiting = 0 if kind is not StepKind.PREFILL else sum(not s.needs_prefill for s in self.running)
        self.stats.num_stalled_calls += waiting > 0
        plan = StepPlan(kind, tuple([self._row(seq, n, True) for seq, n in decode] +
                                    [self._row(seq, n, False) for seq, n in prefill]), len(decode), waiting)
        self._in_flight = (plan, (decode, prefill))
        return plan

    def _plan_call(self) -> tuple[list[tuple[_Sequence, int]], list[tuple[_Sequence, int]]]:
        """(decode rows as (sequence, steps), prefill rows as (sequence, chunk tokens)) of
        the next call."""
        budget = self.config.max_num_batched_tokens
        steps = self.config.num_scheduler_steps
        if self.config.mixed_steps and any(s.needs_prefill for s in self.running):
            decode = self._schedule_decode(steps)
            # the decodes take the budget first (padded rows); the chunks fill the rest
            left = max(budget - (self.buckets.pad_rows(len(decode)) if decode else 0), self.buckets.chunk[0])
            prefill = self._schedule_prefill(left)
            return [(s, n) for s, n in decode if s in self.running], prefill
        prefill = self._schedule_prefill(budget)
        if prefill:
            return [], prefill
        return self._schedule_decode(steps), []

    def _row(self, seq: _Sequence, n: int, decode: bool) -> Row:
        start = seq.num_computed
        assert seq.table.writable(start // self.page_size), "a step would write a shared page"
        return Row(
            tokens=(seq.tokens[-1],) if decode else tuple(seq.tokens[start:start + n]),
            start=start,
            num_steps=n if decode else 1,
            pages=tuple(seq.table.pages),
            params=seq.request.params,
            seed=seq.request.seed,
            sample_index=max(seq.sample_index, 0),
        )

    def _new_seq(self, req: Request, sample_index: int, tokens: list[int], is_prefix: bool = False,
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
            # recording routing: cached pages have none, so they are recomputed (module docstring)
            if (self.prefix_cache is not None and not self.record_routing and not seq.table.pages
                    and seq.num_computed == 0):
                seq.table.adopt(self.prefix_cache.lookup(seq.tokens))
                seq.num_computed = len(seq.table) * self.page_size
                self.stats.num_cached_prompt_tokens += seq.num_computed

    def _num_evictable(self) -> int:
        return self.prefix_cache.num_evictable if self.prefix_cache is not None else 0

    def _num_available_pages(self) -> int:
        """Free pages plus the cached pages nobody holds (evicted on demand)."""
        return self.allocator.num_free + self._num_evictable()

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
        """Give `seq` pages for `num_tokens` tokens, evicting unreferenced cached pages,
        then preempting later-admitted sequences, when the pool is dry. False when `seq`
        itself had to be preempted."""
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

    def _schedule_prefill(self, budget: int) -> list[tuple[_Sequence, int]]:
        """Chunks of the sequences with tokens to compute, in admission order, while the
        padded `[rows bucket, chunk]` fits `budget` tokens; (sequence, tokens) each."""
        pad_rows = self.buckets.pad_rows
        fitting = [c for c in self.buckets.chunk if pad_rows(1) * c <= budget] or [self.buckets.chunk[0]]
        rows: list[tuple[_Sequence, int]] = []
        chunk = 0
        for seq in [s for s in self.running if s.needs_prefill]:
            if seq not in self.running:  # preempted while reserving for an earlier row
                continue
            left = len(seq.tokens) - seq.num_computed
            if not rows:
                chunk = next((c for c in fitting if c >= left), fitting[-1])
            if rows and (len(rows) + 1 > self.buckets.rows[-1] or pad_rows(len(rows) + 1) * chunk > budget):
                break
            n = min(left, chunk)
            if self._reserve(seq, seq.num_computed + n):
                rows.append((seq, n))
        return [(s, n) for s, n in rows if s in self.running]

    def _schedule_decode(self, max_steps: int) -> list[tuple[_Sequence, int]]:
        """Every decode-ready running sequence, with the number of steps it runs in this
        call (up to `max_steps`, never past its max_tokens) and pages for them."""
        rows = []
        for seq in list(self.running):
            if seq not in self.running or seq.needs_prefill:
                continue
            n = min(max_steps, seq.request.max_tokens - seq.num_generated)
            if self._reserve(seq, len(seq.tokens) - 1 + n):
                rows.append((seq, n))
        return [(s, n) for s, n in rows if s in self.running]

    # ---- taking a call's results ---------------------------------------------------------

    def apply(self, plan: StepPlan, tokens: np.ndarray, log_probs: np.ndarray,
              experts: np.ndarray | None = None) -> list[Request]:
        """Take the sampled `tokens` / `log_probs` `[rows, steps]` of the plan last
        returned by `schedule` (a prefill row: column 0; a decode row: its first
        `num_steps` columns) and, when recording routing, the computed tokens' `experts`
        (`[rows, T or steps, L, k]`; a prefill row: its first n columns; a decode row: the
        token fed at each step). Returns the requests whose last sample finished in this
        call."""
        if self._in_flight is None or self._in_flight[0] is not plan:
            raise RuntimeError("apply() of a plan that is not the one in flight")
        decode, prefill = self._in_flight[1]
        self._in_flight = None
        self.stats.peak_pages_used = max(self.stats.peak_pages_used, self.allocator.peak_used)
        self.stats.num_prefill_steps += plan.kind is StepKind.PREFILL
        self.stats.num_decode_calls += plan.kind is StepKind.DECODE
        self.stats.num_mixed_steps += plan.kind is StepKind.MIXED
        self.stats.num_decode_steps += max((n for _, n in decode), default=0)
        self.stats.num_prefill_tokens += sum(n for _, n in prefill)
        for i, (seq, n) in enumerate(decode):
            self._apply_decode(seq, n, tokens[i], log_probs[i], None if experts is None else experts[i])
        for i, (seq, n) in enumerate(prefill, start=len(decode)):
            if experts is not None:
                seq.routing.write(seq.num_computed, experts[i, :n])
            seq.num_computed += n
            if seq.num_computed < len(seq.tokens):
                continue  # mid-prompt chunk: nothing to sample yet
            if seq.is_prefix:
                self._fork(seq)
            else:
                self._append(seq, int(tokens[i, 0]), float(log_probs[i, 0]))
        return self.pop_finished()

    def _apply_decode(self, seq: _Sequence, steps: int, tokens: np.ndarray, log_probs: np.ndarray,
                      experts: np.ndarray | None) -> None:
        """Take a row's decode steps: step j fed the sequence's last token (its routing:
        `experts[j]`) and sampled `tokens[j]`; stops at the step that finishes it."""
        for j in range(steps):
            if experts is not None:  # the token fed at step j sits at num_computed
                seq.routing.write(seq.num_computed, experts[j:j + 1])
            seq.num_computed += 1
            if self._append(seq, int(tokens[j]), float(log_probs[j])):
                break

    def _fork(self, prefix: _Sequence) -> None:
        req = prefix.request
        children = []
        for i in range(req.params.n):
            if req.completions[i] is not None:  # finished in the request it resumes
                continue
            child = self._sample_seq(req, i)
            child.table.share_from(prefix.table, len(prefix.table))
            child.num_computed = prefix.num_computed
            child.routing = prefix.routing.copy()
            children.append(child)
        if self.prefix_cache is not None:  # the prompt's full pages, for later requests
            self.prefix_cache.register(prefix.tokens, prefix.table.pages, prefix.num_computed)
        prefix.table.free()
        at = self.running.index(prefix)
        self.running[at:at + 1] = children

    def _append(self, seq: _Sequence, token: int, log_prob: float) -> bool:
        """Add a sampled token; True when it finished the sequence."""
        seq.tokens.append(token)
        seq.log_probs.append(log_prob)
        seq.versions.append(self.version)
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
        self._complete(seq.request, seq.sample_index, seq.tokens[seq.prompt_len:], seq.log_probs, seq.versions,
                       reason, seq.routing.first(len(seq.tokens)))

    def _complete(self, req: Request, sample_index: int, token_ids: list[int], log_probs: list[float],
                  versions: list[int], reason: str, expert_ids: np.ndarray | None) -> None:
        req.completions[sample_index] = Completion(
            request_index=req.request_id,
            sample_index=sample_index,
            prompt_token_ids=req.prompt,
            token_ids=token_ids,
            log_probs=log_probs,
            finish_reason=reason,  # type: ignore[arg-type]
            expert_ids=expert_ids,
            policy_versions=versions,
        )
        req.remaining -= 1
        if req.remaining == 0:
            self.stats.num_finished_requests += 1
            self._finished.append(req)
